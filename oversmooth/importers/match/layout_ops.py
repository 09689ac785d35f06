"""Layout ops replayed on a numeric probe (shared by the layout probe, :mod:`oversmooth.importers.match.layout`,
and the partial-rotary check, :mod:`oversmooth.importers.match.rotary`), through the op table's values
(:data:`oversmooth.importers.graph.ops.OPS`) and its evaluator."""

from __future__ import annotations

import numpy as np

from oversmooth.importers.graph import Node
from oversmooth.importers.graph.ops import OPS, fold


def apply_layout(node: Node, value: np.ndarray, values: list, output: int) -> np.ndarray:
    """Apply one layout op to the probe ``value`` (its other inputs already evaluated in
    ``values``, in input order; None where unknown)."""
    semantics = OPS.get(node.op_type)
    if semantics is None or semantics.layout is None or semantics.value is None:
        raise ValueError(f"{node.op_type} is not a layout op")
    if semantics.layout and (not values or values[0] is None):
        raise ValueError(f"the {semantics.layout} could not be evaluated")
    unknown = [
        name for name, known in zip(node.inputs[1:], values, strict=False) if name and known is None
    ]
    if unknown:  # a Slice's bounds or a Split's sizes: replaying without them would be wrong
        raise ValueError(f"the {node.op_type} operand {unknown[0]!r} could not be evaluated")
    result = fold(node, [value, *values], output)
    if result is None:
        raise ValueError(f"{node.op_type} of the probe would exceed the size limit")
    return result
