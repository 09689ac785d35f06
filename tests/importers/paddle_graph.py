"""A small OCR recogniser laid out the way paddle2onnx exports PaddleOCR's (SVTR neck) models.

paddle2onnx keeps every weight in a ``Constant`` node (no initializers), names tensors
``<op>_<n>.tmp_0``, leaves the image width open (``p2o.DynamicDimension.*``) and spells Paddle's
``reshape`` with 0 in the target (copy that dimension): ``[0, 0, -1]`` to flatten the feature map,
``[0, -1, 3, heads, d_head]`` to split a fused QKV projection, ``[0, -1, d_model]`` to merge the
heads. Here a convolution stack downsamples the width 8 times (two stride-2 convolutions and a
2x2 average pool), so a width of 3 leaves no token at all, then one pre-LN attention block (layer
norm decomposed below opset 17) reads the tokens; d_head is 15, as in PP-OCRv3's neck (120 / 8).

Public API
----------
PaddleOcr
    The model, its attention weights (float64, row-vector convention) and a feed.
paddle_ocr
    Build it at a default-domain opset (11 to 17).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["PaddleOcr", "paddle_ocr"]

D_MODEL = 30
N_HEADS = 2
D_HEAD = D_MODEL // N_HEADS
HEIGHT = 8


@dataclass(frozen=True)
class PaddleOcr:
    """The exported model, what its attention block must be read as, and a batch-2 feed."""

    model: onnx.ModelProto
    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    feed: dict[str, np.ndarray]


class _Paddle:
    """Nodes named as paddle2onnx names them; every constant a ``Constant`` node."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def const(self, value: object, dtype: type = np.float32) -> str:
        self.count += 1
        name = f"p2o.helper.constant.{self.count}"
        array = numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        self.nodes.append(helper.make_node("Constant", [], [name], value=array))
        return name

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        self.count += 1
        out = f"{op_type.lower()}_{self.count}.tmp_0"
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), [out], name=f"p2o.{op_type}.{self.count}", **attrs
            )
        )
        return out

    def layer_norm(self, x: str, rng: np.random.Generator) -> str:
        """Paddle's layer_norm as paddle2onnx decomposes it below opset 17 (over the last axis)."""
        mean = self.op("ReduceMean", x, axes=[-1], keepdims=1)
        centred = self.op("Sub", x, mean)
        variance = self.op("ReduceMean", self.op("Pow", centred, self.const(2.0)), axes=[-1])
        std = self.op("Sqrt", self.op("Add", variance, self.const(1e-6)))
        gamma = (1 + 0.1 * rng.standard_normal(D_MODEL)).astype(np.float32)
        scaled = self.op("Mul", self.op("Div", centred, std), self.const(gamma))
        return self.op("Add", scaled, self.const(0.1 * rng.standard_normal(D_MODEL)))


def _matrix(rng: np.random.Generator, n_in: int, n_out: int) -> np.ndarray:
    return (rng.standard_normal((n_in, n_out)) * n_in**-0.5).astype(np.float32)


def paddle_ocr(opset: int, seed: int = 0) -> PaddleOcr:
    """The recogniser at default-domain ``opset``: its Softmax axis spelled 3 below opset 13 (the
    last axis of the (B, heads, T, T) scores, which the 2-D coercion of those opsets keeps), -1
    from 13 on."""
    rng = np.random.default_rng(seed)
    g = _Paddle()
    kernel = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    conv = g.op("Conv", "x", g.const(0.3 * rng.standard_normal((D_MODEL, 3, 3, 3))), **kernel)
    conv = g.op("Relu", conv)
    conv = g.op(
        "Conv", conv, g.const(0.1 * rng.standard_normal((D_MODEL, D_MODEL, 3, 3))), **kernel
    )
    pooled = g.op("AveragePool", conv, kernel_shape=[2, 2], strides=[2, 2])
    flat = g.op("Reshape", pooled, g.const([0, 0, -1], np.int64))
    tokens = g.op("Transpose", flat, perm=[0, 2, 1])  # (B, W / 8, D)
    W_qkv = _matrix(rng, D_MODEL, 3 * D_MODEL)
    qkv = g.op("MatMul", g.layer_norm(tokens, rng), g.const(W_qkv))
    heads = g.op("Reshape", qkv, g.const([0, -1, 3, N_HEADS, D_HEAD], np.int64))
    parts = g.op("Transpose", heads, perm=[2, 0, 3, 1, 4])
    q, k, v = (g.op("Gather", parts, g.const(i, np.int64), axis=0) for i in range(3))
    scores = g.op(
        "MatMul", g.op("Mul", q, g.const(D_HEAD**-0.5)), g.op("Transpose", k, perm=[0, 1, 3, 2])
    )
    probs = g.op("Softmax", scores, axis=3 if opset < 13 else -1)
    mixed = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    merged = g.op("Reshape", mixed, g.const([0, -1, D_MODEL], np.int64))
    W_O = _matrix(rng, D_MODEL, D_MODEL)
    projected = g.op("Add", g.op("MatMul", merged, g.const(W_O)), g.const(np.zeros(D_MODEL)))
    out = g.op("Add", tokens, projected)
    image = ["p2o.DynamicDimension.0", 3, HEIGHT, "p2o.DynamicDimension.1"]
    graph = helper.make_graph(
        g.nodes,
        "paddle-infer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, image)],
        [
            helper.make_tensor_value_info(
                out, TensorProto.FLOAT, ["p2o.DynamicDimension.0", "t", D_MODEL]
            )
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="PaddlePaddle"
    )
    model.ir_version = 7 if opset < 14 else 8
    onnx.checker.check_model(model)
    W = W_qkv.astype(np.float64)
    return PaddleOcr(
        model=model,
        W_Q=W[:, :D_MODEL],
        W_K=W[:, D_MODEL : 2 * D_MODEL],
        W_V=W[:, 2 * D_MODEL :],
        W_O=W_O.astype(np.float64),
        feed={"x": rng.standard_normal((2, 3, HEIGHT, 48)).astype(np.float32)},
    )
