"""``oversmooth audit`` of decoders with cross-attention (the corpus's T5 and Marian decoder stacks):
audited whole without ``--partial``, over their self-attention blocks alone, every skipped
cross-attention named with its reason in the summary, ``audit.json`` and ``report.md``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from oversmooth.cli import main
from tests.importers.family_corpus import FIXTURES, fixture_bytes

#: (fixture, the module name the exporter writes into the cross-attention Softmax's name).
DECODERS = [
    ("t5_decoder/legacy_eager.onnx.xz", "EncDecAttention"),
    ("marian_decoder/legacy_eager.onnx.xz", "encoder_attn"),
    ("whisper_decoder/dynamo_eager.onnx.xz", None),  # the dynamo exporter names no modules
]
FEEDS = ("input_ids", "attention_mask", "encoder_hidden_states", "encoder_attention_mask")


def _audit(tmp_path: Path, fixture: str, capsys: pytest.CaptureFixture[str], *extra: str):
    """(exit status, stdout, stderr, report folder) of auditing ``fixture`` on its truth's feeds."""
    model = tmp_path / "decoder.onnx"
    model.write_bytes(fixture_bytes(fixture))
    with np.load(FIXTURES / Path(fixture).parent / "truth.npz") as truth:
        found = [name for name in FEEDS if f"feed_{name}" in truth.files]  # Whisper: no mask
        np.savez(tmp_path / "feeds.npz", **{name: truth[f"feed_{name}"] for name in found})
    out = tmp_path / "report"
    argv = [str(model), "--inputs", str(tmp_path / "feeds.npz"), "--out", str(out), *extra]
    status = main(["audit", *argv, "--provider", "cpu", "--no-progress"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err, out


@pytest.mark.parametrize(("fixture", "cross_module"), DECODERS)
def test_a_decoder_is_audited_over_its_self_attention_naming_each_cross_attention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fixture: str, cross_module: str | None
) -> None:
    status, summary, err, out = _audit(tmp_path, fixture, capsys)
    assert status == 0, err
    doc = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    assert [block["causal"] for block in doc["blocks"]] == [True, True]
    skipped = doc["skipped"]
    assert [item["code"] for item in skipped] == ["cross_attention"] * 2
    read = {block["sources"]["softmax"] for block in doc["blocks"]}
    assert len(read) == 2
    assert not read & {item["softmax"] for item in skipped}
    if cross_module is not None:
        attention = [block["tensors"]["attention"] for block in doc["blocks"]]
        assert all("Softmax" in name and cross_module not in name for name in attention)
        assert all(cross_module in item["softmax"] for item in skipped)
    assert all("'encoder_hidden_states'" in item["reason"] for item in skipped)
    report = (out / "report.md").read_text(encoding="utf-8")
    for item in skipped:
        assert item["softmax"] in summary.splitlines()[0]
        assert item["softmax"] in report
        assert item["reason"] in report
    assert not any(note.startswith("PARTIAL") for note in doc["notes"])
    assert any("'encoder_hidden_states'" in note and ".npz" in note for note in doc["notes"])
    with (out / "layers.csv").open(encoding="utf-8", newline="") as handle:
        assert {row["layer"] for row in csv.DictReader(handle)} == {"0", "1", "2"}


def test_random_inputs_draw_the_encoder_states_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "decoder.onnx"
    model.write_bytes(fixture_bytes(DECODERS[0][0]))
    out = tmp_path / "report"
    argv = [str(model), "--random", "2", "--vocab-size", "128", "--out", str(out), "--no-progress"]
    assert main(["audit", *argv, "--provider", "cpu"]) == 0, capsys.readouterr().err
    notes = json.loads((out / "audit.json").read_text(encoding="utf-8"))["notes"]
    assert any("'encoder_hidden_states'" in note and "not real data" in note for note in notes)


def test_a_softmax_that_is_not_attention_is_named_in_the_audit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pooled encoder's attention-pooling Softmax (scores x w + b) is neither a block nor a
    declined block, and the audit says so in one note."""
    fixture = "torch_encoder_pooled/legacy_eager.onnx.xz"  # sizes baked in: the truth's feeds
    model = tmp_path / "pooled.onnx"
    model.write_bytes(fixture_bytes(fixture))
    with np.load(FIXTURES / Path(fixture).parent / "truth.npz") as truth:
        feeds = {name: truth[f"feed_{name}"] for name in ("input_ids", "attention_mask")}
    np.savez(tmp_path / "feeds.npz", **feeds)
    out = tmp_path / "report"
    argv = [str(model), "--inputs", str(tmp_path / "feeds.npz"), "--out", str(out)]
    assert main(["audit", *argv, "--provider", "cpu", "--no-progress"]) == 0, (
        capsys.readouterr().err
    )
    doc = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    assert len(doc["blocks"]) == 2
    assert doc["skipped"] == []
    (note,) = [note for note in doc["notes"] if "not token attention" in note]
    assert note.startswith("1 Softmax node(s) are not token attention")
    assert "not token attention" in (out / "report.md").read_text(encoding="utf-8")
