"""The matcher's results (:mod:`oversmooth.importers.match.results`): how failures are sorted
into unmatched, skipped and not-attention, the text and JSON records they make, the error message
naming the commonest reasons, and the one-line notes on blocks, each against a hand-worked
answer.

Blocks come from the ``bert_legacy`` builder (two post-LN BERT layers, ``tests/importers/builders.py``).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.results import (
    DEPARTURES,
    AttentionBlock,
    MatchFailure,
    MatchReport,
    NoAttentionBlocksError,
    _index_ranges,
    departures_note,
)
from tests.importers.builders import assemble

#: One failure of each kind: attention left unmatched, declined by design, not attention.
UNMATCHED = MatchFailure(
    "sm_a", "value MatMul not found", ("n1", "n2"), RejectCode.VALUE_MATMUL_MISSING
)
SKIPPED = MatchFailure("sm_b", "keys read another sequence", (), RejectCode.CROSS_ATTENTION)
NOT_ATTENTION = MatchFailure(
    "sm_c", "no QK product", (), RejectCode.OTHER, not_attention="a classifier's scores"
)


@pytest.fixture(scope="module")
def blocks() -> list[AttentionBlock]:
    model = model_from_proto(assemble("bert_legacy", 0).built.model)
    return find_attention_blocks(model).blocks


def test_a_failure_is_attention_unless_it_says_why_not() -> None:
    assert (UNMATCHED.attention, UNMATCHED.skipped) == (True, False)
    assert (SKIPPED.attention, SKIPPED.skipped) == (True, True)
    assert (NOT_ATTENTION.attention, NOT_ATTENTION.skipped) == (False, False)
    # A cross-attention code on a Softmax that is no attention at all is not "skipped".
    odd = dataclasses.replace(SKIPPED, not_attention="reduced away")
    assert (odd.attention, odd.skipped) == (False, False)


def test_a_failures_record_is_json() -> None:
    record = json.loads(json.dumps(UNMATCHED.to_dict()))
    assert record == {
        "softmax": "sm_a",
        "code": "value_matmul_missing",
        "reason": "value MatMul not found",
        "nodes": ["n1", "n2"],
        "attention": True,
        "skipped": False,
        "not_attention": None,
    }


def test_a_report_sorts_each_failure_into_one_group() -> None:
    """Unmatched, skipped and not-attention partition the failures, in their order."""
    failures = [NOT_ATTENTION, UNMATCHED, SKIPPED, UNMATCHED]
    report = MatchReport([], failures, 4)
    assert report.unmatched == [UNMATCHED, UNMATCHED]
    assert report.skipped == [SKIPPED]
    assert report.not_attention == [NOT_ATTENTION]
    record = report.to_dict()
    assert (record["n_unmatched_attention"], record["n_skipped"], record["n_not_attention"]) == (
        2,
        1,
        1,
    )
    assert record["n_softmax"] == 4
    assert [f["softmax"] for f in record["failures"]] == ["sm_c", "sm_a", "sm_b", "sm_a"]


def test_explain_says_what_became_of_each_softmax() -> None:
    report = MatchReport([], [UNMATCHED, SKIPPED, NOT_ATTENTION], 3)
    assert report.explain().splitlines() == [
        "3 Softmax node(s): 0 attention block(s) matched, 3 rejected "
        "(1 skipped by design, 1 not attention)",
        "Softmax 'sm_a': rejected [value_matmul_missing]: value MatMul not found",
        "  nodes: n1, n2",
        "Softmax 'sm_b': skipped by design [cross_attention]: keys read another sequence",
        "Softmax 'sm_c': not attention: a classifier's scores",
        "  rejected [other]: no QK product",
    ]


def test_explain_lists_a_matched_block_its_roles_and_notes(blocks: list[AttentionBlock]) -> None:
    noted = dataclasses.replace(blocks[0], notes=("scale 0.5",), stream_error="no residual Add")
    text = MatchReport([noted], [], 1).explain().splitlines()
    assert text[0] == "1 Softmax node(s): 1 attention block(s) matched, 0 rejected"
    assert text[1] == f"Softmax {noted.softmax!r}: block 0: {noted.summary()}"
    assert text[2 : 2 + len(noted.roles)] == [f"  {r}: {w}" for r, w in noted.roles.items()]
    assert text[-2:] == ["  note: scale 0.5", "  residual stream not established: no residual Add"]


def test_the_error_names_the_commonest_reasons_first() -> None:
    """Three Softmaxes fail one way, two another, one a third: with top=2, the first two are
    named, each by its first example, with their counts."""
    axis = MatchFailure("s1", "Softmax axis is 1", (), RejectCode.SOFTMAX_AXIS)
    failures = [UNMATCHED, axis, dataclasses.replace(axis, softmax="s2"), SKIPPED]
    failures += [
        dataclasses.replace(axis, softmax="s3"),
        dataclasses.replace(UNMATCHED, softmax="x"),
    ]
    err = NoAttentionBlocksError.from_failures(failures, top=2)
    assert str(err) == (
        "no attention block found among 6 Softmax node(s); most common reasons: "
        "Softmax 's1': Softmax axis is 1 (x3); Softmax 'sm_a': value MatMul not found (x2)"
    )
    assert err.failures == tuple(failures)
    assert err.exit_code == 1
    single = NoAttentionBlocksError.from_failures([SKIPPED])
    assert str(single).endswith("Softmax 'sm_b': keys read another sequence")


def test_with_no_softmax_the_error_names_the_fused_ops() -> None:
    plain = NoAttentionBlocksError.from_failures([])
    assert str(plain) == "no attention block found: the graph has no Softmax node"
    fused = NoAttentionBlocksError.from_failures(
        [], fused=["MultiHeadAttention", "Attention", "Attention"]
    )
    assert "it uses fused Attention, MultiHeadAttention nodes" in str(fused)
    assert fused.failures == ()


@pytest.mark.parametrize(
    ("indices", "text"),
    [([0], "0"), ([0, 1, 2, 3, 7, 9, 10], "0-3, 7, 9-10"), ([2, 4, 5], "2, 4-5"), ([], "")],
)
def test_index_ranges_by_hand(indices: list[int], text: str) -> None:
    assert _index_ranges(indices) == text


def test_departures_note_names_each_departure_and_its_blocks(blocks: list[AttentionBlock]) -> None:
    first, second = sorted(DEPARTURES)[:2]
    plain = blocks[0]
    departed = [
        dataclasses.replace(plain, index=i, departures=tuple(d))
        for i, d in enumerate([[first], [first, second], [], [first]])
    ]
    assert departures_note([plain, dataclasses.replace(plain, index=1)]) is None
    note = departures_note(departed)
    assert note is not None
    assert f"{DEPARTURES[first]} in block(s) 0-1, 3" in note
    assert f"{DEPARTURES[second]} in block(s) 1" in note
    assert note.startswith("not the linear update X + A X W_V W_O")


def test_a_blocks_summary_and_rotary_text(blocks: list[AttentionBlock]) -> None:
    """bert_legacy: post-LN LayerNorm, no causal mask, no rotary, no score bias."""
    block = blocks[0]
    assert block.summary() == (
        f"{block.n_heads} heads ({block.n_kv_heads} kv) x {block.d_head}, "
        f"d_model {block.d_model}, norm post-LN layernorm"
    )
    partial = dataclasses.replace(
        block, rotary="partial", rotary_width=4, causal=True, has_layer_scale=True
    )
    assert partial.rotary_text == f"partial 4/{block.d_head}"
    assert partial.summary().endswith(f", LayerScale, causal, rotary partial 4/{block.d_head}")
    assert dataclasses.replace(block, rotary="full").rotary_text == "full"


def test_a_blocks_sources_are_tensors_of_its_graph(blocks: list[AttentionBlock]) -> None:
    """Every weight source names an initializer of the graph; the tensors record names the
    attention input only where it differs from the layer input."""
    index = model_from_proto(assemble("bert_legacy", 0).built.model).index
    for block in blocks:
        sources = block.sources
        assert {"softmax", "W_Q", "W_K", "W_V", "W_O", "gamma", "beta"} <= set(sources)
        for key, name in sources.items():
            assert key == "softmax" or name in index.initializers, (key, name)
        record = json.loads(json.dumps(block.to_dict()))
        assert record["sources"] == sources
        assert "attention_input" not in record["tensors"]
    moved = dataclasses.replace(blocks[0], attention_input_name="after_ffn")
    assert moved.to_dict()["tensors"]["attention_input"] == "after_ffn"
