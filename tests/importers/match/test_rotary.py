"""Rotary embeddings recognised by structure (:mod:`oversmooth.importers.match.rotary`), on
hand-built one-op graphs: ``x·cos + rotate(x)·sin`` with rotate-half and GPT-J's rotate-every-two
is a rotation of ``x`` (numpy's rotation of the same input is what onnxruntime computes), a
rotation without the sign change or of another tensor is not, and the ``RotaryEmbedding``
operator's attributes give its style and width.

Whole graphs with partial and operator rotary embeddings are in ``test_partial_rotary`` and
``test_rotary_operator``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from oversmooth.importers.graph import Node, model_from_proto
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.rotary import RotaryMatcher
from oversmooth.importers.match.walker import MatchBasis, RejectError
from oversmooth.simulator import tolerances as tol
from tests.importers.small_graph import SmallGraph

D = 4
BIG = 2**62
ANGLES = np.array([0.3, 0.3, 1.1, 1.1]) / 2


def _slice(g: SmallGraph, x: str, start: int, end: int, step: int = 1) -> str:
    ints = [g.const([value], np.int64) for value in (start, end, -1, step)]
    return g.op("Slice", x, *ints)


def _rotate(g: SmallGraph, x: str, style: str, *, negate: bool = True) -> str:
    sign = (lambda t: g.op("Neg", t)) if negate else (lambda t: t)
    if style == "rotate-half":
        first, second = _slice(g, x, 0, D // 2), _slice(g, x, D // 2, BIG)
        return g.op("Concat", sign(second), first, axis=-1)
    axis = g.const([-1], np.int64)
    even, odd = _slice(g, x, 0, BIG, 2), _slice(g, x, 1, BIG, 2)
    pairs = g.op(
        "Concat", g.op("Unsqueeze", sign(odd), axis), g.op("Unsqueeze", even, axis), axis=-1
    )
    return g.op("Reshape", pairs, g.const([0, 0, -1], np.int64))


def _rope(g: SmallGraph, x: str, rotated: str) -> str:
    return g.op(
        "Add",
        g.op("Mul", x, g.const(np.cos(ANGLES))),
        g.op("Mul", rotated, g.const(np.sin(ANGLES))),
    )


def _bare_matcher() -> RotaryMatcher:
    """A matcher over a one-op graph, for questions about a lone node."""
    g = SmallGraph()
    return _matcher(g.model(g.op("Identity", "x"), D))


def _matcher(model: onnx.ModelProto) -> RotaryMatcher:
    basis = MatchBasis(model_from_proto(model).index, PROBE_BATCH, PROBE_SEQUENCE)
    return RotaryMatcher(basis, basis.shapes.context())


def _numpy_rotation(x: np.ndarray, style: str) -> np.ndarray:
    """The rotation, written independently: rotate-half pairs column j with j + D/2, the
    interleaved form pairs 2i with 2i + 1."""
    if style == "rotate-half":
        rotated = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], axis=-1)
    else:
        rotated = np.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)
    return x * np.cos(ANGLES) + rotated * np.sin(ANGLES)


@pytest.mark.parametrize("style", ["rotate-half", "interleaved"])
def test_a_rotation_of_x_is_recognised_with_its_style(style: str) -> None:
    g = SmallGraph()
    out = _rope(g, "x", _rotate(g, "x", style))
    model = g.model(out, D, ir_version=8)
    x = np.random.default_rng(5).standard_normal((2, 3, D)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (value,) = session.run(None, {"x": x})
    np.testing.assert_allclose(
        value, _numpy_rotation(x.astype(np.float64), style), rtol=tol.ORT_RTOL, atol=tol.ORT_ATOL
    )
    matcher = _matcher(model)
    node = matcher.producer(out)
    assert matcher.rope_match(node) == ("x", style)
    assert matcher.rotation(node) == ("x", style)


def test_a_permutation_without_the_sign_change_is_no_rotation() -> None:
    """``Concat(x2, x1)`` only swaps halves: x·cos + swap(x)·sin is not a rotary embedding."""
    g = SmallGraph()
    out = _rope(g, "x", _rotate(g, "x", "rotate-half", negate=False))
    matcher = _matcher(g.model(out, D))
    assert matcher.rope_match(matcher.producer(out)) is None


def test_a_rotation_of_another_tensor_is_no_rotation_of_x() -> None:
    g = SmallGraph()
    other = g.op("Neg", g.op("Relu", "x"))
    out = _rope(g, "x", _rotate(g, other, "rotate-half"))
    matcher = _matcher(g.model(out, D))
    assert matcher.rope_match(matcher.producer(out)) is None
    assert matcher.rope_match(matcher.producer(other)) is None


@pytest.mark.parametrize(
    ("attrs", "style", "width"),
    [
        ({}, "full rotate-half (operator)", None),
        ({"interleaved": 1}, "full interleaved (operator)", None),
        (
            {"rotary_embedding_dim": 2},
            "partial rotate-half on the first 2 columns of each head (operator)",
            2,
        ),
    ],
)
def test_the_rotary_operator_says_its_style_and_width(attrs: dict, style: str, width) -> None:
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], **attrs)
    matcher = _bare_matcher()
    assert matcher.rotary_op(Node(0, node, 23)) == (style, width)
    rotation = matcher.rotation(Node(0, node, 23))
    assert rotation == (None if width else ("x", style.split()[1]))


def test_a_rotary_operator_that_also_scales_is_refused() -> None:
    node = Node(0, helper.make_node("RotaryEmbedding", ["x", "p", "c", "s"], ["y"], scale=0.5), 1)
    with pytest.raises(RejectError, match=r"also scales by 0\.5") as raised:
        _bare_matcher().rotary_op(node)
    assert raised.value.code == RejectCode.ROTARY_SCALE
