"""Output shapes of ONNX ops from their input shapes, by arithmetic alone.

Every rule takes a :class:`ShapeLookup` (the shapes and small values of the node's inputs), the
node and the output position, and returns the output's shape as a tuple of ints, or None where it
cannot tell. No rule builds an array of the shapes it reasons about, so a graph that declares a
tensor of 2^40 elements costs nothing here: sizes are only numbers (:mod:`oversmooth.importers.graph.ops` puts
these rules beside each op's value semantics, and asks them an op's output size before it builds a
value; :class:`~oversmooth.importers.graph.shapes.ShapeContext` runs them). ONNX's Reshape, Slice and
Split arithmetic (:func:`reshape_target`, :func:`apply_slice`, :func:`split_sizes`) lives here too:
the Reshape value rule shares the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from oversmooth.importers.graph.node import Node

__all__ = [
    "SHAPE_RULES",
    "Shape",
    "ShapeLookup",
    "ShapeRule",
    "apply_slice",
    "broadcast_rule",
    "reshape_target",
    "same_shape_rule",
    "split_sizes",
]

Shape = tuple[int, ...]


class ShapeLookup(Protocol):
    """What a rule may ask about the node's inputs (an unknown answer is None)."""

    def need_shape(self, name: str) -> Shape | None:
        """The shape of tensor ``name``."""
        ...

    def need_value(self, name: str) -> np.ndarray | None:
        """The value of tensor ``name`` (small shape arithmetic only)."""
        ...


ShapeRule = Callable[[ShapeLookup, Node, int], Shape | None]


def _known(lookup: ShapeLookup, name: str) -> Shape:
    """The shape of ``name``, which the rule cannot do without (ValueError when unknown: the
    output's shape is then unknown too, rather than guessed by ONNX inference)."""
    shape = lookup.need_shape(name)
    if shape is None:
        raise ValueError(f"the shape of {name!r} is unknown")
    return shape


def _known_value(lookup: ShapeLookup, name: str) -> np.ndarray:
    """The value of ``name``, which the rule cannot do without (ValueError when unknown)."""
    value = lookup.need_value(name)
    if value is None:
        raise ValueError(f"the value of {name!r} is unknown")
    return value


def _ints(values: np.ndarray | Sequence[int]) -> list[int]:
    return [int(value) for value in np.ravel(values)]


def _axes(lookup: ShapeLookup, node: Node, position: int) -> list[int] | None:
    """Axes from input ``position`` (opset 13+) or the ``axes`` attribute; None when absent."""
    if node.input(position):
        value = lookup.need_value(node.input(position))
        if value is None:
            raise ValueError(f"{node.op_type} axes unknown")
        return _ints(value)
    axes = node.attr("axes")
    return None if axes is None else _ints(axes)


# -- ONNX's shape arithmetic, shared with the value rules ------------------------------------------
def reshape_target(
    shape: tuple[int, ...], target: np.ndarray, *, allowzero: bool
) -> tuple[int, ...]:
    """ONNX Reshape's output shape for an input of ``shape``, by arithmetic alone.

    A 0 in ``target`` copies the input's dimension at that position (opsets 5 to 13, and 14+
    without ``allowzero``); with ``allowzero`` it is a dimension of size 0. One -1 is inferred
    from the element count. The value rule (:mod:`oversmooth.importers.graph.ops`, which the layout
    probe replays) and the shape rule both use this, so they agree by construction; sizes are only
    numbers here (a 2^40-element input costs nothing).

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


# -- the rules -------------------------------------------------------------------------------------
def same_shape_rule(lookup: ShapeLookup, node: Node, output: int) -> Shape | None:
    """Output 0 has input 0's shape (elementwise ops, norms, casts); other outputs (a norm's mean
    and deviation) are not followed."""
    return lookup.need_shape(node.input(0)) if output == 0 else None


def broadcast_rule(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    """NumPy/ONNX multidirectional broadcasting of every input."""
    found = [lookup.need_shape(name) for name in node.inputs if name]
    shapes = [shape for shape in found if shape is not None]
    if len(shapes) < len(found):
        return None
    return tuple(np.broadcast_shapes(*shapes))


def _transpose(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    perm = node.attr("perm")
    order = list(reversed(range(len(data)))) if perm is None else _ints(perm)
    if sorted(order) != list(range(len(data))):
        raise ValueError(f"Transpose perm {order} does not fit rank {len(data)}")
    return tuple(data[axis] for axis in order)


def _reshape(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data, target = _known(lookup, node.input(0)), _known_value(lookup, node.input(1))
    return reshape_target(data, target, allowzero=bool(node.attr("allowzero", 0)))


def _flatten(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    axis = int(node.attr("axis", 1))
    axis = axis + len(data) if axis < 0 else axis
    return (math.prod(data[:axis]), math.prod(data[axis:]))


def _unsqueeze(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    axes = _axes(lookup, node, 1) or []
    rank = len(data) + len(axes)
    inserted = sorted(axis % rank for axis in axes)
    rest = iter(data)
    return tuple(1 if axis in inserted else next(rest) for axis in range(rank))


def _squeeze(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    axes = _axes(lookup, node, 1)
    if axes is None:
        return tuple(dim for dim in data if dim != 1)
    dropped = {axis % len(data) for axis in axes}
    if any(data[axis] != 1 for axis in dropped):
        raise ValueError(f"Squeeze of axes {sorted(dropped)} of {data}: not of length 1")
    return tuple(dim for axis, dim in enumerate(data) if axis not in dropped)


def _expand(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data, target = _known(lookup, node.input(0)), _known_value(lookup, node.input(1))
    return tuple(np.broadcast_shapes(data, tuple(_ints(target))))


def _tile(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data, repeats = _known(lookup, node.input(0)), _known_value(lookup, node.input(1))
    counts = _ints(repeats)
    if len(counts) != len(data):
        raise ValueError(f"Tile repeats {counts} do not fit rank {len(data)}")
    return tuple(dim * count for dim, count in zip(data, counts, strict=True))


def _gather(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data, indices = _known(lookup, node.input(0)), _known(lookup, node.input(1))
    axis = int(node.attr("axis", 0)) % len(data)
    return (*data[:axis], *indices, *data[axis + 1 :])


def _gather_nd(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    """``indices.shape[:-1] + data.shape[batch_dims + indices.shape[-1]:]``."""
    data, indices = _known(lookup, node.input(0)), _known(lookup, node.input(1))
    return (*indices[:-1], *data[int(node.attr("batch_dims", 0)) + indices[-1] :])


def _concat(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    shapes = [_known(lookup, name) for name in node.inputs if name]
    if not shapes:
        return None
    first = list(shapes[0])
    axis = int(node.attr("axis")) % len(first)
    first[axis] = sum(shape[axis] for shape in shapes)
    return tuple(first)


def _zero_strided(shape: Shape) -> np.ndarray:
    """An array of ``shape`` that holds one element (for rules that slice)."""
    return np.broadcast_to(np.zeros((), np.int8), shape)


def _slice(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    bounds = [lookup.need_value(name) if name else None for name in node.inputs[1:5]]
    return apply_slice(_zero_strided(data), *bounds).shape


def _split(lookup: ShapeLookup, node: Node, output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    sizes = lookup.need_value(node.input(1)) if node.input(1) else None
    axis = int(node.attr("axis", 0)) % len(data)
    parts = split_sizes(node, data[axis], sizes)
    return (*data[:axis], parts[output], *data[axis + 1 :])


def _reduce(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    axes = _axes(lookup, node, 1)
    keepdims = bool(node.attr("keepdims", 1))
    reduced = set(range(len(data))) if not axes else {axis % len(data) for axis in axes}
    if keepdims:
        return tuple(1 if axis in reduced else dim for axis, dim in enumerate(data))
    return tuple(dim for axis, dim in enumerate(data) if axis not in reduced)


def _matmul(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    a, b = _known(lookup, node.input(0)), _known(lookup, node.input(1))
    if not a or not b:
        return None
    left, right = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    batch = np.broadcast_shapes(tuple(left[:-2]), tuple(right[:-2]))
    out = (*batch, left[-2], right[-1])
    if len(a) == 1:
        out = (*out[:-2], out[-1])
    if len(b) == 1:
        out = out[:-1]
    return tuple(out)


def _matmul_nbits(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    return (*data[:-1], int(node.attr("N")))


def _gemm(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    a, b = _known(lookup, node.input(0)), _known(lookup, node.input(1))
    rows = a[1] if node.attr("transA", 0) else a[0]
    cols = b[0] if node.attr("transB", 0) else b[1]
    return (rows, cols)


def _window(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    """Conv, ConvInteger's geometry and the pooling ops (ONNX output-size formula)."""
    data = lookup.need_shape(node.input(0))
    if data is None or len(data) < 3:
        return None
    spatial = data[2:]
    weight = None
    if node.op_type in ("Conv", "ConvInteger"):
        weight = lookup.need_shape(node.input(1))
        if weight is None:
            return None
    kernel = node.attr("kernel_shape") or (weight[2:] if weight is not None else None)
    if kernel is None or len(kernel) != len(spatial):
        return None
    rank = len(spatial)
    strides = node.attr("strides") or [1] * rank
    dilations = node.attr("dilations") or [1] * rank
    pads = node.attr("pads") or [0] * (2 * rank)
    auto_pad = node.attr("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    rounding = math.ceil if node.attr("ceil_mode", 0) else math.floor
    sizes = []
    for axis in range(rank):
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            sizes.append(-(-spatial[axis] // strides[axis]))
            continue
        padding = 0 if auto_pad == "VALID" else pads[axis] + pads[axis + rank]
        extent = dilations[axis] * (kernel[axis] - 1) + 1
        sizes.append(int(rounding((spatial[axis] + padding - extent) / strides[axis])) + 1)
    channels = weight[0] if weight is not None else data[1]
    return (data[0], channels, *sizes)


def _pad(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    """Pad: ``out[a] = in[a] + pads[a] + pads[a + n]`` over the padded axes (all, or input 3's)."""
    data = lookup.need_shape(node.input(0))
    pads = lookup.need_value(node.input(1)) if node.input(1) else node.attr("pads")
    if data is None or pads is None:
        return None
    amounts = _ints(pads)
    axes_value = lookup.need_value(node.input(3)) if node.input(3) else None
    if node.input(3) and axes_value is None:
        return None
    axes = range(len(data)) if axes_value is None else [a % len(data) for a in _ints(axes_value)]
    shape, n = list(data), len(amounts) // 2
    for i, axis in enumerate(axes):
        shape[axis] += amounts[i] + amounts[i + n]
    return tuple(shape)


def _resize(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    """Resize (opset 11+): the ``sizes`` input, else each axis times its ``scales`` (floored)."""
    data = lookup.need_shape(node.input(0))
    scales = lookup.need_value(node.input(2)) if node.input(2) else None
    sizes = lookup.need_value(node.input(3)) if node.input(3) else None
    if data is None or (sizes is None and scales is None):
        return None
    axes = node.attr("axes")
    axes = list(range(len(data))) if axes is None else [int(axis) % len(data) for axis in axes]
    result = list(data)
    for position, axis in enumerate(axes):
        if sizes is not None and np.size(sizes):
            result[axis] = int(np.ravel(sizes)[position])
        elif scales is not None and np.size(scales):
            result[axis] = math.floor(data[axis] * float(np.ravel(scales)[position]))
        else:
            return None
    return tuple(result)


def _global_pool(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    data = _known(lookup, node.input(0))
    return (*data[:2], *([1] * (len(data) - 2)))


def _embed(lookup: ShapeLookup, node: Node, output: int) -> Shape | None:
    """onnxruntime's EmbedLayerNormalization (and QEmbedLayerNormalization, its quantised form):
    (B, S, D) embeddings (and their sum, output 2) and the (B,) mask index (output 1); D is the
    length of gamma (input 5)."""
    ids, gamma = lookup.need_shape(node.input(0)), lookup.need_shape(node.input(5))
    if ids is None or gamma is None:
        return None
    return (ids[0],) if output == 1 else (*ids, *gamma[-1:])


def _constant_of_shape(lookup: ShapeLookup, node: Node, _output: int) -> Shape | None:
    target = _known_value(lookup, node.input(0))
    return tuple(_ints(target))


def _skip_norm(lookup: ShapeLookup, node: Node, output: int) -> Shape | None:
    """Skip norms: output 0 (the norm) and 3 (the input + skip sum) keep input 0's shape; the
    mean and inverse deviation outputs are not followed."""
    return lookup.need_shape(node.input(0)) if output in (0, 3) else None


def _scalar_outputs_after_first(lookup: ShapeLookup, node: Node, output: int) -> Shape | None:
    """DynamicQuantizeLinear: output 0 keeps the shape; outputs 1 and 2 (scale, zero point) are
    scalars."""
    return lookup.need_shape(node.input(0)) if output == 0 else ()


#: Ops whose shape rule is not "same as input 0" or "broadcast" (those are listed in the table).
SHAPE_RULES: dict[str, ShapeRule] = {
    "Transpose": _transpose,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Expand": _expand,
    "Tile": _tile,
    "Gather": _gather,
    "GatherND": _gather_nd,
    "Concat": _concat,
    "Slice": _slice,
    "Split": _split,
    "ReduceMean": _reduce,
    "ReduceSum": _reduce,
    "ReduceMax": _reduce,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "MatMulNBits": _matmul_nbits,
    "Gemm": _gemm,
    "Conv": _window,
    "ConvInteger": _window,
    "MaxPool": _window,
    "AveragePool": _window,
    "LpPool": _window,
    "GlobalAveragePool": _global_pool,
    "GlobalMaxPool": _global_pool,
    "Resize": _resize,
    "Pad": _pad,
    "EmbedLayerNormalization": _embed,
    "QEmbedLayerNormalization": _embed,  # its quantised form: the same inputs 0 and 5, outputs
    "ConstantOfShape": _constant_of_shape,
    "SkipLayerNormalization": _skip_norm,
    "SkipSimplifiedLayerNormalization": _skip_norm,
    "DynamicQuantizeLinear": _scalar_outputs_after_first,
}
