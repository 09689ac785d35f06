"""Constant folding of weight chains and the ONNX array semantics shared with shape inference.

:data:`FOLDERS` maps an op type to a function ``(node, input values) -> output value`` that reproduces
the op exactly in NumPy, keeping the graph's dtype (so a folded float32 product equals what the runtime
computes). :class:`~importers.graph.index.GraphIndex` uses them to read weights that are stored as a
chain (int8 Cast→Mul dequantisation, DequantizeLinear, Transpose, Reshape of constants);
:class:`~importers.graph.shapes.ShapeContext` reuses them for shape arithmetic.

Public API
----------
FOLDERS
    Op type → fold function.
reshape_target, unsqueeze, flatten, apply_slice, apply_split
    ONNX Reshape, Unsqueeze, Flatten, Slice and Split semantics on NumPy arrays.
node_axes, fold_squeeze, binary_fold
    Helpers the shape rules share.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from importers.graph.node import Node

__all__ = [
    "FOLDERS",
    "apply_slice",
    "apply_split",
    "binary_fold",
    "flatten",
    "fold_squeeze",
    "node_axes",
    "reshape_target",
    "unsqueeze",
]


def _fold_constant(node: Node, _values: list) -> np.ndarray | None:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        value = node.attr(key)
        if value is not None:
            if key.endswith("float") or key.endswith("floats"):
                return np.asarray(value, dtype=np.float32)
            if key.endswith("int") or key.endswith("ints"):
                return np.asarray(value, dtype=np.int64)
            return np.asarray(value)
    return None


def _fold_cast(node: Node, values: list) -> np.ndarray:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(node.attr("to"))
    return values[0].astype(dtype)


def _fold_transpose(node: Node, values: list) -> np.ndarray:
    perm = node.attr("perm")
    return np.transpose(values[0], perm)


def _fold_reshape(node: Node, values: list) -> np.ndarray:
    target = reshape_target(values[0].shape, values[1], allowzero=bool(node.attr("allowzero", 0)))
    return values[0].reshape(target)


def node_axes(node: Node, values: list, position: int) -> list[int] | None:
    if len(values) > position and values[position] is not None:
        return [int(axis) for axis in np.ravel(values[position])]
    axes = node.attr("axes")
    return None if axes is None else [int(axis) for axis in axes]


def _fold_unsqueeze(node: Node, values: list) -> np.ndarray:
    return unsqueeze(values[0], node_axes(node, values, 1) or [])


def fold_squeeze(node: Node, values: list) -> np.ndarray:
    axes = node_axes(node, values, 1)
    return np.squeeze(values[0]) if axes is None else np.squeeze(values[0], axis=tuple(axes))


def _fold_flatten(node: Node, values: list) -> np.ndarray:
    return flatten(values[0], int(node.attr("axis", 1)))


def _fold_concat(node: Node, values: list) -> np.ndarray:
    return np.concatenate(values, axis=int(node.attr("axis")))


def _fold_gather(node: Node, values: list) -> np.ndarray:
    return np.take(values[0], values[1], axis=int(node.attr("axis", 0)))


def gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int = 0) -> np.ndarray:
    """ONNX GatherND.

    With ``b = batch_dims`` leading batch axes shared by ``data`` (rank r) and ``indices`` (rank q),
    each index tuple ``indices[..., :]`` of length ``k <= r - b`` picks a slice of ``data``; the
    result has shape ``indices.shape[:-1] + data.shape[b + k:]``. Negative indices count from the
    end, as in NumPy.
    """
    indices = np.asarray(indices, dtype=np.int64)
    batch = data.shape[:batch_dims]
    if indices.shape[:batch_dims] != batch or indices.shape[-1] > data.ndim - batch_dims:
        raise ValueError(f"GatherND indices {indices.shape} do not fit data {data.shape}")
    depth = indices.shape[-1]
    flat_data = data.reshape(-1, *data.shape[batch_dims:])
    flat_indices = indices.reshape(len(flat_data), -1, depth)
    picked = [
        block[tuple(np.moveaxis(rows, -1, 0))]
        for block, rows in zip(flat_data, flat_indices, strict=True)
    ]
    return np.stack(picked).reshape(*indices.shape[:-1], *data.shape[batch_dims + depth :])


def _fold_gather_nd(node: Node, values: list) -> np.ndarray:
    return gather_nd(values[0], values[1], int(node.attr("batch_dims", 0)))


def binary_fold(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def fold(_node: Node, values: list) -> np.ndarray:
        return np.asarray(function(values[0], values[1]))

    return fold


def _onnx_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(np.divide(a, b)).astype(np.result_type(a, b))
    return np.divide(a, b)


def _fold_dequantize(node: Node, values: list) -> np.ndarray | None:
    if node.attr("block_size", 0):
        return None
    x, scale = values[0], values[1]
    zero_point = values[2] if len(values) > 2 and values[2] is not None else None
    if scale.ndim == 1 and scale.size > 1:
        axis = int(node.attr("axis", 1)) % x.ndim
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale = scale.reshape(shape)
        zero_point = None if zero_point is None else zero_point.reshape(shape)
    shifted = x.astype(np.int32)
    if zero_point is not None:
        shifted = shifted - zero_point.astype(np.int32)
    return shifted.astype(scale.dtype) * scale


FOLDERS: dict[str, Callable[[Node, list], np.ndarray | None]] = {
    "Constant": _fold_constant,
    "Identity": lambda _node, values: values[0],
    "Cast": _fold_cast,
    "Transpose": _fold_transpose,
    "Reshape": _fold_reshape,
    "Unsqueeze": _fold_unsqueeze,
    "Squeeze": fold_squeeze,
    "Flatten": _fold_flatten,
    "Concat": _fold_concat,
    "Gather": _fold_gather,
    "GatherND": _fold_gather_nd,
    "Neg": lambda _node, values: np.negative(values[0]),
    "Sqrt": lambda _node, values: np.sqrt(values[0]),
    "Reciprocal": lambda _node, values: np.reciprocal(values[0]),
    "Add": binary_fold(np.add),
    "Sub": binary_fold(np.subtract),
    "Mul": binary_fold(np.multiply),
    "Div": binary_fold(_onnx_divide),
    "DequantizeLinear": _fold_dequantize,
}


def reshape_target(shape: tuple[int, ...], target: np.ndarray, *, allowzero: bool) -> list[int]:
    """ONNX Reshape semantics: 0 copies the input dimension (unless ``allowzero``), -1 is inferred."""
    dims = [int(value) for value in np.ravel(target)]
    if not allowzero:
        dims = [
            shape[i] if value == 0 and i < len(shape) else value for i, value in enumerate(dims)
        ]
    return dims


def unsqueeze(array: np.ndarray, axes: list[int]) -> np.ndarray:
    """ONNX Unsqueeze: ``axes`` refer to the output rank."""
    rank = array.ndim + len(axes)
    for axis in sorted(axis % rank for axis in axes):
        array = np.expand_dims(array, axis)
    return array


def flatten(array: np.ndarray, axis: int) -> np.ndarray:
    """ONNX Flatten to 2-D around ``axis``."""
    if axis < 0:
        axis += array.ndim
    return array.reshape(math.prod(array.shape[:axis]), -1)


def apply_slice(data: np.ndarray, starts, ends, axes=None, steps=None) -> np.ndarray:
    """ONNX Slice on ``data`` (starts/ends clamped as in NumPy)."""
    if starts is None or ends is None:
        raise ValueError("slice bounds unknown")
    starts, ends = np.ravel(starts), np.ravel(ends)
    axes = range(len(starts)) if axes is None else np.ravel(axes)
    steps = np.ones(len(starts), dtype=np.int64) if steps is None else np.ravel(steps)
    index = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        index[int(axis) % data.ndim] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


def _split_sizes(node: Node, length: int, sizes: np.ndarray | None) -> list[int]:
    if sizes is None:
        sizes = node.attr("split")
    if sizes is not None:
        return [int(size) for size in np.ravel(sizes)]
    parts = int(node.attr("num_outputs", len(node.outputs)))
    chunk = -(-length // parts)
    return [min(chunk, length - i * chunk) for i in range(parts)]


def apply_split(node: Node, data: np.ndarray, sizes: np.ndarray | None, output: int) -> np.ndarray:
    """Output ``output`` of an ONNX Split of ``data``."""
    axis = int(node.attr("axis", 0)) % data.ndim
    bounds = np.cumsum([0, *_split_sizes(node, data.shape[axis], sizes)])
    index = [slice(None)] * data.ndim
    index[axis] = slice(int(bounds[output]), int(bounds[output + 1]))
    return data[tuple(index)]
