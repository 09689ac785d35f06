"""A small model whose middle block attends within windows folded into the batch inside the block.

The Q/K/V projections read the (B, T, D) stream, but the head-split Reshapes fold each input's
T = 16 tokens into 4 windows of t = 4 (``[-1, t, heads, d_head]``): the Softmax is
(4·B, heads, t, t), one t×t matrix per window and head, and the head merge unfolds them back to
(B, T, D) before W_O. The blocks around it attend over all 16 tokens.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.importers.small_graph import SmallGraph

__all__ = ["windowed_decoder"]

D, HEADS, D_HEAD, TOKENS, WINDOW = 8, 2, 4, 16, 4


def _attention(g: SmallGraph, x: str, rng: np.random.Generator, window: int) -> str:
    """``x + attention(x) W_O``; with ``window`` < :data:`TOKENS` rows of ``window`` tokens attend
    separately (the windows folded into the leading axis by the head split)."""
    split = g.const([-1, window, HEADS, D_HEAD], np.int64)

    def project() -> str:
        return g.op("Reshape", g.op("MatMul", x, g.const(rng.normal(size=(D, D)) / 3)), split)

    q = g.op("Transpose", project(), perm=[0, 2, 1, 3])
    k_t = g.op("Transpose", project(), perm=[0, 2, 3, 1])
    v = g.op("Transpose", project(), perm=[0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(D_HEAD**-0.5))
    probs = g.op("Softmax", scores, axis=-1)
    mixed = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    merged = g.op("Reshape", mixed, g.const([-1, TOKENS, D], np.int64))
    return g.op("Add", x, g.op("MatMul", merged, g.const(rng.normal(size=(D, D)) / 3)))


def windowed_decoder(seed: int = 0) -> onnx.ModelProto:
    """Three residual attention blocks over ``x`` (batch, 16, 8); block 1 attends in windows of 4."""
    rng = np.random.default_rng(seed)
    g = SmallGraph()
    stream = "x"
    for window in (TOKENS, WINDOW, TOKENS):
        stream = _attention(g, stream, rng, window)
    graph = helper.make_graph(
        g.nodes,
        "windowed_decoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", TOKENS, D])],
        [helper.make_tensor_value_info(stream, TensorProto.FLOAT, None)],
        g.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
