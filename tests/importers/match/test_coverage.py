"""All or nothing: unmatched attention stops audit and weights unless --partial, which says it first;
attention skipped by design (outside the theory) never does, and is named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from oversmooth.cli import main
from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import (
    IncompleteMatchError,
    MatchFailure,
    MatchReport,
    RejectCode,
    check_complete,
    find_attention_blocks,
    skipped_blocks_note,
)
from oversmooth.importers.match.codes import by_design
from tests.importers.builders import NEAR_MISSES, assemble

SEED = 0


def _broken_first_block(tmp_path: Path) -> Path:
    """bert_legacy with block 0's K never transposed (block 1 intact): its Softmax still weights
    V, so it is attention the matcher declines: 1 of 2 blocks unmatched."""
    path = tmp_path / "half.onnx"
    onnx.save(NEAR_MISSES["k_not_transposed"](SEED).model, path)
    return path


def _inputs(path: Path) -> Inputs:
    built = assemble("bert_legacy", SEED).built
    mask = built.inputs["attention_mask"].astype(bool)
    labels = tuple(f"item-{i}" for i in range(len(mask)))
    return Inputs(feeds=dict(built.inputs), token_mask=mask, labels=labels, source="test")


def _cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_partly_matched_model_is_refused_naming_the_missing_block(tmp_path: Path) -> None:
    path = _broken_first_block(tmp_path)
    report = find_attention_blocks(model_from_proto(onnx.load(path)))
    assert len(report.blocks) == 1
    (missing,) = report.unmatched
    with pytest.raises(IncompleteMatchError, match=r"1 of 2 attention blocks are not matched"):
        audit(path, _inputs(path), provider="cpu", dominance="none")
    with pytest.raises(IncompleteMatchError, match=missing.softmax):
        check_complete(report, partial=False)


def test_partial_says_first_which_blocks_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _broken_first_block(tmp_path)
    result = audit(path, _inputs(path), provider="cpu", dominance="none", partial=True)
    assert result.notes[0].kind == "partial"
    assert result.notes[0].text.startswith("PARTIAL: 1 of 2 attention blocks not matched")
    assert result.n_layers == 2
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, **_inputs(path).feeds)
    out_dir = tmp_path / "report"
    status, _, err = _cli(
        capsys, "audit", path, "--inputs", feeds, "--out", out_dir, "--no-progress"
    )
    assert status == 1
    assert "--partial" in err
    assert not out_dir.exists()
    status, out, _ = _cli(
        capsys, "audit", path, "--inputs", feeds, "--out", out_dir, "--no-progress", "--partial"
    )
    assert status == 0
    assert out.splitlines()[0].startswith("PARTIAL")
    assert json.loads((out_dir / "audit.json").read_text())["notes"][0].startswith("PARTIAL")
    report_lines = (out_dir / "report.md").read_text().splitlines()
    assert report_lines[2].startswith("**PARTIAL")


def test_weights_and_inspect_follow_the_same_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _broken_first_block(tmp_path)
    out = tmp_path / "w.npz"
    status, _, err = _cli(capsys, "weights", path, "--out", out)
    assert (status, out.exists()) == (1, False)
    assert "not matched" in err
    status, printed, _ = _cli(capsys, "weights", path, "--out", out, "--partial")
    assert status == 0
    assert printed.startswith("PARTIAL")
    assert sorted({key.split(".")[1] for key in np.load(out).files}) == ["0"]
    status, printed, _ = _cli(capsys, "inspect", path)
    assert status == 0
    assert "1 of 2 attention blocks NOT matched" in printed.splitlines()[0]


def test_a_classifier_softmax_is_not_missing_attention(tmp_path: Path) -> None:
    model = model_from_proto(NEAR_MISSES["not_qk_product"](SEED).model)
    report = find_attention_blocks(model)
    assert len(report.blocks) == 2
    (failure,) = report.failures
    assert failure.attention is False
    assert report.unmatched == []
    check_complete(report, partial=False)


def test_a_fused_attention_operator_counts_as_unmatched() -> None:
    proto = assemble("bert_legacy", SEED).built.model
    proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    first_input = proto.graph.node[0].output[0]
    proto.graph.node.append(
        onnx.helper.make_node(
            "Attention", [first_input], ["fused_out"], domain="com.microsoft", name="fused"
        )
    )
    report = find_attention_blocks(model_from_proto(proto))
    assert [failure.code for failure in report.unmatched] == ["fused_attention_op"]
    with pytest.raises(IncompleteMatchError, match="fused"):
        check_complete(report, partial=False)


def _failure(code: RejectCode) -> MatchFailure:
    return MatchFailure(f"Softmax_{code}", f"declined: {code}", (), code)


@pytest.mark.parametrize("code", list(RejectCode))
def test_only_a_decline_by_design_leaves_the_result_whole(code: RejectCode) -> None:
    """A block declined by design (cross-attention, windowed attention) is skipped and named; any
    other decline makes the result partial, refused without --partial."""
    report = MatchReport([], [_failure(code)], 1)
    if by_design(code):
        assert (report.skipped, report.unmatched) == ([_failure(code)], [])
        check_complete(report, partial=False)
        assert skipped_blocks_note(report).startswith("SKIPPED by design: 1 of 1")
        assert f"[{code}]: declined: {code}" in skipped_blocks_note(report)
    else:
        assert (report.skipped, report.unmatched) == ([], [_failure(code)])
        with pytest.raises(IncompleteMatchError, match=f"declined: {code}"):
            check_complete(report, partial=False)
        assert skipped_blocks_note(report) == ""
    assert report.to_dict()["n_skipped"] == int(by_design(code))
    assert report.to_dict()["failures"][0]["skipped"] is by_design(code)


def test_a_skipped_block_beside_a_failed_one_still_refuses(tmp_path: Path) -> None:
    """The near miss whose block 0 the matcher cannot read (K never transposed) stays refused when
    a cross-attention is skipped beside it: the failure, not the skip, decides."""
    report = find_attention_blocks(model_from_proto(NEAR_MISSES["k_not_transposed"](SEED).model))
    (missing,) = report.unmatched
    with_skip = MatchReport(
        report.blocks, [*report.failures, _failure(RejectCode.CROSS_ATTENTION)], 3
    )
    with pytest.raises(IncompleteMatchError, match=r"1 of 3 attention blocks are not matched"):
        check_complete(with_skip, partial=False)
    assert missing.code == RejectCode.K_NOT_TRANSPOSED
