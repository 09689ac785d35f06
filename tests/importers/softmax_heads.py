"""Softmaxes that are not token attention, added to a builder encoder after its last block.

Each function takes a model whose graph output ``last_hidden_state`` is the (batch, T, d_model)
stream (a builder variant from :mod:`tests.importers.builders`, e.g. ``bert_legacy``), adds a head
reading it, and returns the model; every new node is named ``<head>/<op><n>`` and every Softmax's
scores escape the classifier rule (a product with a constant found walking back), so before the
rule on a Softmax's uses each of them was taken for unmatched attention:

- :func:`with_pooling_head`: attention pooling with a learned query broadcast to the batch
  (``Expand``), ``Softmax(q Xᵀ / √d)`` of shape (batch, 1, T), summed away as ``Mul`` +
  ``ReduceSum`` over the tokens (output ``pooled``);
- :func:`with_probabilities_head`: class probabilities of the token-averaged logits
  (``Softmax(ReduceMean(X W + b))``), returned as the graph output ``probabilities``;
- :func:`with_gating_head`: ``X ⊙ Softmax(tanh(X W + b))`` over the features, a Softmax gating
  the stream (output ``gated``);
- :func:`with_attention_outputs`: every Softmax's probabilities also returned as a graph output
  (``attentions.<i>``), as ``output_attentions=True`` exports return them.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "STREAM",
    "with_attention_outputs",
    "with_gating_head",
    "with_pooling_head",
    "with_probabilities_head",
]

#: The builder's last stream, which every head reads.
STREAM = "last_hidden_state"
N_CLASSES = 3


class _Head:
    """Nodes and constants of one head, named ``<name>/...``, appended to a model's graph."""

    def __init__(self, model: onnx.ModelProto, name: str, seed: int) -> None:
        self.model, self.name, self.count = model, name, 0
        self.rng = np.random.default_rng(seed)
        self.width = _stream_width(model)

    def _fresh(self, stem: str) -> str:
        self.count += 1
        return f"{self.name}/{stem}{self.count}"

    def const(self, value: object, dtype: type = np.float32) -> str:
        name = self._fresh("const")
        array = np.asarray(value, dtype=dtype)
        self.model.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, *shape: int) -> str:
        return self.const(self.rng.normal(size=shape) / np.sqrt(shape[0]))

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        name = self._fresh(op_type)
        self.model.graph.node.append(
            helper.make_node(op_type, list(inputs), [name], name=name, **attrs)
        )
        return name

    def output(self, tensor: str, name: str, shape: list[object] | None) -> None:
        """Expose ``tensor`` as the graph output ``name`` (an Identity renames it)."""
        self.model.graph.node.append(
            helper.make_node("Identity", [tensor], [name], name=f"{self.name}/output")
        )
        self.model.graph.output.append(
            helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
        )


def _stream_width(model: onnx.ModelProto) -> int:
    (stream,) = (value for value in model.graph.output if value.name == STREAM)
    return int(stream.type.tensor_type.shape.dim[-1].dim_value)


def with_pooling_head(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Attention pooling with a learned query: ``pooled = Σ_t softmax(q Xᵀ / √d)_t x_t``."""
    h = _Head(model, "pool", seed)
    d = h.width
    batch = h.op("Slice", h.op("Shape", STREAM), h.const([0], np.int64), h.const([1], np.int64))
    query = h.op(
        "Expand",
        h.weight(1, 1, d),
        h.op("Concat", batch, h.const([1, d], np.int64), axis=0),
    )
    scores = h.op("MatMul", query, h.op("Transpose", STREAM, perm=[0, 2, 1]))
    weights = h.op("Softmax", h.op("Mul", scores, h.const(d**-0.5)), axis=-1)
    weighted = h.op("Mul", h.op("Transpose", weights, perm=[0, 2, 1]), STREAM)
    pooled = h.op("ReduceSum", weighted, h.const([1], np.int64), keepdims=0)
    h.output(pooled, "pooled", ["batch", d])
    return model


def with_probabilities_head(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Class probabilities of the token-averaged logits, a graph output."""
    h = _Head(model, "classify", seed)
    logits = h.op("Add", h.op("MatMul", STREAM, h.weight(h.width, N_CLASSES)), h.weight(N_CLASSES))
    averaged = h.op("ReduceMean", logits, axes=[1], keepdims=0)  # the attribute up to opset 17
    h.output(h.op("Softmax", averaged, axis=-1), "probabilities", ["batch", N_CLASSES])
    return model


def with_gating_head(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """The stream gated by a Softmax over its features: ``X ⊙ softmax(tanh(X W + b))``."""
    h = _Head(model, "gate", seed)
    d = h.width
    scores = h.op("Tanh", h.op("Add", h.op("MatMul", STREAM, h.weight(d, d)), h.weight(d)))
    gated = h.op("Mul", STREAM, h.op("Softmax", scores, axis=-1))
    h.output(gated, "gated", ["batch", None, d])
    return model


def with_attention_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every Softmax's probabilities also a graph output ``attentions.<i>`` (renamed in place,
    as an exporter names them, so the A·V product reads the output tensor itself)."""
    softmaxes = [node for node in model.graph.node if node.op_type == "Softmax"]
    for i, softmax in enumerate(softmaxes):
        old, new = softmax.output[0], f"attentions.{i}"
        for node in model.graph.node:
            node.input[:] = [new if name == old else name for name in node.input]
        softmax.output[0] = new
        dims = ["batch", "heads", "queries", "keys"]
        model.graph.output.append(helper.make_tensor_value_info(new, TensorProto.FLOAT, dims))
    return model
