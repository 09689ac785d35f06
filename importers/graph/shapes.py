"""Static tensor shapes and small integer values (shape arithmetic) under assumed batch and sequence sizes.

Public API
----------
ShapeContext
    ``shape(name)`` and ``value(name)`` of any tensor, evaluated iteratively and memoised; a shape
    no rule gives comes from ONNX shape inference at the same sizes; None where neither knows.
concrete_shapes
    Static shapes from ONNX shape inference with the graph inputs pinned to concrete sizes.
inferred_types
    Tensor types from ONNX shape inference (all ops ONNX knows, contrib ops excepted).
static_dims
    The dims of one tensor from :func:`inferred_types` (None for a symbolic or unknown dim).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from importers.errors import ImporterError
from importers.graph.folding import (
    FOLDERS,
    apply_slice,
    apply_split,
    binary_fold,
    flatten,
    fold_squeeze,
    node_axes,
    reshape_target,
    unsqueeze,
)
from importers.graph.index import GraphIndex
from importers.graph.node import Node

__all__ = ["ShapeContext", "concrete_shapes", "inferred_types", "static_dims"]


class _MissingDependencyError(Exception):
    """Internal: a dependency (``kind``, ``name``) must be computed first."""

    def __init__(self, request: tuple[str, str]) -> None:
        super().__init__(request)
        self.request = request


_SAME_SHAPE = frozenset(
    "Cast Identity Erf Sqrt Relu Gelu Sigmoid Tanh Neg Reciprocal Softmax LogSoftmax IsNaN "
    "Abs Exp Log Not Clip LeakyRelu Softplus Round Floor Ceil LayerNormalization "
    "SimplifiedLayerNormalization RMSNormalization Dropout BatchNormalization HardSigmoid "
    "Elu Selu Sin Cos CumSum Sign Softsign HardSwish Mish Trilu QuantizeLinear DequantizeLinear "
    "DynamicQuantizeLinear FastGelu BiasGelu QuickGelu SkipLayerNormalization "
    "SkipSimplifiedLayerNormalization RotaryEmbedding".split()
)
#: Ops with more than one output whose other outputs keep the shape of input 0 (the skip norms'
#: input+skip sum).
_SAME_SHAPE_OUTPUTS = {"SkipLayerNormalization": 3, "SkipSimplifiedLayerNormalization": 3}
_BROADCAST = frozenset(
    "Add Sub Mul Div Pow Where Equal Greater Less GreaterOrEqual LessOrEqual And Or Xor Max Min "
    "Mod BitwiseAnd BitwiseOr".split()
)


class ShapeContext:
    """Static tensor shapes and small integer values, assuming concrete batch and sequence sizes.

    Symbolic graph-input dimensions take ``batch`` (axis 0) or ``sequence`` (other axes) unless the
    same symbol was seen before. Shapes may also be pinned with :meth:`set_shape`. Evaluation is
    iterative (no recursion) and memoised. A shape no rule here gives is taken from
    :func:`concrete_shapes` (ONNX shape inference, run once, with the graph inputs pinned to the
    same concrete sizes); None where neither knows.
    """

    def __init__(self, index: GraphIndex, *, batch: int, sequence: int) -> None:
        self.index = index
        self.batch = batch
        self.sequence = sequence
        self._memo: dict[tuple[str, str], Any] = {}
        self._symbols: dict[str, int] = {}
        self._inferred: dict[str, tuple[int, ...]] | None = None

    def set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Pin the shape of ``name`` (used for tensors computed by a probe)."""
        self._memo[("shape", name)] = tuple(int(dim) for dim in shape)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The static shape of tensor ``name`` under the assumed sizes, or None."""
        return self._resolve(("shape", name))

    def value(self, name: str) -> np.ndarray | None:
        """The value of a tensor computed from constants and shapes only (shape arithmetic, and
        float scalars such as a score scale ``Sqrt(1/Sqrt(Cast(Shape(q)[-1])))``), or None: a
        value that depends on the input data has none (graph inputs have no value)."""
        return self._resolve(("value", name))

    def _get(self, kind: str, name: str) -> Any:
        request = (kind, name)
        if request not in self._memo:
            raise _MissingDependencyError(request)
        return self._memo[request]

    def _resolve(self, request: tuple[str, str]) -> Any:
        stack = [request]
        on_stack = {request}
        while stack:
            top = stack[-1]
            if top in self._memo:
                stack.pop()
                on_stack.discard(top)
                continue
            try:
                result = self._compute(*top)
            except ImporterError:
                raise
            except _MissingDependencyError as missing:
                if missing.request in on_stack:
                    self._memo[top] = None
                else:
                    stack.append(missing.request)
                    on_stack.add(missing.request)
                continue
            except (ValueError, TypeError, IndexError, OverflowError):
                result = None
            self._memo[top] = result
            stack.pop()
            on_stack.discard(top)
        return self._memo[request]

    def _compute(self, kind: str, name: str) -> Any:
        if not name:
            return None
        constant = self.index.constant_value(name)
        if constant is not None:
            return tuple(constant.shape) if kind == "shape" else constant
        if name in self.index.graph_inputs:
            return self._input_shape(name) if kind == "shape" else None
        node = self.index.producer(name)
        if node is None:
            return None
        if kind == "shape":
            shape = self._node_shape(node, node.outputs.index(name))
            return shape if shape is not None else self._inferred_shape(name)
        return self._node_value(node)

    def _inferred_shape(self, name: str) -> tuple[int, ...] | None:
        """Fallback for an op without a rule here: ONNX shape inference at the assumed sizes."""
        if self._inferred is None:
            pinned = {}
            for name_ in self.index.graph_inputs:
                shape = None if name_ in self.index.initializers else self._input_shape(name_)
                if shape is not None:
                    pinned[name_] = shape
            self._inferred = concrete_shapes(self.index.graph, self.index.opset_import, pinned)
        return self._inferred.get(name)

    def _input_shape(self, name: str) -> tuple[int, ...] | None:
        value_type = self.index.graph_inputs[name].type
        if not value_type.HasField("tensor_type") or not value_type.tensor_type.HasField("shape"):
            return None
        dims = []
        for axis, dim in enumerate(value_type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
                continue
            default = self.batch if axis == 0 else self.sequence
            dims.append(
                self._symbols.setdefault(dim.dim_param, default) if dim.dim_param else default
            )
        return tuple(dims)

    def _node_shape(self, node: Node, output: int) -> tuple[int, ...] | None:
        op = node.op_type
        if op in _SAME_SHAPE and output in (0, _SAME_SHAPE_OUTPUTS.get(op)):
            return self._get("shape", node.input(0))
        if op == "DynamicQuantizeLinear":  # outputs 1 and 2: the scalar scale and zero point
            return ()
        if op in _BROADCAST:
            shapes = [self._get("shape", name) for name in node.inputs]
            return None if None in shapes else tuple(np.broadcast_shapes(*shapes))
        if op == "Shape":
            data = self._get("value", node.outputs[0])
            return None if data is None else tuple(data.shape)
        rule = _SHAPE_RULES.get(op)
        if rule is not None:
            dummy = rule(self, node, output)
            return None if dummy is None else tuple(dummy.shape)
        if op in FOLDERS or op in _VALUE_RULES:  # shape arithmetic: the value gives the shape
            data = self._get("value", node.outputs[output])
            if data is not None:
                return tuple(np.shape(data))
        return None

    def dummy(self, name: str) -> np.ndarray:
        """A zero-strided array with the shape of ``name`` (raises _MissingDependencyError or ValueError)."""
        shape = self._get("shape", name)
        if shape is None:
            raise ValueError(name)
        return np.broadcast_to(np.zeros((), dtype=np.int8), shape)

    def _node_value(self, node: Node) -> np.ndarray | None:
        op = node.op_type
        if op == "Shape":
            shape = self._get("shape", node.input(0))
            if shape is None:
                return None
            start, end = node.attr("start", 0), node.attr("end")
            return np.asarray(shape[start:end], dtype=np.int64)
        if op == "Size":
            shape = self._get("shape", node.input(0))
            return None if shape is None else np.asarray(math.prod(shape), dtype=np.int64)
        folder = FOLDERS.get(op) or _VALUE_RULES.get(op)
        if folder is None:
            return None
        values = [self._get("value", name) if name else None for name in node.inputs]
        if any(value is None for name, value in zip(node.inputs, values, strict=True) if name):
            return None
        return folder(node, values)


def _slice_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray | None:
    data = context.dummy(node.input(0))
    return apply_slice(
        data, *(context._get("value", name) if name else None for name in node.inputs[1:5])
    )


def _split_rule(context: ShapeContext, node: Node, output: int) -> np.ndarray:
    sizes = context._get("value", node.input(1)) if node.input(1) else None
    return apply_split(node, context.dummy(node.input(0)), sizes, output)


def _reduce_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray:
    data = context.dummy(node.input(0))
    axes = context._get("value", node.input(1)) if node.input(1) else node.attr("axes")
    keepdims = bool(node.attr("keepdims", 1))
    if axes is None or len(np.ravel(axes)) == 0:
        axes = range(data.ndim)
    axes = tuple(int(axis) % data.ndim for axis in np.ravel(axes))
    return np.zeros(np.sum(data, axis=axes, keepdims=keepdims).shape, dtype=np.int8)


def _matmul_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray:
    a, b = context.dummy(node.input(0)), context.dummy(node.input(1))
    if a.ndim >= 2 and b.ndim >= 2:  # contract over one element only: the shape is all we need
        return np.matmul(a[..., :1], b[..., :1, :])
    return np.matmul(a, b)


def _gemm_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray:
    a, b = context.dummy(node.input(0)), context.dummy(node.input(1))
    rows = a.shape[1] if node.attr("transA", 0) else a.shape[0]
    cols = b.shape[0] if node.attr("transB", 0) else b.shape[1]
    return np.broadcast_to(np.zeros((), np.int8), (rows, cols))


def _window_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray | None:
    """Conv, ConvInteger, QLinearConv's geometry and the pooling ops (ONNX output-size formula)."""
    data = context._get("shape", node.input(0))
    if data is None or len(data) < 3:
        return None
    spatial = data[2:]
    weight = None
    if node.op_type in ("Conv", "ConvInteger"):
        weight = context._get("shape", node.input(1))
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
    return np.broadcast_to(np.zeros((), np.int8), (data[0], channels, *sizes))


def _pad_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray | None:
    """Pad: ``out[a] = in[a] + pads[a] + pads[a + n]`` over the padded axes (all, or input 3's)."""
    data = context._get("shape", node.input(0))
    pads = context._get("value", node.input(1)) if node.input(1) else node.attr("pads")
    if data is None or pads is None:
        return None
    pads = [int(p) for p in np.ravel(pads)]
    axes_value = context._get("value", node.input(3)) if node.input(3) else None
    if node.input(3) and axes_value is None:
        return None
    axes = (
        range(len(data))
        if axes_value is None
        else [int(a) % len(data) for a in np.ravel(axes_value)]
    )
    shape, n = list(data), len(pads) // 2
    for i, axis in enumerate(axes):
        shape[axis] += pads[i] + pads[i + n]
    return np.zeros(shape, np.int8)


def _resize_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray | None:
    """Resize (opset 11+): the ``sizes`` input, else each axis times its ``scales`` (floored)."""
    data = context._get("shape", node.input(0))
    scales = context._get("value", node.input(2)) if node.input(2) else None
    sizes = context._get("value", node.input(3)) if node.input(3) else None
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
    return np.broadcast_to(np.zeros((), np.int8), tuple(result))


def _global_pool_rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray:
    data = context.dummy(node.input(0))
    return np.zeros((*data.shape[:2], *([1] * (data.ndim - 2))), np.int8)


def _gather_nd_shape(data: Sequence[int], indices: Sequence[int], node: Node) -> tuple[int, ...]:
    """GatherND's output shape: ``indices.shape[:-1] + data.shape[batch_dims + indices.shape[-1]:]``."""
    return (*indices[:-1], *data[int(node.attr("batch_dims", 0)) + indices[-1] :])


def _embed_rule(context: ShapeContext, node: Node, output: int) -> np.ndarray | None:
    """onnxruntime's EmbedLayerNormalization: (B, S, D) embeddings (and their sum, output 2) and
    the (B,) mask index (output 1); D is the length of gamma (input 5)."""
    ids = context._get("shape", node.input(0))
    gamma = context._get("shape", node.input(5))
    if ids is None or gamma is None:
        return None
    shape = (ids[0],) if output == 1 else (*ids, *gamma[-1:])
    return np.broadcast_to(np.zeros((), np.int8), shape)


def _with_values(function: Callable) -> Callable:
    def rule(context: ShapeContext, node: Node, _output: int) -> np.ndarray:
        data = context.dummy(node.input(0))
        values = [context._get("value", name) if name else None for name in node.inputs[1:]]
        return function(node, data, values)

    return rule


_SHAPE_RULES: Mapping[str, Callable[[ShapeContext, Node, int], np.ndarray | None]] = {
    "Transpose": _with_values(lambda node, data, _v: np.transpose(data, node.attr("perm"))),
    "Reshape": _with_values(
        lambda node, data, v: data.reshape(
            reshape_target(data.shape, v[0], allowzero=bool(node.attr("allowzero", 0)))
        )
    ),
    "Flatten": _with_values(
        lambda node, data, _v: flatten(np.zeros(data.shape, np.int8), int(node.attr("axis", 1)))
    ),
    "Unsqueeze": _with_values(
        lambda node, data, v: unsqueeze(data, node_axes(node, [None, *v], 1) or [])
    ),
    "Squeeze": _with_values(lambda node, data, v: fold_squeeze(node, [data, *v])),
    "Expand": _with_values(
        lambda _node, data, v: np.broadcast_to(
            data, np.broadcast_shapes(data.shape, tuple(np.ravel(v[0])))
        )
    ),
    "Tile": _with_values(
        lambda _node, data, v: np.zeros(
            tuple(d * int(r) for d, r in zip(data.shape, np.ravel(v[0]), strict=True)), np.int8
        )
    ),
    "Gather": lambda context, node, _o: np.take(
        context.dummy(node.input(0)),
        np.zeros(context._get("shape", node.input(1)), np.int64),
        axis=int(node.attr("axis", 0)),
    ),
    "GatherND": lambda context, node, _o: np.zeros(
        _gather_nd_shape(
            context._get("shape", node.input(0)), context._get("shape", node.input(1)), node
        ),
        np.int8,
    ),
    "Concat": lambda context, node, _o: np.concatenate(
        [context.dummy(name) for name in node.inputs], axis=int(node.attr("axis"))
    ),
    "Slice": _slice_rule,
    "Split": _split_rule,
    "ReduceMean": _reduce_rule,
    "ReduceSum": _reduce_rule,
    "ReduceMax": _reduce_rule,
    "MatMul": _matmul_rule,
    "MatMulInteger": _matmul_rule,
    "MatMulNBits": lambda context, node, _o: np.zeros(
        (*context._get("shape", node.input(0))[:-1], int(node.attr("N"))), np.int8
    ),
    "Conv": _window_rule,
    "ConvInteger": _window_rule,
    "MaxPool": _window_rule,
    "AveragePool": _window_rule,
    "LpPool": _window_rule,
    "GlobalAveragePool": _global_pool_rule,
    "Resize": _resize_rule,
    "Pad": _pad_rule,
    "GlobalMaxPool": _global_pool_rule,
    "Gemm": _gemm_rule,
    "EmbedLayerNormalization": _embed_rule,
    "ConstantOfShape": lambda context, node, _o: np.zeros(
        tuple(np.ravel(context._get("value", node.input(0)))), np.int8
    ),
}


def _value_where(_node: Node, values: list) -> np.ndarray:
    return np.where(values[0], values[1], values[2])


def _value_range(_node: Node, values: list) -> np.ndarray:
    start, limit, delta = (np.ravel(value)[0] for value in values)
    return np.arange(start, limit, delta)


_VALUE_RULES: Mapping[str, Callable[[Node, list], np.ndarray]] = {
    "Slice": lambda _node, values: apply_slice(values[0], *values[1:5]),
    "Equal": binary_fold(np.equal),
    "Where": _value_where,
    "Max": lambda _node, values: np.maximum.reduce(values),
    "Min": lambda _node, values: np.minimum.reduce(values),
    "Not": lambda _node, values: np.logical_not(values[0]),
    "Abs": lambda _node, values: np.abs(values[0]),
    "Range": _value_range,
    "Pow": binary_fold(lambda a, b: np.power(a, b).astype(a.dtype)),
    "Floor": lambda _node, values: np.floor(values[0]),
    "Ceil": lambda _node, values: np.ceil(values[0]),
    "Round": lambda _node, values: np.round(values[0]),
    "Greater": binary_fold(np.greater),
    "Less": binary_fold(np.less),
    "GreaterOrEqual": binary_fold(np.greater_equal),
    "LessOrEqual": binary_fold(np.less_equal),
    "And": binary_fold(np.logical_and),
    "Or": binary_fold(np.logical_or),
    "Mod": lambda node, values: (np.fmod if node.attr("fmod", 0) else np.mod)(*values),
    "ReduceProd": lambda _node, values: np.asarray(np.prod(values[0]), dtype=values[0].dtype),
    "Expand": lambda _node, values: np.broadcast_to(
        values[0], np.broadcast_shapes(values[0].shape, tuple(np.ravel(values[1])))
    ),
    "ConstantOfShape": lambda node, values: np.full(
        tuple(np.ravel(values[0])),
        node.attr("value", np.zeros(1, np.float32)).ravel()[0],
    ),
}


#: Initializers up to this many bytes keep their values for shape inference (shape constants).
_SMALL_TENSOR_BYTES = 1 << 16


def _skeleton(model: Any) -> Any:
    """A copy of ``model`` whose large initializers keep their name, type and dims but no values.

    Shape inference serialises and copies the whole model several times; types and shapes need
    only dims and the small shape constants, so the skeleton avoids copying the weights.
    """
    skeleton = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "domain", "model_version"):
        setattr(skeleton, field, getattr(model, field))
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph = skeleton.graph
    graph.name = model.graph.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(graph, field).extend(getattr(model.graph, field))
    _skeleton_initializers(model.graph, graph)
    return skeleton


def _skeleton_initializers(source: Any, graph: Any) -> None:
    """Copy ``source``'s initializers into ``graph``, the large ones without their values."""
    for tensor in source.initializer:
        if tensor.ByteSize() <= _SMALL_TENSOR_BYTES:
            graph.initializer.append(tensor)
        else:
            graph.initializer.append(
                onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
            )


def concrete_shapes(
    graph: Any, opset_import: Any, pinned: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """Static shapes of ``graph``'s tensors by ONNX shape inference (with data propagation), the
    graph inputs named in ``pinned`` set to those concrete shapes.

    Parameters
    ----------
    graph : onnx.GraphProto
    opset_import : sequence of onnx.OperatorSetIdProto
        The model's opset imports; empty: nothing is inferred.
    pinned : mapping of str to tuple of int
        Concrete shapes of graph inputs (their symbolic dims replaced).

    Returns
    -------
    dict
        Tensor name → shape, for every tensor whose inferred dims are all concrete. Empty when
        inference fails; ops ONNX does not know (contrib ops) and what depends on them are absent.
    """
    if not opset_import:
        return {}
    model = onnx.ModelProto(ir_version=onnx.IR_VERSION)
    model.opset_import.extend(opset_import)
    model.graph.name = graph.name
    model.graph.node.extend(graph.node)
    model.graph.sparse_initializer.extend(graph.sparse_initializer)
    _skeleton_initializers(graph, model.graph)
    for value in graph.input:
        copy = model.graph.input.add()
        copy.CopyFrom(value)
        if value.name in pinned and copy.type.HasField("tensor_type"):
            shape = copy.type.tensor_type.shape
            shape.Clear()
            for dim in pinned[value.name]:
                shape.dim.add().dim_value = int(dim)
    for value in graph.output:  # names and element types only: their symbolic dims would clash
        model.graph.output.add(name=value.name)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # a fallback only: ShapeContext's own rules come first
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for value in inferred.graph.value_info:
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if all(dim.HasField("dim_value") for dim in dims):
            shapes[value.name] = tuple(int(dim.dim_value) for dim in dims)
    return shapes


def inferred_types(model: Any) -> dict[str, Any]:
    """Tensor types (``onnx.TypeProto``) from ONNX shape inference of ``model`` (a ModelProto).

    Values and outputs only; empty when inference fails (contrib ops etc.).
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model))
    except Exception:  # inference is an optimisation here; onnxruntime types what it misses
        return {}
    typed = [*inferred.graph.value_info, *inferred.graph.output]
    return {value.name: value.type for value in typed if value.type.HasField("tensor_type")}


def static_dims(types: dict[str, Any], name: str) -> tuple[int | None, ...] | None:
    """The dims of tensor ``name`` in ``types`` (:func:`inferred_types`): ints, None where not fixed.

    None when the tensor has no inferred type or rank.
    """
    if name not in types or not types[name].tensor_type.HasField("shape"):
        return None
    return tuple(
        int(dim.dim_value) if dim.HasField("dim_value") else None
        for dim in types[name].tensor_type.shape.dim
    )
