"""Layout ops applied to a numeric probe (shared by the layout probe,
:mod:`importers.match.layout`, and the partial-rotary check, :mod:`importers.match.projections`)."""

from __future__ import annotations

import numpy as np

from importers.graph import (
    Node,
    apply_slice,
    apply_split,
    flatten,
    gather_nd,
    reshape_target,
    unsqueeze,
)

#: Layout ops whose second operand must be evaluated to apply them, and what it is.
_EVALUATED_OPERAND = {
    "Reshape": "Reshape target shape",
    "Expand": "Expand target shape",
    "Tile": "Tile repeats",
    "Gather": "Gather indices",
    "GatherND": "GatherND indices",
}


def apply_layout(node: Node, value: np.ndarray, values: list, output: int) -> np.ndarray:
    """Apply one layout op to the probe (shape-like inputs already evaluated in ``values``)."""
    op = node.op_type
    if op in _EVALUATED_OPERAND and values[0] is None:
        raise ValueError(f"the {_EVALUATED_OPERAND[op]} could not be evaluated")
    if op == "Transpose":
        perm = node.attr("perm")
        return np.transpose(value, perm if perm is not None else None)
    if op == "Reshape":
        return value.reshape(
            reshape_target(value.shape, values[0], allowzero=bool(node.attr("allowzero", 0)))
        )
    if op == "Flatten":
        return flatten(value, int(node.attr("axis", 1)))
    if op in ("Squeeze", "Unsqueeze"):
        axes = values[0] if values and values[0] is not None else node.attr("axes")
        axes = None if axes is None else [int(axis) for axis in np.ravel(axes)]
        if op == "Unsqueeze":
            return unsqueeze(value, axes or [])
        return np.squeeze(value) if axes is None else np.squeeze(value, axis=tuple(axes))
    if op == "Expand":
        return np.broadcast_to(
            value, np.broadcast_shapes(value.shape, tuple(int(d) for d in np.ravel(values[0])))
        )
    if op == "Tile":
        return np.tile(value, [int(r) for r in np.ravel(values[0])])
    if op == "Split":
        return apply_split(node, value, values[0] if values else None, output)
    if op == "Slice":
        return apply_slice(value, *(values + [None] * (4 - len(values)))[:4])
    if op == "Gather":
        return np.take(value, values[0], axis=int(node.attr("axis", 0)))
    if op == "GatherND":
        return gather_nd(value, values[0], int(node.attr("batch_dims", 0)))
    raise ValueError(f"{op} is not a layout op")
