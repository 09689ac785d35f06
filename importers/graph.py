"""Loading an ONNX model and indexing its graph, without reading weights eagerly.

Public API
----------
load_model
    Parse an ``.onnx`` file (external data is *not* read), check it, index its graph.
model_from_proto
    The same checks and index for a ``ModelProto`` already in memory.
OnnxModel
    The parsed model, its path, default-domain opset and :class:`GraphIndex`.
GraphIndex
    Producer/consumers per tensor, node attributes, and :meth:`GraphIndex.constant_value`, which
    reads an initializer on demand and folds simple weight chains (Cast→Mul int8 dequantisation,
    DequantizeLinear, Transpose, Identity, Reshape/Unsqueeze/Squeeze of constants).
ShapeContext
    Static shapes and small integer values (shape arithmetic) under assumed batch/sequence sizes.
SUPPORTED_OPSETS
    The default-domain opset range accepted by :func:`load_model` (13 to 23 inclusive).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from importers.errors import (
    ExternalDataError,
    ImporterError,
    ModelFileError,
    UnsupportedModelError,
)

__all__ = [
    "SUPPORTED_OPSETS",
    "GraphIndex",
    "Node",
    "OnnxModel",
    "ShapeContext",
    "apply_slice",
    "apply_split",
    "external_data_path",
    "flatten",
    "load_model",
    "model_from_proto",
    "reshape_target",
    "unsqueeze",
]

#: Default-domain opsets accepted: 13 (Softmax over one axis, Split sizes as an input) to 23.
SUPPORTED_OPSETS = (13, 23)
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True, eq=False)
class Node:
    """One graph node with its position, for navigation and reporting.

    ``label`` is the node's name, or ``"<op_type>#<position>"`` when it has none.
    """

    position: int
    proto: onnx.NodeProto = field(repr=False)

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
                    return numpy_helper.to_array(value)
                return value
        return default

    def input(self, position: int) -> str:
        """The name of input ``position`` ("" when absent or optional-and-omitted)."""
        return self.proto.input[position] if position < len(self.proto.input) else ""


class GraphIndex:
    """Navigation over a graph's top level: producers, consumers, constants.

    Parameters
    ----------
    graph : onnx.GraphProto
        Parsed without external data.
    base_dir : Path or None
        Folder that external-data locations are relative to (the model's folder).
    """

    def __init__(self, graph: onnx.GraphProto, base_dir: Path | None = None) -> None:
        self.graph = graph
        self.base_dir = base_dir
        self.nodes = [Node(position, proto) for position, proto in enumerate(graph.node)]
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.graph_inputs = {value.name: value for value in graph.input}
        self.graph_outputs = [value.name for value in graph.output]
        self._producer: dict[str, Node] = {}
        self._consumers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.proto.output:
                if name:
                    self._producer[name] = node
            for name in node.proto.input:
                if name:
                    self._consumers.setdefault(name, []).append(node)
        self._constants: dict[str, np.ndarray | None] = {}

    # -- structure ---------------------------------------------------------------------------
    def producer(self, name: str) -> Node | None:
        """The node that outputs tensor ``name`` (None for graph inputs and initializers)."""
        return self._producer.get(name)

    def consumers(self, name: str) -> list[Node]:
        """The nodes that read tensor ``name``, in graph order."""
        return list(self._consumers.get(name, ()))

    def nodes_of_type(self, op_type: str) -> list[Node]:
        """All nodes with this op type, in graph (topological) order."""
        return [node for node in self.nodes if node.op_type == op_type]

    def is_defined(self, name: str) -> bool:
        """Whether a top-level tensor of that name exists (node output, initializer or input)."""
        return name in self._producer or name in self.initializers or name in self.graph_inputs

    def undefined_inputs(self) -> Iterator[tuple[Node, str]]:
        """(node, tensor) pairs where a node reads a tensor defined nowhere at the top level."""
        for node in self.nodes:
            for name in node.proto.input:
                if name and not self.is_defined(name):
                    yield node, name

    # -- constants ---------------------------------------------------------------------------
    def is_constant(self, name: str) -> bool:
        """Whether ``name`` is a constant or a fold of constants (see :meth:`constant_value`)."""
        return self.constant_value(name) is not None

    def constant_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a constant or a simple fold of constants, else None.

        Initializers are read on first use (external data lazily, from inside the model's folder).
        Folded producers: Constant, Identity, Cast, Transpose, Reshape, Unsqueeze, Squeeze,
        Flatten, Concat, Gather, Neg, Sqrt, Reciprocal, Add/Sub/Mul/Div of constants (e.g. int8 Cast→Mul
        dequantisation) and DequantizeLinear. Arithmetic keeps the graph's dtype, so a folded
        float32 product equals what the runtime computes.
        """
        if not name:
            return None
        stack = [name]
        while stack:
            top = stack[-1]
            if top in self._constants:
                stack.pop()
                continue
            pending = self._pending_input(top)
            if pending is not None:
                stack.append(pending)
                continue
            self._constants[top] = self._fold(top)
            stack.pop()
        return self._constants[name]

    def _foldable_producer(self, name: str) -> Node | None:
        if name in self.initializers or name in self.graph_inputs:
            return None
        node = self._producer.get(name)
        if node is None or node.op_type not in _FOLDERS or node.domain not in _DEFAULT_DOMAINS:
            return None
        return node

    def _pending_input(self, name: str) -> str | None:
        """An input of ``name``'s producer still to evaluate (None when folding can proceed)."""
        node = self._foldable_producer(name)
        if node is None or node.op_type == "Constant":
            return None
        for input_name in node.inputs:
            if input_name and input_name not in self._constants:
                return input_name
            if input_name and self._constants[input_name] is None:
                return None
        return None

    def _fold(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return self.read_tensor(self.initializers[name])
        node = self._foldable_producer(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            return _fold_constant(node, [])
        values = []
        for input_name in node.inputs:
            value = self._constants.get(input_name) if input_name else None
            if input_name and value is None:
                return None
            values.append(value)
        try:
            return _FOLDERS[node.op_type](node, values)
        except (ValueError, TypeError, IndexError):
            return None

    def read_tensor(self, tensor: onnx.TensorProto) -> np.ndarray:
        """Decode one initializer (reading its external file region if it has one)."""
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor = self._with_external_bytes(tensor)
        try:
            return numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as err:
            raise ModelFileError(
                f"initializer {tensor.name!r} cannot be decoded (dims {list(tensor.dims)}, "
                f"data type {tensor.data_type}): {err}; the model file may be truncated"
            ) from err

    def _with_external_bytes(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        info = {entry.key: entry.value for entry in tensor.external_data}
        path = external_data_path(self.base_dir, info.get("location", ""), tensor.name)
        offset = int(info.get("offset", 0) or 0)
        length = int(info["length"]) if info.get("length") else -1
        if not path.is_file():
            raise ExternalDataError(
                f"external data of initializer {tensor.name!r} must be in {info['location']!r} "
                f"next to the model; got no such file"
            )
        with open(path, "rb") as handle:
            handle.seek(offset)
            raw = handle.read(length)
        expected = _expected_nbytes(tensor)
        if (length >= 0 and len(raw) != length) or (expected is not None and len(raw) != expected):
            raise ExternalDataError(
                f"external data of initializer {tensor.name!r} must hold "
                f"{expected if expected is not None else length} bytes at offset {offset} of "
                f"{info['location']!r}; got {len(raw)}"
            )
        copy = onnx.TensorProto()
        copy.name = tensor.name
        copy.data_type = tensor.data_type
        copy.dims.extend(tensor.dims)
        copy.raw_data = raw
        return copy


def _expected_nbytes(tensor: onnx.TensorProto) -> int | None:
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    except (KeyError, ValueError):
        return None
    if tensor.data_type in (onnx.TensorProto.STRING,) or dtype.itemsize == 0:
        return None
    sub_byte = {
        getattr(onnx.TensorProto, name)
        for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
        if hasattr(onnx.TensorProto, name)
    }
    if tensor.data_type in sub_byte:
        return None
    return math.prod(tensor.dims) * dtype.itemsize


def external_data_path(base_dir: Path | None, location: str, tensor_name: str) -> Path:
    """Resolve an external-data ``location``; it must be a relative path inside ``base_dir``.

    Raises
    ------
    ExternalDataError
        Empty, absolute, containing ``..``, or resolving (through links) outside ``base_dir``.
    """
    if base_dir is None:
        raise ExternalDataError(
            f"initializer {tensor_name!r} stores its data externally, which needs the model's "
            f"folder; got a model without a path"
        )
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if not location or posix.is_absolute() or windows.is_absolute() or windows.drive:
        raise ExternalDataError(
            f"external data location of initializer {tensor_name!r} must be a relative path "
            f"inside the model's folder; got {location!r}"
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise ExternalDataError(
            f"external data location of initializer {tensor_name!r} must stay inside the "
            f"model's folder; got {location!r} (contains '..')"
        )
    base = base_dir.resolve()
    path = (base / location).resolve()
    if not path.is_relative_to(base):
        raise ExternalDataError(
            f"external data location of initializer {tensor_name!r} must stay inside the "
            f"model's folder; got {location!r}, which resolves outside it"
        )
    return path


# -- constant folding rules -----------------------------------------------------------------------
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


def _axes(node: Node, values: list, position: int) -> list[int] | None:
    if len(values) > position and values[position] is not None:
        return [int(axis) for axis in np.ravel(values[position])]
    axes = node.attr("axes")
    return None if axes is None else [int(axis) for axis in axes]


def _fold_unsqueeze(node: Node, values: list) -> np.ndarray:
    return unsqueeze(values[0], _axes(node, values, 1) or [])


def _fold_squeeze(node: Node, values: list) -> np.ndarray:
    axes = _axes(node, values, 1)
    return np.squeeze(values[0]) if axes is None else np.squeeze(values[0], axis=tuple(axes))


def _fold_flatten(node: Node, values: list) -> np.ndarray:
    return flatten(values[0], int(node.attr("axis", 1)))


def _fold_concat(node: Node, values: list) -> np.ndarray:
    return np.concatenate(values, axis=int(node.attr("axis")))


def _fold_gather(node: Node, values: list) -> np.ndarray:
    return np.take(values[0], values[1], axis=int(node.attr("axis", 0)))


def _binary(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable:
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


_FOLDERS: dict[str, Callable[[Node, list], np.ndarray | None]] = {
    "Constant": _fold_constant,
    "Identity": lambda _node, values: values[0],
    "Cast": _fold_cast,
    "Transpose": _fold_transpose,
    "Reshape": _fold_reshape,
    "Unsqueeze": _fold_unsqueeze,
    "Squeeze": _fold_squeeze,
    "Flatten": _fold_flatten,
    "Concat": _fold_concat,
    "Gather": _fold_gather,
    "Neg": lambda _node, values: np.negative(values[0]),
    "Sqrt": lambda _node, values: np.sqrt(values[0]),
    "Reciprocal": lambda _node, values: np.reciprocal(values[0]),
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_onnx_divide),
    "DequantizeLinear": _fold_dequantize,
}


# -- shared shape helpers ------------------------------------------------------------------------
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


# -- static shapes and shape arithmetic ----------------------------------------------------------
class _MissingDependencyError(Exception):
    """Internal: a dependency (``kind``, ``name``) must be computed first."""

    def __init__(self, request: tuple[str, str]) -> None:
        super().__init__(request)
        self.request = request


_SAME_SHAPE = frozenset(
    "Cast Identity Erf Sqrt Relu Gelu Sigmoid Tanh Neg Reciprocal Softmax LogSoftmax IsNaN "
    "Abs Exp Log Not Clip LeakyRelu Softplus Round Floor Ceil LayerNormalization "
    "SimplifiedLayerNormalization RMSNormalization Dropout BatchNormalization HardSigmoid "
    "Elu Selu Sin Cos".split()
)
_BROADCAST = frozenset(
    "Add Sub Mul Div Pow Where Equal Greater Less GreaterOrEqual LessOrEqual And Or Xor Max Min "
    "Mod BitwiseAnd BitwiseOr".split()
)


class ShapeContext:
    """Static tensor shapes and small integer values, assuming concrete batch and sequence sizes.

    Symbolic graph-input dimensions take ``batch`` (axis 0) or ``sequence`` (other axes) unless the
    same symbol was seen before. Shapes may also be pinned with :meth:`set_shape`. Evaluation is
    iterative (no recursion), memoised, and returns None wherever an op is not modelled.
    """

    def __init__(self, index: GraphIndex, *, batch: int, sequence: int) -> None:
        self.index = index
        self.batch = batch
        self.sequence = sequence
        self._memo: dict[tuple[str, str], Any] = {}
        self._symbols: dict[str, int] = {}

    def set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Pin the shape of ``name`` (used for tensors computed by a probe)."""
        self._memo[("shape", name)] = tuple(int(dim) for dim in shape)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The static shape of tensor ``name`` under the assumed sizes, or None."""
        return self._resolve(("shape", name))

    def value(self, name: str) -> np.ndarray | None:
        """The value of a small integer tensor (shape arithmetic), or None."""
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
            return self._node_shape(node, node.outputs.index(name))
        return self._node_value(node)

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
        if op in _SAME_SHAPE and output == 0:
            return self._get("shape", node.input(0))
        if op in _BROADCAST:
            shapes = [self._get("shape", name) for name in node.inputs]
            return None if None in shapes else tuple(np.broadcast_shapes(*shapes))
        if op == "Shape":
            data = self._get("value", node.outputs[0])
            return None if data is None else tuple(data.shape)
        rule = _SHAPE_RULES.get(op)
        if rule is None:
            return None
        dummy = rule(self, node, output)
        return None if dummy is None else tuple(dummy.shape)

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
        folder = _FOLDERS.get(op) or _VALUE_RULES.get(op)
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
        lambda node, data, v: unsqueeze(data, _axes(node, [None, *v], 1) or [])
    ),
    "Squeeze": _with_values(lambda node, data, v: _fold_squeeze(node, [data, *v])),
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
    "Concat": lambda context, node, _o: np.concatenate(
        [context.dummy(name) for name in node.inputs], axis=int(node.attr("axis"))
    ),
    "Slice": _slice_rule,
    "Split": _split_rule,
    "ReduceMean": _reduce_rule,
    "ReduceSum": _reduce_rule,
    "ReduceMax": _reduce_rule,
    "MatMul": _matmul_rule,
    "Gemm": _gemm_rule,
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
    "Equal": _binary(np.equal),
    "Where": _value_where,
    "Max": lambda _node, values: np.maximum.reduce(values),
    "Min": lambda _node, values: np.minimum.reduce(values),
    "Not": lambda _node, values: np.logical_not(values[0]),
    "Abs": lambda _node, values: np.abs(values[0]),
    "Range": _value_range,
    "ReduceProd": lambda _node, values: np.asarray(np.prod(values[0]), dtype=values[0].dtype),
    "Expand": lambda _node, values: np.broadcast_to(
        values[0], np.broadcast_shapes(values[0].shape, tuple(np.ravel(values[1])))
    ),
    "ConstantOfShape": lambda node, values: np.full(
        tuple(np.ravel(values[0])),
        node.attr("value", np.zeros(1, np.float32)).ravel()[0],
    ),
}


# -- loading --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class OnnxModel:
    """A parsed ONNX model (external data not loaded) and its graph index.

    Attributes
    ----------
    path : Path or None
        Where it was read from (None for an in-memory model).
    proto : onnx.ModelProto
    opset : int
        Default-domain opset version.
    index : GraphIndex
    """

    path: Path | None
    proto: onnx.ModelProto = field(repr=False)
    opset: int
    index: GraphIndex = field(repr=False)

    @property
    def name(self) -> str:
        """The file name, or the graph name for an in-memory model."""
        return self.path.name if self.path is not None else (self.proto.graph.name or "<model>")


def load_model(path: str | os.PathLike[str]) -> OnnxModel:
    """Parse and check an ONNX file without reading external data.

    Parameters
    ----------
    path : path-like
        An ``.onnx`` file. External-data tensors must live inside the same folder.

    Returns
    -------
    OnnxModel

    Raises
    ------
    ModelFileError
        Not a file, not ONNX, truncated, or a node reads a tensor defined nowhere.
    UnsupportedModelError
        Default-domain opset outside :data:`SUPPORTED_OPSETS`.
    ExternalDataError
        An external-data location is absolute, contains ``..`` or escapes the folder.
    """
    file = Path(path)
    if not file.exists():
        raise ModelFileError(
            f"`model` must be an existing ONNX file; got {str(path)!r} (no such file)"
        )
    if not file.is_file():
        raise ModelFileError(
            f"`model` must be an ONNX file; got {str(path)!r} (not a regular file)"
        )
    data = file.read_bytes()
    proto = _parse(data, str(path))
    return model_from_proto(proto, path=file)


def model_from_proto(proto: onnx.ModelProto, *, path: Path | None = None) -> OnnxModel:
    """Check an already parsed model and index it (``path`` locates external data)."""
    where = repr(str(path)) if path is not None else "the model"
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise ModelFileError(
            f"`model` must be an ONNX model; {where} has no graph, IR version or opset import "
            f"(not ONNX, or truncated)"
        )
    opset = _default_opset(proto, where)
    index = GraphIndex(proto.graph, path.parent if path is not None else None)
    if not index.nodes:
        raise ModelFileError(f"`model` must contain a graph with nodes; {where} has none")
    for node, name in index.undefined_inputs():
        raise ModelFileError(
            f"`model` is truncated or inconsistent: node {node.label!r} ({node.op_type}) reads "
            f"tensor {name!r}, which no node, initializer or graph input defines"
        )
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            external_data_path(index.base_dir, info.get("location", ""), tensor.name)
    return OnnxModel(path=path, proto=proto, opset=opset, index=index)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelFileError(f"`model` must be an ONNX file; got {where!r} (empty file)")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise ModelFileError(
            f"`model` must be an ONNX file; {where!r} does not parse as one "
            f"(not ONNX, or truncated): {err}"
        ) from None
    return proto


def _default_opset(proto: onnx.ModelProto, where: str) -> int:
    versions = [entry.version for entry in proto.opset_import if entry.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise UnsupportedModelError(
            f"`model` must import the default ONNX domain; {where} imports only "
            f"{sorted(entry.domain for entry in proto.opset_import)}"
        )
    opset = int(versions[0])
    low, high = SUPPORTED_OPSETS
    if not low <= opset <= high:
        raise UnsupportedModelError(
            f"`model` must use default-domain opset {low} to {high}; {where} uses opset {opset}"
        )
    return opset
