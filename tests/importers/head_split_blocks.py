"""Small attention models whose head-split Reshapes spell what the graph inputs do not declare.

Each block projects the (B, T, D) stream ``x`` ["batch", T, D] and splits heads with a Reshape to a
constant shape, merging them back with another:

- :func:`windowed_decoder`: the middle block's split ``[-1, t, heads, d_head]`` folds each input's
  T = 16 tokens into 4 windows of t = 4: its Softmax is (4·B, heads, t, t), one t×t matrix per
  window and head, and the merge ``[-1, T, D]`` unfolds them before W_O. The blocks around it
  attend over all 16 tokens.
- :func:`batch_one_inside`: every split and merge spells batch 1 (``[1, T, heads, d_head]``, a
  torch dynamo export's ``view(1, T, 2, 4)``, the nodes named as dynamo names them: ``node_view``,
  ``node_view_1``...), so onnxruntime runs one input per call only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.importers.small_graph import SmallGraph

__all__ = ["batch_one_inside", "windowed_decoder"]

D, HEADS, D_HEAD = 8, 2, 4


def _attention(
    g: SmallGraph, x: str, rng: np.random.Generator, split: list[int], merge: list[int]
) -> str:
    """``x + merge(Softmax(q kᵀ / 2) v) W_O`` with q, k, v split by a Reshape to ``split``."""
    split_shape = g.const(split, np.int64)

    def project() -> str:
        weight = g.const(rng.normal(size=(D, D)) / 3)
        return g.op("Reshape", g.op("MatMul", x, weight), split_shape)

    q = g.op("Transpose", project(), perm=[0, 2, 1, 3])
    k_t = g.op("Transpose", project(), perm=[0, 2, 3, 1])
    v = g.op("Transpose", project(), perm=[0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(D_HEAD**-0.5))
    attended = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    mixed = g.op("Transpose", attended, perm=[0, 2, 1, 3])
    merged = g.op("Reshape", mixed, g.const(merge, np.int64))
    return g.op("Add", x, g.op("MatMul", merged, g.const(rng.normal(size=(D, D)) / 3)))


def _model(g: SmallGraph, out: str, tokens: int, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        g.nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", tokens, D])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        g.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def windowed_decoder(seed: int = 0) -> onnx.ModelProto:
    """Three blocks over ``x`` ["batch", 16, 8]; block 1 attends within 4 windows of 4 tokens."""
    tokens, window = 16, 4
    rng, g, stream = np.random.default_rng(seed), SmallGraph(), "x"
    for t in (tokens, window, tokens):
        stream = _attention(g, stream, rng, [-1, t, HEADS, D_HEAD], [-1, tokens, D])
    return _model(g, stream, tokens, "windowed_decoder")


def batch_one_inside(seed: int = 3, tokens: int = 6) -> onnx.ModelProto:
    """Two blocks over ``x`` ["batch", ``tokens``, 8] whose Reshapes spell batch 1."""
    rng, g, stream = np.random.default_rng(seed), SmallGraph(), "x"
    for _ in range(2):
        stream = _attention(g, stream, rng, [1, tokens, HEADS, D_HEAD], [1, tokens, D])
    reshapes = [node for node in g.nodes if node.op_type == "Reshape"]
    for i, node in enumerate(reshapes):
        node.name = "node_view" + (f"_{i}" if i else "")
    return _model(g, stream, tokens, "batch_one_inside")
