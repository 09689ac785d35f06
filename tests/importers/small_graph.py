"""A minimal ONNX graph writer for hand-built one-block test graphs (constants and nodes)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

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
