"""Score scales computed at run time from shapes (issue 11, cause C).

SDPA exports without an explicit scale multiply Q and K each by
``Sqrt(1/Sqrt(Cast(Shape(q)[-1])))``; a GPT-2-style score ``Div`` by ``Pow(Cast(Shape(v)[-1]), 0.5)``
is the same kind of factor. Such a factor depends on shapes only, so the matcher evaluates it at the
probe's sizes and accepts it; the block's ``scale`` is the product of the factors on Q, K and the
scores, and W_Q / W_K are read without it. A factor computed from the activations is still declined.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.weights import block_weights
from tests.importers.small_graph import SmallGraph

D, HEADS, D_HEAD = 8, 2, 4


class _Graph(SmallGraph):
    def last_dim(self, x: str) -> str:
        """``Cast(Shape(x)[-1])`` as a float scalar."""
        return self.op("Cast", self.op("Shape", x, start=-1), to=TensorProto.FLOAT)

    def sdpa_factor(self, x: str) -> str:
        """``Sqrt(1 / Sqrt(d_head))`` with d_head read from ``x``'s shape."""
        root = self.op("Sqrt", self.last_dim(x))
        return self.op("Sqrt", self.op("Div", self.const(1.0), root))


def _model(kind: str, seed: int = 0) -> tuple[object, dict[str, np.ndarray], float]:
    """A one-block graph whose scale is made as ``kind`` says; returns (model, weights, scale)."""
    rng = np.random.default_rng(seed)
    weights = {
        role: rng.normal(scale=0.4, size=(D, D)).astype(np.float32) for role in ("q", "k", "v", "o")
    }
    g = _Graph()
    heads = g.const([0, 0, HEADS, D_HEAD], np.int64)

    def project(role: str) -> str:
        return g.op("Reshape", g.op("MatMul", "x", g.const(weights[role])), heads)

    q = g.op("Transpose", project("q"), perm=[0, 2, 1, 3])
    k_t = g.op("Transpose", project("k"), perm=[0, 2, 3, 1])
    v = g.op("Transpose", project("v"), perm=[0, 2, 1, 3])
    expected = D_HEAD**-0.5
    if kind == "sdpa":  # both operands times d_head^-1/4, from the shape of q
        factor = g.sdpa_factor(q)
        scores = g.op("MatMul", g.op("Mul", q, factor), g.op("Mul", factor, k_t))
    elif kind == "pow_div":  # GPT-2: scores / Pow(Cast(Shape(v)[-1]), 0.5)
        root = g.op("Pow", g.last_dim(v), g.const(0.5))
        scores = g.op("Div", g.op("MatMul", q, k_t), root)
    elif kind == "mixed":  # Q by a shape factor, K by a constant, the scores by a shape factor
        factor = g.sdpa_factor(q)
        scores = g.op("MatMul", g.op("Mul", q, factor), g.op("Mul", k_t, g.const(2.0)))
        scores = g.op("Div", scores, g.op("Mul", g.last_dim(q), g.const(0.25)))
        expected = D_HEAD**-0.25 * 2.0 / (D_HEAD * 0.25)
    elif kind == "data":  # a factor computed from the activations: still declined
        factor = g.op("Reciprocal", g.op("ReduceMax", g.op("Abs", q), keepdims=0))
        scores = g.op("MatMul", g.op("Mul", q, factor), k_t)
    else:
        raise ValueError(kind)
    proto = g.model(g.attend(scores, v, weights["o"], D), D)
    return model_from_proto(proto), weights, expected


@pytest.mark.parametrize("kind", ["sdpa", "pow_div", "mixed"])
def test_shape_computed_scale_is_accepted(kind: str) -> None:
    model, weights, expected = _model(kind)
    report = find_attention_blocks(model)
    assert len(report.blocks) == 1
    assert not report.failures
    block = report.blocks[0]
    assert block.n_heads == HEADS
    assert block.d_head == D_HEAD
    assert block.scale == pytest.approx(expected, rel=1e-6)
    assert bool(block.notes) == (kind == "mixed")  # 1/sqrt(d_head) unless the factors say otherwise
    read = block_weights(model, block)
    for role in ("q", "k", "v", "o"):  # W_Q and W_K without the scale
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)


def test_data_dependent_scale_is_declined() -> None:
    model, _weights, _expected = _model("data")
    with pytest.raises(NoAttentionBlocksError, match="Q projection not found"):
        find_attention_blocks(model)
