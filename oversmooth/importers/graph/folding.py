"""ONNX array semantics on NumPy arrays: each op's exact value, keeping the graph's dtype.

The functions here are the values of the op table (:data:`oversmooth.importers.graph.ops.OPS`), which
constant folding, shape arithmetic and the layout probe all read; a function reproduces its op
exactly in NumPy, keeping the graph's dtype (so a folded float32 product equals what the runtime
computes).

Public API
----------
fold_*, onnx_divide, binary_fold
    ``(node, input values) -> output value`` per op.
reshape_target, unsqueeze, flatten, apply_slice, apply_split, split_sizes, gather_nd
    ONNX Reshape, Unsqueeze, Flatten, Slice, Split and GatherND semantics on NumPy arrays.
node_axes
    An op's axes, from its input or its attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from oversmooth.importers.graph.node import Node

__all__ = [
    "apply_slice",
    "apply_split",
    "binary_fold",
    "flatten",
    "fold_cast",
    "fold_concat",
    "fold_constant",
    "fold_constant_of_shape",
    "fold_dequantize",
    "fold_flatten",
    "fold_gather",
    "fold_gather_nd",
    "fold_quantize",
    "fold_range",
    "fold_reshape",
    "fold_squeeze",
    "fold_transpose",
    "fold_unsqueeze",
    "gather_nd",
    "node_axes",
    "onnx_divide",
    "reshape_target",
    "split_sizes",
    "unsqueeze",
]


def fold_constant(node: Node, _values: list) -> np.ndarray | None:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        value = node.attr(key)
        if value is not None:
            if key.endswith("float") or key.endswith("floats"):
                return np.asarray(value, dtype=np.float32)
            if key.endswith("int") or key.endswith("ints"):
                return np.asarray(value, dtype=np.int64)
            return np.asarray(value)
    return None


def fold_cast(node: Node, values: list) -> np.ndarray:
    dtype = onnx.helper.tensor_dtype_to_np_dtype(node.attr("to"))
    return values[0].astype(dtype)


def fold_transpose(node: Node, values: list) -> np.ndarray:
    perm = node.attr("perm")
    return np.transpose(values[0], perm)


def fold_reshape(node: Node, values: list) -> np.ndarray:
    target = reshape_target(values[0].shape, values[1], allowzero=bool(node.attr("allowzero", 0)))
    return values[0].reshape(target)  # the shape rule's own arithmetic: one Reshape semantics


def node_axes(node: Node, values: list, position: int) -> list[int] | None:
    if len(values) > position and values[position] is not None:
        return [int(axis) for axis in np.ravel(values[position])]
    axes = node.attr("axes")
    return None if axes is None else [int(axis) for axis in axes]


def fold_unsqueeze(node: Node, values: list) -> np.ndarray:
    return unsqueeze(values[0], node_axes(node, values, 1) or [])


def fold_squeeze(node: Node, values: list) -> np.ndarray:
    axes = node_axes(node, values, 1)
    return np.squeeze(values[0]) if axes is None else np.squeeze(values[0], axis=tuple(axes))


def fold_flatten(node: Node, values: list) -> np.ndarray:
    return flatten(values[0], int(node.attr("axis", 1)))


def fold_concat(node: Node, values: list) -> np.ndarray:
    return np.concatenate(values, axis=int(node.attr("axis")))


def fold_gather(node: Node, values: list) -> np.ndarray:
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


def fold_gather_nd(node: Node, values: list) -> np.ndarray:
    return gather_nd(values[0], values[1], int(node.attr("batch_dims", 0)))


def binary_fold(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
    def fold(_node: Node, values: list) -> np.ndarray:
        return np.asarray(function(values[0], values[1]))

    return fold


def onnx_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):
        return np.trunc(np.divide(a, b)).astype(np.result_type(a, b))
    return np.divide(a, b)


def _per_axis(node: Node, x: np.ndarray, *params: np.ndarray | None) -> list[np.ndarray | None]:
    """A (de)quantiser's scale and zero point shaped to broadcast over ``x``: a 1-D parameter of
    more than one element lies along ``axis`` (default 1), a scalar or one-element one everywhere."""
    scale = params[0]
    if scale is None or not (scale.ndim == 1 and scale.size > 1):
        return list(params)
    shape = [1] * x.ndim
    shape[int(node.attr("axis", 1)) % x.ndim] = scale.size
    return [None if value is None else value.reshape(shape) for value in params]


def fold_dequantize(node: Node, values: list) -> np.ndarray | None:
    """``DequantizeLinear``: ``(x − zero_point) · scale`` in the scale's dtype, per tensor or per
    axis (blocked quantisation is not folded)."""
    if node.attr("block_size", 0):
        return None
    x = values[0]
    zero_point = values[2] if len(values) > 2 and values[2] is not None else None
    scale, zero_point = _per_axis(node, x, values[1], zero_point)
    assert scale is not None  # a fold has every input value
    shifted = x.astype(np.int32)
    if zero_point is not None:
        shifted = shifted - zero_point.astype(np.int32)
    with np.errstate(over="ignore"):  # a mask's scale: ±inf, as the runtime's float32 gives
        return shifted.astype(scale.dtype) * scale


#: ``QuantizeLinear``'s integer output types by ONNX element type (``output_dtype``; without it
#: and without a zero point the output is uint8).
_QUANTISED_TYPES: dict[int, type] = {
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.INT16: np.int16,
}


def fold_quantize(node: Node, values: list) -> np.ndarray | None:
    """``QuantizeLinear``: ``saturate(round(x / scale) + zero_point)``, rounding half to even, per
    tensor or per axis, to the zero point's integer type (8 or 16 bits); None for blocked, 4-bit
    or float8 outputs, which are not folded.

    A float weight stored with a ``QuantizeLinear``→``DequantizeLinear`` pair (quantisation-aware
    training exports) folds through both to the rounded weight the model multiplies by.
    """
    if node.attr("block_size", 0):
        return None
    x = values[0]
    zero_point = values[2] if len(values) > 2 and values[2] is not None else None
    if zero_point is not None:
        dtype = zero_point.dtype.type
    else:
        dtype = _QUANTISED_TYPES.get(int(node.attr("output_dtype", onnx.TensorProto.UINT8)))
    if dtype not in _QUANTISED_TYPES.values() or not np.issubdtype(x.dtype, np.floating):
        return None
    scale, zero_point = _per_axis(node, x, values[1], zero_point)
    assert scale is not None  # a fold has every input value
    rounded = np.rint(x / scale.astype(x.dtype)).astype(np.float64)
    if zero_point is not None:
        rounded = rounded + zero_point.astype(np.float64)
    limits = np.iinfo(dtype)
    return np.clip(rounded, limits.min, limits.max).astype(dtype)


def fold_range(_node: Node, values: list) -> np.ndarray:
    start, limit, delta = (np.ravel(value)[0] for value in values)
    return np.arange(start, limit, delta)


def fold_constant_of_shape(node: Node, values: list) -> np.ndarray:
    return np.full(
        tuple(int(d) for d in np.ravel(values[0])),
        node.attr("value", np.zeros(1, np.float32)).ravel()[0],
    )


def reshape_target(
    shape: tuple[int, ...], target: np.ndarray, *, allowzero: bool
) -> tuple[int, ...]:
    """ONNX Reshape's output shape for an input of ``shape``, by arithmetic alone.

    A 0 in ``target`` copies the input's dimension at that position (opsets 5 to 13, and 14+
    without ``allowzero``); with ``allowzero`` it is a dimension of size 0. One -1 is inferred
    from the element count. The value rule (:func:`fold_reshape`, which the layout probe replays)
    and the shape rule (:mod:`oversmooth.importers.graph.shape_rules`) both use this, so they agree by
    construction; sizes are only numbers here (a 2^40-element input costs nothing).

    Raises
    ------
    ValueError
        What ONNX (and onnxruntime) refuse: a copying 0 past the input's rank, more than one -1, a
        dimension below -1, a -1 beside a zero-size dimension (nothing to infer it from), or a
        different element count.
    """
    dims = [int(value) for value in np.ravel(target)]
    if not allowzero:
        if any(dim == 0 for dim in dims[len(shape) :]):
            raise ValueError(f"Reshape target {dims} copies a dimension {shape} does not have")
        dims = [shape[i] if dim == 0 else dim for i, dim in enumerate(dims)]
    if dims.count(-1) > 1 or any(dim < -1 for dim in dims):
        raise ValueError(f"Reshape target {dims} is not a valid shape")
    total = math.prod(shape)
    if -1 in dims:
        known = math.prod(dim for dim in dims if dim != -1)
        if known == 0 or total % known:
            raise ValueError(f"Reshape of {shape} to {dims}: sizes do not divide")
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != total:
        raise ValueError(f"Reshape of {shape} to {dims} changes the element count")
    return tuple(dims)


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


def split_sizes(node: Node, length: int, sizes: np.ndarray | None) -> list[int]:
    """The lengths of a Split's outputs along its axis of ``length`` (``sizes``, the ``split``
    attribute, or ``num_outputs`` equal parts, the last one shorter)."""
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
    bounds = np.cumsum([0, *split_sizes(node, data.shape[axis], sizes)])
    index = [slice(None)] * data.ndim
    index[axis] = slice(int(bounds[output]), int(bounds[output + 1]))
    return data[tuple(index)]
