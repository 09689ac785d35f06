"""A minimal ONNX graph writer for hand-built one-block test graphs (constants and nodes)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

__all__ = ["SmallGraph"]


class SmallGraph:
    """Collects nodes and initializers; every tensor gets a fresh name."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def const(self, value: object, dtype: type = np.float32) -> str:
        """An initializer holding ``value``; returns its name."""
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs: object) -> str:
        """A node of ``op_type`` reading ``inputs``; returns its single output's name."""
        self.count += 1
        name = f"{op_type.lower()}{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attrs))
        return name

    def attend(self, scores: str, v: str, w_o: np.ndarray, d_model: int) -> str:
        """``x + merge(Softmax(scores) v) W_O`` for (batch, heads, T, d_head) operands."""
        mixed = self.op(
            "Transpose",
            self.op("MatMul", self.op("Softmax", scores, axis=-1), v),
            perm=[0, 2, 1, 3],
        )
        merged = self.op("Reshape", mixed, self.const([0, 0, d_model], np.int64))
        return self.op("Add", "x", self.op("MatMul", merged, self.const(w_o)))

    def model(self, out: str, d_model: int, *, opsets=(("", 17),), inputs=(), ir_version=None):
        """The graph with input ``x`` (batch, sequence, d_model), extra ``inputs`` and output ``out``."""
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", d_model])
        graph = helper.make_graph(
            self.nodes,
            "small",
            [x, *inputs],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
            self.inits,
        )
        extra = {} if ir_version is None else {"ir_version": ir_version}
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], **extra
        )
