"""One ONNX graph node with its position, for navigation and error messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import numpy_helper

__all__ = ["DEFAULT_DOMAINS", "Node"]

#: Spellings of the default ONNX operator domain.
DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True, eq=False)
class Node:
    """One graph node with its position, for navigation and reporting.

    ``label`` is the node's name, or ``"<op_type>#<position>"`` when it has none. ``opset`` is the
    default ONNX domain's version its model imports, the version its op's ONNX meaning is read at
    (:func:`oversmooth.importers.graph.ops.fold`); None: the newest ``onnx`` knows.
    """

    position: int
    proto: onnx.NodeProto = field(repr=False)
    opset: int | None = None

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def domain(self) -> str:
        return self.proto.domain

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)

    @property
    def label(self) -> str:
        return self.proto.name or f"{self.proto.op_type}#{self.position}"

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's Python value (ints, floats, lists, tensors as ndarrays), or ``default``."""
        for attribute in self.proto.attribute:
            if attribute.name == name:
                value = onnx.helper.get_attribute_value(attribute)
                if isinstance(value, onnx.TensorProto):
                    if value.data_location == onnx.TensorProto.EXTERNAL:
                        # numpy_helper would resolve it against the current directory; only
                        # GraphIndex.read_tensor may read external data (inside the model folder).
                        return default
                    return numpy_helper.to_array(value)
                return value
        return default

    def tensor_attr(self, name: str) -> onnx.TensorProto | None:
        """The raw ``TensorProto`` of a tensor attribute (None when absent or not a tensor)."""
        for attribute in self.proto.attribute:
            if attribute.name == name and attribute.HasField("t"):
                return attribute.t
        return None

    def input(self, position: int) -> str:
        """The name of input ``position`` ("" when absent or optional-and-omitted)."""
        return self.proto.input[position] if position < len(self.proto.input) else ""
