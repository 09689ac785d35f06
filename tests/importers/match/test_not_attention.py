"""A Softmax that is not token attention counts neither as a block nor as a missing one.

A builder encoder (``bert_legacy``, two blocks) with one more Softmax after its last block
(:mod:`tests.importers.softmax_heads`): an attention pooling summed away, class probabilities
returned as a graph output, a gate on the stream, and the class probabilities beside the
attention probabilities returned as outputs (``output_attentions=True``). Each model is accepted
whole: ``check_complete`` passes, ``oversmooth audit`` reads both blocks without ``--partial``,
and ``inspect`` names the extra Softmax with the reason it is not attention. The pooling head on
the corpus's HuBERT (optimum's export, raw samples of open length) is told at the long probe.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from oversmooth.cli import main
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import IncompleteMatchError, check_complete, find_attention_blocks
from tests.importers.builders import NEAR_MISSES, assemble
from tests.importers.family_corpus import FIXTURES, fixture_proto
from tests.importers.softmax_heads import (
    with_attention_outputs,
    with_gating_head,
    with_pooling_head,
    with_probabilities_head,
)

SEED = 5


def _probabilities_and_attentions(model: onnx.ModelProto) -> onnx.ModelProto:
    return with_probabilities_head(with_attention_outputs(model))


#: Head -> (how it is added, the extra Softmax's name, a fragment of why it is not attention).
HEADS: dict[str, tuple[Callable[[onnx.ModelProto], onnx.ModelProto], str, str]] = {
    "pooling": (
        with_pooling_head,
        "pool/Softmax13",
        "it weights another activation that is then summed away (Mul 'pool/Mul15' with "
        "'last_hidden_state'; ReduceSum 'pool/ReduceSum17' over axis 1): a pooling",
    ),
    "probabilities": (
        with_probabilities_head,
        "classify/Softmax6",
        "it is the graph output 'probabilities'",
    ),
    "gating": (
        with_gating_head,
        "gate/Softmax6",
        "it gates another activation (Mul 'gate/Mul7' with 'last_hidden_state')",
    ),
    "output_attentions": (
        _probabilities_and_attentions,
        "classify/Softmax6",
        "it is the graph output 'probabilities'",
    ),
}


def _write(tmp_path: Path, head: str) -> Path:
    path = tmp_path / f"{head}.onnx"
    onnx.save(HEADS[head][0](assemble("bert_legacy", SEED).built.model), path)
    return path


def _cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("head", sorted(HEADS))
def test_a_softmax_that_is_not_attention_is_neither_a_block_nor_missing(
    tmp_path: Path, head: str
) -> None:
    _, softmax, reason = HEADS[head]
    report = find_attention_blocks(model_from_proto(onnx.load(_write(tmp_path, head))))
    assert len(report.blocks) == 2
    (failure,) = report.failures
    assert failure.softmax == softmax
    assert failure.not_attention is not None
    assert reason in failure.not_attention
    assert (report.unmatched, report.not_attention) == ([], [failure])
    check_complete(report, partial=False)


def test_attention_probabilities_returned_as_outputs_are_still_the_blocks_a() -> None:
    """``output_attentions=True``: the probabilities the A·V product reads are graph outputs too;
    each block is matched, A read at that output, and only the class probabilities are not
    attention."""
    proto = _probabilities_and_attentions(assemble("bert_legacy", SEED).built.model)
    report = find_attention_blocks(model_from_proto(proto))
    assert [block.attention_name for block in report.blocks] == ["attentions.0", "attentions.1"]
    assert [failure.softmax for failure in report.failures] == ["classify/Softmax6"]
    check_complete(report, partial=False)


def test_a_pooling_over_frames_of_open_length_is_told_at_the_long_probe() -> None:
    """HuBERT exported by optimum reads raw samples of open length: at the default probe (3
    samples) its convolutions leave no frame, so the pooling's shape is read at the long probe
    (400 samples: 39 frames), one query row, not a square (query, key) matrix."""
    file = "hubert/optimum.onnx.xz"
    proto = with_pooling_head(fixture_proto(file))
    report = find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))
    assert len(report.blocks) == 2
    (failure,) = report.not_attention
    assert failure.not_attention is not None
    assert "a pooling, its probabilities (2, 1, 39) not a square" in failure.not_attention
    check_complete(report, partial=False)


def test_a_declined_block_whose_probabilities_are_outputs_is_still_missing() -> None:
    """A block the matcher declines (K never transposed) stays unmatched attention when its
    probabilities are also returned: the A·V product decides, not the graph output."""
    model = model_from_proto(with_attention_outputs(NEAR_MISSES["k_not_transposed"](SEED).model))
    report = find_attention_blocks(model)
    (missing,) = report.unmatched
    assert missing.not_attention is None
    with pytest.raises(IncompleteMatchError, match="1 of 2 attention blocks are not matched"):
        check_complete(report, partial=False)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_the_audit_reads_the_model_whole_and_inspect_names_the_softmax(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str
) -> None:
    _, softmax, reason = HEADS[head]
    path = _write(tmp_path, head)
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **assemble("bert_legacy", SEED).built.inputs)
    out_dir = tmp_path / "report"
    argv = ("audit", path, "--inputs", feeds, "--out", out_dir, "--no-progress")
    status, out, err = _cli(capsys, *argv)
    assert status == 0, err
    assert not out.startswith("PARTIAL")
    doc = json.loads((out_dir / "audit.json").read_text(encoding="utf-8"))
    assert len(doc["blocks"]) == 2
    assert not any(note.startswith("PARTIAL") for note in doc["notes"])

    status, printed, _ = _cli(capsys, "inspect", path)
    assert status == 0
    assert "NOT matched" not in printed
    (line,) = [line for line in printed.splitlines() if "not attention" in line]
    assert line.startswith(f"Softmax {softmax!r}: not attention: ")
    assert reason in line
    assert "rejected (see --explain)" not in printed

    status, printed, _ = _cli(capsys, "inspect", path, "--json")
    record = json.loads(printed)
    assert (record["n_unmatched_attention"], record["n_not_attention"]) == (0, 1)
    (failure,) = record["failures"]
    assert failure["attention"] is False
    assert reason in failure["not_attention"]

    status, printed, _ = _cli(capsys, "inspect", path, "--explain")
    assert "2 attention block(s) matched, 1 rejected (1 not attention)" in printed
    assert f"Softmax {softmax!r}: not attention: " in printed
