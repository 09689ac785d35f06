"""The score sum behind a Softmax (:mod:`oversmooth.importers.match.scores`), walked on hand-built
graphs: the signs and scalar factors on the way to the query-key product, a mask fill, a floor at
a masking level and a soft-cap passed, every other operand kept as one term; and the reasons given
when no product, or more than one, is found.

Term classification (masks, ALiBi, relative biases) is tested in ``test_score_bias``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.projections import ProjectionFinder
from oversmooth.importers.match.scores import ScoreMatcher, ScoreTerm
from oversmooth.importers.match.walker import MatchBasis, RejectError
from tests.importers.small_graph import SmallGraph

D = 4
MASK = helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "sequence", "sequence"])


def _qk(g: SmallGraph, stream: str = "x") -> str:
    """``(stream W_Q)(stream W_K)ᵀ``: (batch, T, T)."""
    q = g.op("MatMul", stream, g.const(np.eye(D)))
    k = g.op("MatMul", stream, g.const(2 * np.eye(D)))
    return g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1]))


def _matcher(model: onnx.ModelProto) -> ScoreMatcher:
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    context = basis.shapes.context()
    return ScoreMatcher(basis, context, ProjectionFinder(basis, context))


def _softmax(g: SmallGraph, scores: str, inputs=()) -> tuple[ScoreMatcher, object]:
    out = g.op("Softmax", scores, axis=-1)
    matcher = _matcher(g.model(out, D, inputs=inputs))
    return matcher, matcher.producer(out)


def test_signs_factors_fills_floors_and_caps_on_the_way_to_the_product() -> None:
    """``Softmax(4·tanh(Max(Where(mask, -1e9, -(-(QKᵀ/4) + B)), -1e9)/4))``, by hand: the product
    with factor 1/4, B one term with factor -1 (the Neg of the sum), the fill masked where
    ``mask`` is true, the Tanh noted; the cap and its inverse cancel."""
    g = SmallGraph()
    product = _qk(g)
    bias = g.const(np.ones((3, 3)))
    summed = g.op("Add", g.op("Neg", g.op("Div", product, g.const(4.0))), bias)
    filled = g.op("Where", "mask", g.const(-1e9), g.op("Neg", summed))
    floored = g.op("Max", filled, g.const(-1e9))
    capped = g.op("Mul", g.op("Tanh", g.op("Div", floored, g.const(4.0))), g.const(4.0))
    matcher, softmax = _softmax(g, capped, [MASK])
    found = matcher.score_sum(softmax)
    ((node, factor, path),) = found.products
    assert node.outputs[0] == product
    assert factor == 0.25
    assert found.terms == [ScoreTerm(bias, -1.0)]
    ((fill,),) = [found.fills]
    assert (fill.condition, fill.masked_when, fill.scores) == ("mask", True, fill.node.input(2))
    assert [label.split("#")[0] for label in found.capped] == ["Tanh"]
    assert [step.op_type for step in path] == "Mul Tanh Div Max Where Neg Add Neg Div".split()
    content, scale, passed = matcher.content_product(softmax, found)
    assert (content, scale) == (node, 0.25)
    assert len(passed) == len(path)


@pytest.mark.parametrize(
    ("floor", "passed"), [(-1e9, True), (-1e4, True), (-1e3, False), (0.0, False)]
)
def test_only_a_floor_at_a_masking_level_is_passed(floor: float, passed: bool) -> None:
    """``Max(scores, c)`` changes no unmasked score only where c is at or below MASK_FLOOR
    (-1e4); a higher floor makes the Max one term with no product behind it."""
    g = SmallGraph()
    floored = g.op("Max", _qk(g), g.const(floor))
    matcher, softmax = _softmax(g, floored)
    found = matcher.score_sum(softmax)
    assert len(found.products) == int(passed)
    if not passed:
        with pytest.raises(RejectError, match=r"reached Max 'Max#\d+'") as raised:
            matcher.content_product(softmax, found)
        assert raised.value.code == RejectCode.NO_QK_MATMUL


def test_a_where_whose_fill_is_not_a_masking_level_is_a_term() -> None:
    g = SmallGraph()
    filled = g.op("Where", "mask", g.const(-1.0), _qk(g))
    matcher, softmax = _softmax(g, filled, [MASK])
    found = matcher.score_sum(softmax)
    assert (found.products, found.fills) == ([], [])
    assert found.terms == [ScoreTerm(filled, 1.0)]


def test_a_matmul_by_a_constant_is_named_as_no_query_key_product() -> None:
    """A classifier's logits ``x W`` before a Softmax: the reason names the constant."""
    g = SmallGraph()
    weight = g.const(np.ones((D, 3)))
    matcher, softmax = _softmax(g, g.op("MatMul", "x", weight))
    found = matcher.score_sum(softmax)
    with pytest.raises(RejectError, match=f"multiplies by the constant {weight!r}"):
        matcher.content_product(softmax, found)


def test_two_products_of_one_stream_are_refused_naming_both() -> None:
    """Two query-key products of the same stream added: no single content product."""
    g = SmallGraph()
    first, second = _qk(g), _qk(g)
    matcher, softmax = _softmax(g, g.op("Add", first, second))
    found = matcher.score_sum(softmax)
    assert len(found.products) == 2
    with pytest.raises(RejectError, match="the scores add 2 products") as raised:
        matcher.content_product(softmax, found)
    assert set(raised.value.nodes) == {
        matcher.producer(first).label,
        matcher.producer(second).label,
    }


def test_a_scale_read_from_the_data_is_named() -> None:
    """Scores divided by a tensor computed from the input: not a constant score scale."""
    g = SmallGraph()
    data_scale = g.op("ReduceMax", "x", keepdims=0)
    matcher, softmax = _softmax(g, g.op("Div", _qk(g), data_scale))
    found = matcher.score_sum(softmax)
    with pytest.raises(RejectError, match="scaled by a non-constant factor") as raised:
        matcher.content_product(softmax, found)
    assert raised.value.code == RejectCode.SCORE_SCALE_NOT_CONSTANT
