"""Key/value caches among a graph's inputs, found by structure (a language model as shipped).

A decoder exported for generation (optimum's ``text-generation-with-past``) takes the keys and
values of the tokens seen so far as graph inputs (``past_key_values.<layer>.key`` ...) and
concatenates each with the new keys or values along the sequence axis before the attention. Fed a
cache of length 0, that ``Concat`` is the identity on the new keys and the graph computes exactly
the model without a cache, which is what the audit measures: the caches are inputs, fed empty,
not structure.

A *cache input* is a float graph input of rank 3 or more whose view, through ops that only permute
its axes (``Identity``, ``Cast``, ``Transpose``) or take one constant index of another axis
(``Gather``: the keys or values of onnxruntime's packed (2, B, N, P, H) ``past``), is an operand of a ``Concat`` along an axis the
input leaves open (a symbolic or unknown size: the past length), while another operand of that
``Concat`` is computed from the graph (not a constant, not another such input). Names are never
used.

Public API
----------
cache_inputs
    ``{graph input name: its past axis}`` of every cache input.
cache_view
    The cache input a tensor is a view of and the input's axis that one of the tensor's axes is.
"""

from __future__ import annotations

import numpy as np
import onnx

from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.node import Node

__all__ = ["cache_inputs", "cache_view"]

#: Ops through which a cache input reaches its ``Concat`` with its axes at most permuted (or one
#: of them indexed by a constant: the keys or values of a packed cache).
_VIEW_OPS = frozenset({"Identity", "Cast", "Transpose", "Gather"})
#: Views followed back from a ``Concat`` operand (an export has one or two).
_MAX_VIEW_STEPS = 8


def cache_view(index: GraphIndex, name: str, axis: int) -> tuple[str, int] | None:
    """``(graph input, its axis)`` when ``name`` is a view of a float graph input through
    ``Identity``/``Cast``/``Transpose`` and ``Gather`` s of one constant index (a packed
    (2, B, N, P, H) cache's keys or values), ``axis`` of ``name`` being that axis of the input;
    else None (also for an initializer, or an axis outside the input's rank)."""
    steps: list[tuple[str, object]] = []  # nearest the Concat first
    for _ in range(_MAX_VIEW_STEPS):
        if name in index.graph_inputs:
            break
        node = index.producer(name)
        if node is None or node.op_type not in _VIEW_OPS or not node.input(0):
            return None
        step = _view_step(index, node)
        if step is None:
            return None
        steps.append(step)
        name = node.input(0)
    else:
        return None
    value_type = index.graph_inputs[name].type
    if name in index.initializers or not value_type.HasField("tensor_type"):
        return None
    tensor = value_type.tensor_type
    if not tensor.HasField("shape") or not _is_float(tensor.elem_type):
        return None
    rank = len(tensor.shape.dim) - sum(kind == "Gather" for kind, _ in steps)
    if rank < 3 or not -rank <= axis < rank:
        return None
    axis %= rank
    for kind, value in steps:
        if kind == "Identity":
            continue
        if kind == "Gather":
            assert isinstance(value, int)
            rank += 1
            axis += int(axis >= value % rank)
            continue
        order = list(range(rank))[::-1] if value is None else value
        if not isinstance(order, list) or sorted(order) != list(range(rank)):
            return None
        axis = order[axis]
    return name, axis


def _view_step(index: GraphIndex, node: Node) -> tuple[str, object] | None:
    """``("Transpose", perm or None)``, ``("Gather", axis)`` for one constant index, or
    ``("Identity", None)``; None for a step that is no view (a malformed perm, indices that are
    not one constant)."""
    if node.op_type == "Transpose":
        perm = node.attr("perm")
        if perm is not None and not (
            isinstance(perm, list) and all(isinstance(p, int) for p in perm)
        ):
            return None
        return "Transpose", perm
    if node.op_type == "Gather":
        indices = index.constant_value(node.input(1)) if node.input(1) else None
        axis = node.attr("axis", 0)
        if indices is None or indices.ndim != 0 or not isinstance(axis, int):
            return None
        return "Gather", axis
    return "Identity", None


def _is_float(elem_type: int) -> bool:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).kind == "f"
    except (KeyError, TypeError, ValueError):
        return False


def _open_axis(index: GraphIndex, name: str, axis: int) -> bool:
    """Whether the graph input's size along ``axis`` is left open (symbolic or unknown)."""
    dim = index.graph_inputs[name].type.tensor_type.shape.dim[axis]
    return not dim.HasField("dim_value")


def cache_inputs(index: GraphIndex) -> dict[str, int]:
    """``{graph input: past axis}`` for every key/value cache input of the graph (see the module).

    An input concatenated along two different axes of its own is not a cache (dropped).
    """
    found: dict[str, int] = {}
    conflicting: set[str] = set()
    for node in index.nodes_of_type("Concat"):
        operands = [name for name in node.inputs if name]
        axis = node.attr("axis")
        if len(operands) < 2 or not isinstance(axis, int):
            continue
        views = [cache_view(index, operand, axis) for operand in operands]
        caches = [view for view in views if view is not None and _open_axis(index, *view)]
        computed = [
            operand
            for operand, view in zip(operands, views, strict=True)
            if view is None and not index.is_constant(operand) and operand not in index.graph_inputs
        ]
        if not caches or not computed:
            continue
        for name, past_axis in caches:
            if found.setdefault(name, past_axis) != past_axis:
                conflicting.add(name)
    return {name: axis for name, axis in found.items() if name not in conflicting}
