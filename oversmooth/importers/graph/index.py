"""Navigation over a graph's top level: producers, consumers, and constants read on demand.

Public API
----------
GraphIndex
    Producer/consumers per tensor and :meth:`GraphIndex.constant_value`, which reads an initializer
    on first use (external data only from inside the model's folder) and folds simple weight chains
    (through the op table's evaluator, :func:`oversmooth.importers.graph.ops.fold`).
external_data_path
    Resolve an external-data location, refusing anything outside the model's folder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from onnx import numpy_helper

from oversmooth.importers.errors import ExternalDataError, ModelFileError
from oversmooth.importers.graph.node import DEFAULT_DOMAINS, Node
from oversmooth.importers.graph.ops import FOLDERS

__all__ = ["GraphIndex", "external_data_path", "graph_tensors", "uses_external_data"]


class GraphIndex:
    """Navigation over a graph's top level: producers, consumers, constants.

    Parameters
    ----------
    graph : onnx.GraphProto
        Parsed without external data.
    base_dir : Path or None
        Folder that external-data locations are relative to (the model's folder).
    opset_import : sequence of onnx.OperatorSetIdProto
        The model's opset imports (for ONNX shape inference on the graph; empty: none run); each
        node carries the default domain's version (:attr:`Node.opset`), which its value is read at.
    model_path : Path or None
        The model file itself, which no external-data location may name.
    """

    def __init__(
        self,
        graph: onnx.GraphProto,
        base_dir: Path | None = None,
        opset_import: Sequence[onnx.OperatorSetIdProto] = (),
        model_path: Path | None = None,
    ) -> None:
        self.graph = graph
        self.base_dir = base_dir
        self.model_path = model_path
        self.opset_import = tuple(opset_import)
        opset = next(
            (int(e.version) for e in self.opset_import if e.domain in DEFAULT_DOMAINS), None
        )
        self.nodes = [Node(position, proto, opset) for position, proto in enumerate(graph.node)]
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

    def name_output(self, node: Node, position: int, name: str) -> str:
        """Name the optional output ``position`` of ``node`` ``name`` if it has none; return its name.

        The loaded graph is edited in place (empty names pad the outputs before it): the node then
        also computes that output, which a session can fetch; nothing else changes.
        """
        outputs = node.proto.output
        while len(outputs) <= position:
            outputs.append("")
        if not outputs[position]:
            outputs[position] = name
            self._producer[name] = node
        return outputs[position]

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
        Folded producers: the op table's ``weights`` ops (:data:`~oversmooth.importers.graph.ops.FOLDERS`:
        Constant, Identity, Cast, Transpose, Reshape, Unsqueeze, Squeeze, Flatten, Concat, Gather,
        GatherND, Neg, Sqrt, Reciprocal, Add/Sub/Mul/Div of constants, e.g. int8 Cast→Mul
        dequantisation, DequantizeLinear and QuantizeLinear), evaluated at the model's opset.
        Arithmetic keeps the graph's dtype, so a folded float32 product equals what the runtime
        computes.
        """
        if not name:
            return None
        stack, on_stack = [name], {name}
        while stack:
            top = stack[-1]
            if top in self._constants:
                stack.pop()
                on_stack.discard(top)
                continue
            pending = self._pending_input(top)
            if (
                pending in on_stack
            ):  # a cycle (an Identity pair, an Add reading itself): not constant
                self._constants[pending] = None
            elif pending is not None:
                stack.append(pending)
                on_stack.add(pending)
            else:
                self._constants[top] = self._fold(top)
        return self._constants[name]

    def _foldable_producer(self, name: str) -> Node | None:
        if name in self.initializers or name in self.graph_inputs:
            return None
        node = self._producer.get(name)
        if node is None or node.op_type not in FOLDERS or node.domain not in DEFAULT_DOMAINS:
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
            tensor = node.tensor_attr("value")
            # Through read_tensor: external data only from inside the model's folder.
            return self.read_tensor(tensor) if tensor is not None else FOLDERS["Constant"](node, [])
        values = []
        for input_name in node.inputs:
            value = self._constants.get(input_name) if input_name else None
            if input_name and value is None:
                return None
            values.append(value)
        try:
            return FOLDERS[node.op_type](node, values)
        except (ValueError, TypeError, IndexError):
            return None

    def read_tensor(self, tensor: onnx.TensorProto) -> np.ndarray:
        """Decode one initializer (reading its external file region if it has one)."""
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor = self._with_external_bytes(tensor)
        try:
            return numpy_helper.to_array(tensor)
        except (ValueError, TypeError, KeyError) as err:  # KeyError: an unknown data type
            raise ModelFileError(
                f"initializer {tensor.name!r} cannot be decoded (dims {list(tensor.dims)}, "
                f"data type {tensor.data_type}): {err}; the model file may be truncated"
            ) from err

    def _with_external_bytes(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        info = {entry.key: entry.value for entry in tensor.external_data}
        path = external_data_path(
            self.base_dir, info.get("location", ""), tensor.name, model=self.model_path
        )
        offset = _byte_count(info.get("offset") or "0", "offset", tensor.name)
        length = _byte_count(info["length"], "length", tensor.name) if info.get("length") else -1
        if not path.is_file():
            raise ExternalDataError(
                f"external data of initializer {tensor.name!r} must be in {info['location']!r} "
                f"next to the model; got no such file"
            )
        expected = _expected_nbytes(tensor)
        wanted = expected if expected is not None else length
        size = path.stat().st_size
        if wanted >= 0 and offset + wanted > size:  # checked before reading anything
            raise ExternalDataError(
                f"external data of initializer {tensor.name!r} must hold {wanted} bytes at "
                f"offset {offset} of {info['location']!r}; the file has {size} bytes"
            )
        with open(path, "rb") as handle:
            handle.seek(offset)
            raw = handle.read(wanted)
        if length >= 0 and len(raw) != length:
            raise ExternalDataError(
                f"external data of initializer {tensor.name!r} must hold {wanted} bytes at offset "
                f"{offset} of {info['location']!r}; its length entry says {length}"
            )
        copy = onnx.TensorProto()
        copy.name = tensor.name
        copy.data_type = tensor.data_type
        copy.dims.extend(tensor.dims)
        copy.raw_data = raw
        return copy


def _byte_count(text: str, what: str, tensor_name: str) -> int:
    """An external-data offset or length: a non-negative decimal integer, else ExternalDataError."""
    if not text.isdigit():
        raise ExternalDataError(
            f"external data {what} of initializer {tensor_name!r} must be a non-negative integer; "
            f"got {text!r}"
        )
    return int(text)


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


def external_data_path(
    base_dir: Path | None, location: str, tensor_name: str, *, model: Path | None = None
) -> Path:
    """Resolve an external-data ``location``; it must be a relative path inside ``base_dir``, and
    not the ``model`` file itself (its bytes are protobuf, not tensor data: read as floats they
    would be a silent wrong answer).

    Raises
    ------
    ExternalDataError
        Empty, absolute, containing ``..``, resolving (through links) outside ``base_dir``, or
        naming the model file (through links, hard links included).
    """
    if base_dir is None:
        raise ExternalDataError(
            f"initializer {tensor_name!r} stores its data externally, which needs the model's "
            f"folder; got a model without a path"
        )
    if "\0" in location:
        raise ExternalDataError(
            f"external data location of initializer {tensor_name!r} must be a file name; got "
            f"{location!r} (contains a NUL byte)"
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
    if model is not None and _same_file(path, model):
        raise ExternalDataError(
            f"external data location of initializer {tensor_name!r} must be a data file next to "
            f"the model; got {location!r}, which is the model file itself"
        )
    return path


def _same_file(path: Path, other: Path) -> bool:
    """Whether two paths name one file (symbolic and hard links followed)."""
    try:
        return path == other.resolve() or os.path.samefile(path, other)
    except (OSError, ValueError):  # one of them does not exist: not the same file
        return False


def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in ``graph``: initializers, node attributes (Constant values and the
    like) and, recursively, the same inside subgraphs (If, Loop, Scan bodies)."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            subgraphs = [attribute.g] if attribute.HasField("g") else []
            for subgraph in (*subgraphs, *attribute.graphs):
                yield from graph_tensors(subgraph)


def uses_external_data(graph: onnx.GraphProto) -> bool:
    """Whether any tensor of ``graph`` (see :func:`graph_tensors`) stores its data in a file."""
    return any(tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in graph_tensors(graph))
