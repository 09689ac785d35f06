"""Static tensor shapes and small integer values (shape arithmetic) under assumed batch and sequence sizes.

Public API
----------
ShapeBasis
    What every shape context at one pair of sizes shares (input sizes, the inference fallback).
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
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from oversmooth.importers.errors import ImporterError, ImporterInputError
from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.kv_cache import cache_inputs
from oversmooth.importers.graph.node import Node
from oversmooth.importers.graph.ops import OPS, fold
from oversmooth.importers.graph.shape_rules import Shape
from oversmooth.simulator.limits import check_elements

__all__ = ["ShapeBasis", "ShapeContext", "concrete_shapes", "inferred_types", "static_dims"]


class _MissingDependencyError(Exception):
    """Internal: a dependency (``kind``, ``name``) must be computed first."""

    def __init__(self, request: tuple[str, str]) -> None:
        super().__init__(request)
        self.request = request


class ShapeBasis:
    """What every shape context at one pair of assumed sizes shares, and nothing a caller pins.

    The sizes, the past axes of key/value cache inputs, the size each symbolic input dimension
    takes (bound once, in graph-input order, so that no query order decides it) and the ONNX
    shape-inference fallback (:func:`concrete_shapes`, run at most once). All of it is a function
    of the graph and the sizes alone; :meth:`context` opens a fresh :class:`ShapeContext` over it,
    whose pins and memo are its own (the matcher opens one per match attempt).
    """

    def __init__(self, index: GraphIndex, *, batch: int, sequence: int) -> None:
        self.index = index
        self.batch = batch
        self.sequence = sequence
        self.cache_axes = cache_inputs(index)
        self._symbols = _bind_symbols(index, self.cache_axes, batch, sequence)
        self._inferred: dict[str, tuple[int, ...]] | None = None

    def context(self) -> ShapeContext:
        """A fresh shape context over this basis (no pins, empty memo)."""
        return ShapeContext(self.index, batch=self.batch, sequence=self.sequence, basis=self)

    def input_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of graph input ``name`` at the assumed sizes (a cache's past axis 0).

        Raises
        ------
        ImporterInputError
            The declared size exceeds what any probe may hold (refused by name).
        """
        value_type = self.index.graph_inputs[name].type
        if not value_type.HasField("tensor_type") or not value_type.tensor_type.HasField("shape"):
            return None
        dims = []
        past = self.cache_axes.get(name)
        for axis, dim in enumerate(value_type.tensor_type.shape.dim):
            if axis == past:  # a key/value cache is audited empty (past length 0)
                dims.append(0)
            elif dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            else:
                default = self.batch if axis == 0 else self.sequence
                dims.append(self._symbols.get(dim.dim_param, default))
        # a declared size no probe could hold is refused here, by name, before anything is built
        return check_elements(dims, f"graph input {name!r}", error=ImporterInputError)

    def inferred_shape(self, name: str) -> tuple[int, ...] | None:
        """Fallback for an op without a rule here: ONNX shape inference at the assumed sizes."""
        if self._inferred is None:
            pinned = {}
            for name_ in self.index.graph_inputs:
                shape = None if name_ in self.index.initializers else self.input_shape(name_)
                if shape is not None:
                    pinned[name_] = shape
            self._inferred = concrete_shapes(self.index.graph, self.index.opset_import, pinned)
        return self._inferred.get(name)


def _bind_symbols(
    index: GraphIndex, cache_axes: Mapping[str, int], batch: int, sequence: int
) -> dict[str, int]:
    """The size of each symbolic graph-input dimension: ``batch`` where the symbol first appears
    (in graph-input order) on axis 0, ``sequence`` where it first appears on another axis (a
    cache's past axis aside)."""
    symbols: dict[str, int] = {}
    for name, value in index.graph_inputs.items():
        value_type = value.type
        if not value_type.HasField("tensor_type") or not value_type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(value_type.tensor_type.shape.dim):
            if dim.dim_param and axis != cache_axes.get(name) and not dim.HasField("dim_value"):
                symbols.setdefault(dim.dim_param, batch if axis == 0 else sequence)
    return symbols


class ShapeContext:
    """Static tensor shapes and small integer values, assuming concrete batch and sequence sizes.

    Symbolic graph-input dimensions take ``batch`` (axis 0) or ``sequence`` (other axes) unless the
    same symbol appears earlier among the graph inputs; the past axis of a key/value cache input
    (:func:`~oversmooth.importers.graph.kv_cache.cache_inputs`) is 0, the length the audit feeds. Shapes may
    also be pinned with :meth:`set_shape`: a pin, and everything computed after it, belongs to
    this context alone (:class:`ShapeBasis` holds what contexts share). Evaluation is
    iterative (no recursion) and memoised. A shape no rule here gives is taken from
    :func:`concrete_shapes` (ONNX shape inference, run once per basis, with the graph inputs
    pinned to the same concrete sizes); None where neither knows.
    """

    def __init__(
        self,
        index: GraphIndex,
        *,
        batch: int,
        sequence: int,
        basis: ShapeBasis | None = None,
    ) -> None:
        if basis is None:
            basis = ShapeBasis(index, batch=batch, sequence=sequence)
        elif (basis.index, basis.batch, basis.sequence) != (index, batch, sequence):
            raise ValueError("a shape context must share its basis's graph and sizes")
        self.basis = basis
        self.index = index
        self.batch = batch
        self.sequence = sequence
        self.cache_axes = basis.cache_axes
        self._memo: dict[tuple[str, str], Any] = {}

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
        output = node.outputs.index(name)
        if kind == "shape":
            shape = self._node_shape(node, output)
            return shape if shape is not None else self._inferred_shape(name)
        return self._node_value(node, output)

    def _inferred_shape(self, name: str) -> tuple[int, ...] | None:
        return self.basis.inferred_shape(name)

    def _input_shape(self, name: str) -> tuple[int, ...] | None:
        return self.basis.input_shape(name)

    def _node_shape(self, node: Node, output: int) -> tuple[int, ...] | None:
        """The op table's shape rule, else the shape of the op's value (shape arithmetic)."""
        op = node.op_type
        if op == "Shape":
            data = self._get("value", node.outputs[0])
            return None if data is None else tuple(data.shape)
        semantics = OPS.get(op)
        if semantics is None:
            return None
        if semantics.shape is not None:
            shape = semantics.shape(self, node, output)
            if shape is not None and any(dim < 0 for dim in shape):
                raise ValueError(f"{op} {node.label!r} would have the shape {shape}")
            return shape
        if semantics.value is not None:
            data = self._get("value", node.outputs[output])
            if data is not None:
                return tuple(np.shape(data))
        return None

    def need_shape(self, name: str) -> Shape | None:
        """The shape of ``name`` for a shape rule (asks for it to be computed first if needed)."""
        return self._get("shape", name) if name else None

    def need_value(self, name: str) -> np.ndarray | None:
        """The value of ``name`` for a shape rule (asks for it to be computed first if needed)."""
        return self._get("value", name) if name else None

    def _node_value(self, node: Node, output: int) -> np.ndarray | None:
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
        semantics = OPS.get(op)
        if semantics is None or semantics.value is None:
            return None
        values = [self._get("value", name) if name else None for name in node.inputs]
        if any(value is None for name, value in zip(node.inputs, values, strict=True) if name):
            return None
        return fold(node, values, output)


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
