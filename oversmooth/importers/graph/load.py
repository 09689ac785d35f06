"""Loading an ONNX file: parse without reading external data, check, index.

Public API
----------
load_model
    Parse an ``.onnx`` file (external data is *not* read), check it, index its graph.
model_from_proto
    The same checks and index for a ``ModelProto`` already in memory.
OnnxModel
    The parsed model, its path, default-domain opset, :class:`GraphIndex` and graph inputs.
GraphInput
    Name, dtype and shape (symbolic dims by name) of one graph input.
SUPPORTED_OPSETS
    The default-domain opset range accepted (7 to 23 inclusive; below 13 read through ONNX's
    version converter, :mod:`oversmooth.importers.graph.opsets`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from oversmooth.importers.errors import ModelFileError, UnsupportedModelError
from oversmooth.importers.graph.branches import CacheBranch, read_no_cache_branch
from oversmooth.importers.graph.defuse import Declined, Defused, defuse_attention
from oversmooth.importers.graph.index import GraphIndex, external_data_path, graph_tensors
from oversmooth.importers.graph.kv_cache import cache_inputs
from oversmooth.importers.graph.node import DEFAULT_DOMAINS
from oversmooth.importers.graph.opsets import (
    LOWEST_OPSET,
    READ_OPSET,
    mirror_outputs,
    to_read_opset,
)
from oversmooth.importers.graph.qoperators import expand_quantized_operators
from oversmooth.importers.graph.quantized import ReadThrough, read_through_activation_pairs

__all__ = ["SUPPORTED_OPSETS", "GraphInput", "OnnxModel", "load_model", "model_from_proto"]

#: Default-domain opsets accepted: 7 (the oldest ONNX's version converter takes to 13, where
#: Softmax is over one axis and Split sizes are an input, the forms the importer reads) to 23.
SUPPORTED_OPSETS = (LOWEST_OPSET, 23)

Dim = int | str | None


@dataclass(frozen=True)
class GraphInput:
    """One graph input of an ONNX model (initializers excluded).

    Attributes
    ----------
    name : str
        Input name.
    dtype : numpy.dtype
        Element type.
    shape : tuple of (int or str or None)
        Fixed dims as ints, symbolic dims as their names, unknown dims as None.
    past_axis : int or None
        For a key/value cache input (:mod:`oversmooth.importers.graph.kv_cache`), the axis of the past
        tokens, which the audit feeds empty (the model without a cache); None for other inputs.
    """

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]
    past_axis: int | None = None

    def describe(self) -> str:
        """One line: ``name: dtype [dim, ...]`` (and, for a KV cache, the axis fed empty)."""
        dims = ", ".join("?" if dim is None else str(dim) for dim in self.shape)
        cache = "" if self.past_axis is None else f" (KV cache: axis {self.past_axis} fed empty)"
        return f"{self.name}: {self.dtype} [{dims}]{cache}"


def _graph_input(value: onnx.ValueInfoProto, past_axis: int | None = None) -> GraphInput:
    tensor = value.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    except (KeyError, ValueError, TypeError):
        raise ModelFileError(
            f"graph input {value.name!r} must be a tensor with a known element type; got "
            f"element type {tensor.elem_type}"
        ) from None
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or None)
    return GraphInput(value.name, dtype, tuple(dims), past_axis)


@dataclass(frozen=True, eq=False)
class OnnxModel:
    """A parsed ONNX model (external data not loaded) and its graph index.

    Attributes
    ----------
    path : Path or None
        Where it was read from (None for an in-memory model).
    proto : onnx.ModelProto
        The graph the importer reads: at opset 13 or later (an older model converted,
        :mod:`oversmooth.importers.graph.opsets`), fused attention defused, a merged decoder's cache branch
        inlined.
    opset : int
        Default-domain opset version of the model as read from the file.
    index : GraphIndex
    inputs : tuple of GraphInput
        The graph inputs to feed.
    defused : tuple of Defused
        The fused attention nodes rewritten into standard ONNX (:mod:`oversmooth.importers.graph.defuse`);
        ``proto`` and ``index`` are the rewritten graph.
    declined : tuple of Declined
        The fused attention nodes left fused, each with the feature that stopped the rewrite.
    branches : tuple of CacheBranch
        The ``If`` nodes of a merged decoder read through their no-cache branch
        (:mod:`oversmooth.importers.graph.branches`); ``proto`` and ``index`` hold the branch inlined.
    source : onnx.ModelProto or None
        The model onnxruntime runs (:meth:`session_model`) when ``proto`` is only a reading of it:
        an older model's conversion to opset 13 with nothing else rewritten, or a statically
        quantised model with its activation quantise/dequantise pairs read through
        (:mod:`oversmooth.importers.graph.quantized`; ``source`` keeps them). None when onnxruntime runs
        ``proto``.
    read_through : ReadThrough or None
        The activation quantise/dequantise pairs ``proto`` reads through and the operators
        expanded at load (None: neither).
    """

    path: Path | None
    proto: onnx.ModelProto = field(repr=False)
    opset: int
    index: GraphIndex = field(repr=False)
    defused: tuple[Defused, ...] = ()
    declined: tuple[Declined, ...] = ()
    branches: tuple[CacheBranch, ...] = ()
    source: onnx.ModelProto | None = field(default=None, repr=False)
    read_through: ReadThrough | None = None

    def session_model(self) -> onnx.ModelProto:
        """The model onnxruntime runs: ``source`` where there is one (the shipped graph, with the
        optional outputs the matcher named in ``proto`` named there too), else ``proto``.

        Every tensor the audit asks for by name is found in the graph that runs: the conversion
        keeps every tensor name of ``source`` (:func:`~oversmooth.importers.graph.opsets.to_read_opset`
        checks it), and reading through quantisation pairs only removes tensors.
        """
        if self.source is None:
            return self.proto
        mirror_outputs(self.source, self.proto)
        return self.source

    @property
    def session_opset(self) -> int:
        """The default-domain opset of :meth:`session_model` (nodes added to it are spelled so)."""
        return self.opset if self.source is not None else _opset_of(self.proto)

    @property
    def inputs(self) -> tuple[GraphInput, ...]:
        """The graph inputs a caller must feed (initializers excluded), in graph order; a key/value
        cache input carries its past axis (:func:`~oversmooth.importers.graph.kv_cache.cache_inputs`)."""
        constants = set(self.index.initializers)
        caches = cache_inputs(self.index)
        return tuple(
            _graph_input(value, caches.get(value.name))
            for value in self.proto.graph.input
            if value.name not in constants
        )

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
        Default-domain opset outside :data:`SUPPORTED_OPSETS`, or below 13 and not convertible.
    ExternalDataError
        An external-data location is absolute, contains ``..``, escapes the folder or names the
        model file itself.
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
    try:
        data = file.read_bytes()
    except OSError as err:
        raise ModelFileError(
            f"`model` must be a readable ONNX file; cannot read {str(path)!r}: "
            f"{err.strerror or err}"
        ) from None
    proto = _parse(data, str(path))
    return model_from_proto(proto, path=file)


def model_from_proto(proto: onnx.ModelProto, *, path: Path | None = None) -> OnnxModel:
    """Check an already parsed model, defuse its fused attention nodes and index it.

    ``path`` locates external data. A model older than opset 13 is read through its conversion
    to opset 13 (:func:`oversmooth.importers.graph.opsets.to_read_opset`) and run as it is, unless one of the
    rewrites below changed it too (then its converted, rewritten graph runs). A merged decoder's
    ``If`` on its key/value cache is replaced by
    its no-cache branch (:func:`oversmooth.importers.graph.branches.read_no_cache_branch`). Fused attention
    operators are rewritten into the
    standard-ONNX subgraph they stand for (:func:`oversmooth.importers.graph.defuse.defuse_attention`; the
    caller's ``proto`` is left unchanged): every later step sees, and runs, that graph; so are
    quantised operators (QOperator form) into ``DequantizeLinear`` → float operator →
    ``QuantizeLinear`` (:func:`oversmooth.importers.graph.qoperators.expand_quantized_operators`). Last,
    statically quantised activations are read through
    (:func:`oversmooth.importers.graph.quantized.read_through_activation_pairs`): the matcher reads the graph
    without their quantise/dequantise pairs, onnxruntime runs it with them.
    """
    where = repr(str(path)) if path is not None else "the model"
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise ModelFileError(
            f"`model` must be an ONNX model; {where} has no graph, IR version or opset import "
            f"(not ONNX, or truncated)"
        )
    _check_versions_and_domains(proto, where)
    opset = _default_opset(proto, where)
    base_dir = path.parent if path is not None else None
    index = GraphIndex(proto.graph, base_dir, proto.opset_import, model_path=path)
    if not index.nodes:
        raise ModelFileError(f"`model` must contain a graph with nodes; {where} has none")
    for node, name in index.undefined_inputs():
        raise ModelFileError(
            f"`model` is truncated or inconsistent: node {node.label!r} ({node.op_type}) reads "
            f"tensor {name!r}, which no node, initializer or graph input defines"
        )
    for tensor in graph_tensors(proto.graph):  # every tensor, wherever it sits
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            external_data_path(index.base_dir, info.get("location", ""), tensor.name, model=path)
    source = None
    if opset < READ_OPSET:
        source, proto = proto, to_read_opset(proto, where)
        index = GraphIndex(proto.graph, base_dir, proto.opset_import, model_path=path)
    inlined, branches = read_no_cache_branch(proto, index)
    if inlined is not None:
        proto, source = inlined, None
        index = GraphIndex(proto.graph, index.base_dir, proto.opset_import, model_path=path)
    expansion = expand_quantized_operators(proto, index)
    if expansion.proto is not None:
        proto, source = expansion.proto, None
        index = GraphIndex(proto.graph, base_dir, proto.opset_import, model_path=path)
    defusion = defuse_attention(proto, index)
    if defusion.proto is not None:
        proto, source = defusion.proto, None
        index = GraphIndex(proto.graph, base_dir, proto.opset_import, model_path=path)
    read, read_through = read_through_activation_pairs(proto, index)
    if expansion.expanded:
        read_through = replace(read_through or ReadThrough(0), expanded=expansion.expanded)
    if read is not None:
        proto, source = read, source if source is not None else proto
        index = GraphIndex(proto.graph, base_dir, proto.opset_import, model_path=path)
    return OnnxModel(
        path=path,
        proto=proto,
        opset=opset,
        index=index,
        defused=defusion.defused,
        declined=defusion.declined,
        branches=branches,
        source=source,
        read_through=read_through,
    )


def _check_versions_and_domains(proto: onnx.ModelProto, where: str) -> None:
    """Refuse what onnxruntime itself would refuse, before reporting any structure: an IR version
    newer than this onnx knows, a domain imported twice, a node whose domain is not imported, an
    initializer with a negative dimension or a data type its graph-input declaration contradicts."""
    if proto.ir_version > onnx.IR_VERSION:
        raise UnsupportedModelError(
            f"`model` must use ONNX IR version {onnx.IR_VERSION} or older; {where} uses "
            f"{proto.ir_version}"
        )
    domains = [entry.domain or "ai.onnx" for entry in proto.opset_import]
    repeated = sorted({domain for domain in domains if domains.count(domain) > 1})
    if repeated:
        raise ModelFileError(
            f"`model` must import each operator domain once; {where} imports {repeated} twice"
        )
    known = set(domains)
    for node in proto.graph.node:
        if (node.domain or "ai.onnx") not in known:
            raise ModelFileError(
                f"`model` must import the domain of every node; node {node.name or node.op_type!r} "
                f"uses domain {node.domain!r}, which {where} does not import"
            )
    declared = {
        value.name: value.type.tensor_type.elem_type
        for value in proto.graph.input
        if value.type.HasField("tensor_type")
    }
    for tensor in proto.graph.initializer:
        if tensor.name in declared and declared[tensor.name] not in (0, tensor.data_type):
            raise ModelFileError(
                f"`model` is inconsistent: initializer {tensor.name!r} has data type "
                f"{tensor.data_type} but the graph input of that name declares {declared[tensor.name]}"
            )
        if any(dim < 0 for dim in tensor.dims):
            raise ModelFileError(
                f"`model` is inconsistent: initializer {tensor.name!r} has negative dimensions "
                f"{list(tensor.dims)}"
            )


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


def _opset_of(proto: onnx.ModelProto) -> int:
    """The default-domain opset ``proto`` imports (it imports one: loading checked)."""
    return next(int(e.version) for e in proto.opset_import if e.domain in DEFAULT_DOMAINS)


def _default_opset(proto: onnx.ModelProto, where: str) -> int:
    versions = [entry.version for entry in proto.opset_import if entry.domain in DEFAULT_DOMAINS]
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
