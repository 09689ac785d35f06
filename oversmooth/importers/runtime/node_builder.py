"""ONNX nodes appended to a model's graph under fresh names, spelled for the graph's opset.

The in-graph reductions (:mod:`oversmooth.importers.runtime.reductions`) build their nodes with
it; any extension of a graph that runs as shipped (opsets 7 and up) can.

Public API
----------
NodeBuilder
    Appends nodes and constants with unique names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.errors import ImporterInputError

__all__ = ["NodeBuilder"]


class NodeBuilder:
    """Appends nodes with unique names under ``namespace``; spells ops for the opset.

    Parameters
    ----------
    opset : int
        The default-domain opset of the graph the nodes join (axes as inputs from opset 18 for
        every reduction, from 13 for ReduceSum and Unsqueeze; Slice bounds as inputs from 10;
        ConstantOfShape from 9).
    taken : set of str
        Tensor names the graph already has: a fresh or output name among them is refused.
    namespace : str
        Prefix of every name made here.

    Attributes
    ----------
    nodes : list of NodeProto
        The nodes appended, in order.
    initializers : dict of str to TensorProto
        The constants they read, one per distinct value.
    """

    def __init__(self, opset: int, taken: set[str], namespace: str) -> None:
        self.opset = opset
        self.taken = taken
        self.namespace = namespace
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, onnx.TensorProto] = {}
        self._count = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        name = f"{self.namespace}.{hint}.{self._count}"
        if name in self.taken:
            raise ImporterInputError(f"the model already has a tensor named {name!r}")
        return name

    def const(
        self, values: Sequence[float] | Sequence[int] | float | np.ndarray, dtype: type
    ) -> str:
        array: np.ndarray = np.asarray(values, dtype=dtype)
        name = (
            f"{self.namespace}.const.{array.dtype}.{'_'.join(map(str, array.ravel())) or 'empty'}"
        )
        name += f".{array.ndim}d"
        if name not in self.initializers:
            if name in self.taken:
                raise ImporterInputError(f"the model already has a tensor named {name!r}")
            self.initializers[name] = numpy_helper.from_array(array, name)
        return name

    def op(self, op_type: str, inputs: Sequence[str], hint: str, **attributes: Any) -> str:
        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attributes))
        return out

    def output(self, op_type: str, inputs: Sequence[str], name: str, **attributes: Any) -> str:
        if name in self.taken:
            raise ImporterInputError(f"the model already has a tensor named {name!r}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attributes))
        return name

    def reduce(
        self, op_type: str, x: str, axes: Sequence[int], hint: str, keepdims: int = 0
    ) -> str:
        """``op_type`` over ``axes``: axes as an input where the opset has it, else an attribute."""
        axes_as_input = self.opset >= 18 or (op_type == "ReduceSum" and self.opset >= 13)
        if axes_as_input:
            return self.op(op_type, [x, self.const(list(axes), np.int64)], hint, keepdims=keepdims)
        return self.op(op_type, [x], hint, axes=list(axes), keepdims=keepdims)

    def unsqueeze(self, x: str, axis: int, hint: str) -> str:
        if self.opset < 13:
            return self.op("Unsqueeze", [x], hint, axes=[axis])
        return self.op("Unsqueeze", [x, self.const([axis], np.int64)], hint)

    def slice(self, x: str, start: int, end: int, axis: int, hint: str) -> str:
        """``x[start:end]`` along ``axis``: bounds as inputs from opset 10, attributes before."""
        if self.opset < 10:
            return self.op("Slice", [x], hint, starts=[start], ends=[end], axes=[axis])
        bounds = [self.const([value], np.int64) for value in (start, end, axis)]
        return self.op("Slice", [x, *bounds], hint)

    def ones_like_lead(self, x: str, hint: str) -> str:
        """(B, T) double ones for ``x`` (B, T, ...): ConstantOfShape, or a Tile before opset 9."""
        batch_tokens = self.slice(self.op("Shape", [x], "shape"), 0, 2, 0, "batch_tokens")
        if self.opset < 9:
            return self.op("Tile", [self.const(np.ones((1, 1)), np.float64), batch_tokens], hint)
        ones = helper.make_tensor("value", TensorProto.DOUBLE, [1], [1.0])
        return self.op("ConstantOfShape", [batch_tokens], hint, value=ones)
