"""The rule on a rejected Softmax's uses (importers.match.softmax_uses, through coverage): not
attention only when no use of its probabilities is, or may be, the A of an A·V product.

Each graph reads ``x`` (batch, sequence, 4) and has one Softmax that the matcher rejects (no
projections: the scores are built from ``x`` itself, or not a product at all), so the answer is
the rule's alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import (
    IncompleteMatchError,
    MatchFailure,
    NoAttentionBlocksError,
    ProbeBases,
    check_complete,
    find_attention_blocks,
)
from oversmooth.importers.match.coverage import not_attention_reason
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from tests.importers.builders import NEAR_MISSES, VARIANTS
from tests.importers.small_graph import SmallGraph

D = 4
#: One case: the graph's nodes added to a SmallGraph, returning the tensors it outputs.
Build = Callable[[SmallGraph], list[str]]


def _self_scores(g: SmallGraph) -> str:
    """Softmax(x xᵀ): token-by-token scores of two activations, (batch, T, T)."""
    return g.op("Softmax", g.op("MatMul", "x", g.op("Transpose", "x", perm=[0, 2, 1])), axis=-1)


def _feature_softmax(g: SmallGraph) -> str:
    """Softmax(tanh(x)) over the features: scores that are no product at all."""
    return g.op("Softmax", g.op("Tanh", "x"), axis=-1)


def _pooled_query(g: SmallGraph) -> str:
    """Softmax(mean(x) xᵀ): one query, the tokens' mean, over the tokens: (batch, 1, T)."""
    query = g.op("ReduceMean", "x", axes=[1], keepdims=1)
    return g.op("Softmax", g.op("MatMul", query, g.op("Transpose", "x", perm=[0, 2, 1])), axis=-1)


def _weighted_sum(g: SmallGraph, p: str, axis: int) -> str:
    return g.op("ReduceSum", g.op("Mul", p, "x"), g.const([axis], np.int64), keepdims=0)


def _written_out(g: SmallGraph) -> list[str]:
    """A·V written out: (B, T, T, 1) ⊙ (B, 1, T, D) summed over the keys."""
    p = g.op("Unsqueeze", _self_scores(g), g.const([-1], np.int64))
    v = g.op("Unsqueeze", "x", g.const([1], np.int64))
    return [g.op("ReduceSum", g.op("Mul", p, v), g.const([2], np.int64), keepdims=0)]


def _head_mask(g: SmallGraph) -> list[str]:
    """The probabilities times a head mask fed as an input, then A·V."""
    return [g.op("MatMul", g.op("Mul", _self_scores(g), "head_mask"), "x")]


def _unused(g: SmallGraph) -> list[str]:
    _feature_softmax(g)
    return [g.op("Tanh", "x")]


#: Case -> (graph, fragments of the reason it is not attention). SmallGraph leaves nodes unnamed
#: (labels ``<op>#<position>``) and names tensors ``<op><n>``, constants ``c<n>``.
NOT_ATTENTION: dict[str, tuple[Build, tuple[str, ...]]] = {
    "reduced over the keys": (
        lambda g: [g.op("ReduceMax", _feature_softmax(g), axes=[-1], keepdims=0)],
        ("its output is reduced away (ReduceMax 'ReduceMax#2' over the last axis)",),
    ),
    "reduced over another axis": (
        lambda g: [g.op("ReduceSum", _self_scores(g), g.const([1], np.int64), keepdims=0)],
        ("its output is reduced away (ReduceSum", "over axis 1)"),
    ),
    "a graph output": (lambda g: [_feature_softmax(g)], ("it is the graph output 'softmax2'",)),
    "a gate": (
        lambda g: [g.op("Mul", "x", _feature_softmax(g))],
        ("it gates another activation (Mul 'Mul#2' with 'x')",),
    ),
    "a right operand": (
        lambda g: [g.op("MatMul", "x", g.op("Softmax", g.const(np.eye(D)), axis=-1))],
        ("it is the right operand of MatMul 'MatMul#1' (X·P, not the A of A·V)",),
    ),
    "a product with a constant": (
        lambda g: [g.op("MatMul", _feature_softmax(g), g.const(np.eye(D)))],
        ("it feeds MatMul 'MatMul#2' with a constant ('c3')",),
    ),
    "nothing": (_unused, ("it feeds nothing",)),
    "a pooling by one query": (
        lambda g: [_weighted_sum(g, g.op("Transpose", _pooled_query(g), perm=[0, 2, 1]), 1)],
        (
            "it weights another activation that is then summed away (Mul 'Mul#5' with 'x'; "
            "ReduceSum 'ReduceSum#6' over axis 1)",
            "a pooling, its probabilities (2, 1, 3) not a square (query, key) matrix",
        ),
    ),
}

ATTENTION: dict[str, Build] = {
    "A·V": lambda g: [g.op("MatMul", _self_scores(g), "x")],
    "A·V after a view": lambda g: [
        g.op("MatMul", g.op("Reshape", _self_scores(g), g.const([0, 0, -1], np.int64)), "x")
    ],
    "Einsum": lambda g: [g.op("Einsum", _self_scores(g), "x", equation="bqk,bkd->bqd")],
    "Vᵀ Aᵀ": lambda g: [
        g.op(
            "MatMul",
            g.op("Transpose", "x", perm=[0, 2, 1]),
            g.op("Transpose", _self_scores(g), perm=[0, 2, 1]),
        )
    ],
    "A·V, A also a graph output": lambda g: [p := _self_scores(g), g.op("MatMul", p, "x")],
    "masked by an input, then A·V": _head_mask,
    "A·V written out (square)": _written_out,
    "an op the rule does not know": lambda g: [g.op("Log", _feature_softmax(g))],
}


def _model(build: Build) -> onnx.ModelProto:
    g = SmallGraph()
    outputs = build(g)
    mask = helper.make_tensor_value_info("head_mask", TensorProto.FLOAT, [1])
    uses_mask = any("head_mask" in node.input for node in g.nodes)
    model = g.model(outputs[0], D, inputs=[mask] if uses_mask else ())
    for name in outputs[1:]:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return model


def _only_failure(model: onnx.ModelProto) -> MatchFailure:
    try:
        failures = find_attention_blocks(model_from_proto(model)).failures
    except NoAttentionBlocksError as err:
        failures = list(err.failures)
    (failure,) = failures
    return failure


@pytest.mark.parametrize("case", sorted(NOT_ATTENTION))
def test_a_softmax_whose_probabilities_weight_no_values_is_not_attention(case: str) -> None:
    build, fragments = NOT_ATTENTION[case]
    failure = _only_failure(_model(build))
    assert failure.not_attention is not None, failure
    for fragment in fragments:
        assert fragment in failure.not_attention
    assert not failure.attention
    record = failure.to_dict()
    assert (record["attention"], record["not_attention"]) == (False, failure.not_attention)


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_a_softmax_that_weights_values_stays_attention(case: str) -> None:
    """A·V in any of its forms (or a use the rule cannot place) keeps a rejected Softmax
    attention: the audit refuses rather than drop a block. A·V written out as Mul + ReduceSum
    over square probabilities is one such form (decided in the coverage module)."""
    failure = _only_failure(_model(ATTENTION[case]))
    assert failure.not_attention is None, failure
    assert failure.attention
    assert failure.to_dict()["not_attention"] is None


def test_a_square_weighted_sum_beside_a_matched_block_is_refused() -> None:
    """The written-out A·V beside a block the matcher reads: unmatched attention, so the model
    is refused unless partial."""
    g, rng = SmallGraph(), np.random.default_rng(0)
    q, k, v = (g.op("MatMul", "x", g.const(rng.normal(size=(D, D)))) for _ in range(3))
    split = g.const([0, 0, 2, 2], np.int64)
    q, v = (g.op("Transpose", g.op("Reshape", t, split), perm=[0, 2, 1, 3]) for t in (q, v))
    k_t = g.op("Transpose", g.op("Reshape", k, split), perm=[0, 2, 3, 1])
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(2**-0.5))
    block = g.attend(scores, v, rng.normal(size=(D, D)), D)
    written_out = _written_out(g)[0]
    model = g.model(block, D)
    model.graph.output.append(helper.make_tensor_value_info(written_out, TensorProto.FLOAT, None))
    report = find_attention_blocks(model_from_proto(model))
    assert len(report.blocks) == 1
    assert len(report.unmatched) == 1
    with pytest.raises(IncompleteMatchError, match="1 of 2 attention blocks"):
        check_complete(report, partial=False)


#: The near misses whose broken Softmax weights no values (every other one feeds an A·V MatMul).
_NOT_ATTENTION_NEAR_MISSES = {
    "not_qk_product": "its scores are a product with a constant matrix",
    "value_matmul_missing": "its output is reduced away (ReduceSum",
    "value_not_projected": "with a constant",
}


@pytest.mark.parametrize("tag", sorted(NEAR_MISSES))
def test_a_near_miss_is_attention_exactly_when_it_weights_values(tag: str) -> None:
    failures = _failures(NEAR_MISSES[tag](0).model)
    expected = _NOT_ATTENTION_NEAR_MISSES.get(tag)
    for failure in failures:
        if expected is None:
            assert failure.not_attention is None, failure
        else:
            assert failure.not_attention is not None
            assert expected in failure.not_attention


def _failures(model: onnx.ModelProto) -> list[MatchFailure]:
    try:
        return find_attention_blocks(model_from_proto(model)).failures
    except NoAttentionBlocksError as err:
        return list(err.failures)


@pytest.mark.parametrize("name", sorted(set(VARIANTS) - {"dynamic_quant"}))
def test_every_matched_softmax_of_a_builder_is_attention_by_the_rule(name: str) -> None:
    """The rule never calls a block the matcher reads not attention (every builder variant)."""
    model = model_from_proto(VARIANTS[name](0).model)
    labels = {block.softmax for block in find_attention_blocks(model).blocks}
    basis = ProbeBases(model.index).at((PROBE_BATCH, PROBE_SEQUENCE))
    softmaxes = [node for node in model.index.nodes_of_type("Softmax") if node.label in labels]
    assert len(softmaxes) == 2
    assert [not_attention_reason(basis, node) for node in softmaxes] == [None, None]
