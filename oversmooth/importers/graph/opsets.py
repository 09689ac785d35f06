"""Models older than opset 13: read through ONNX's version converter, run as they are.

Exporters of opsets 7 to 12 (paddle2onnx writes 10 to 12; older PyTorch, tf2onnx and Keras
exports go back to 7) spell several ops differently from what the importer reads: the axes of
``Split``, ``Squeeze``, ``Unsqueeze`` and ``ReduceSum`` as attributes, ``Clip`` bounds and ``Pad``
amounts as attributes (before 11), ``Upsample`` (before 10) for ``Resize``, ``Dropout`` with a
``ratio`` attribute (before 12), and ``Softmax``, which before 13 coerces its input to 2-D at
``axis`` (``axis=1`` on (B, H, T, T) scores is one softmax over H·T·T entries, not one per query).
Such a model is read through :func:`onnx.version_converter.convert_version` to opset 13, and
every later step (matching, weights, shape arithmetic) sees only opset 13 forms.

Why the converter rather than the old forms written into the importer: the converter's adapters
rewrite each of those ops into its opset-13 equivalent (axes and bounds moved to constant inputs,
``Upsample`` to ``Resize``, a non-last-axis ``Softmax`` to ``Flatten`` → ``Softmax`` → ``Reshape``,
so the matcher sees the axis the model really normalises over), exactly: onnxruntime gives
bit-identical outputs on the original and the converted graph for every form above (the tests).
Old forms written by hand would spread opset branches through every shape rule, fold and matcher
step, each a place to get a semantics wrong; the converter is one place, maintained with the
standard. It works at opset 7 and later (:data:`LOWEST_OPSET`: onnxruntime runs nothing older).

The converted graph is only read. onnxruntime runs the model as it was read
(:meth:`oversmooth.importers.graph.OnnxModel.session_model`), so the audit measures the shipped graph. That
needs every tensor the audit asks for to exist there: the converter keeps the name of every tensor
it rewrites (an adapter's last node writes the original output; only the nodes it inserts get
fresh names, ``_v_N`` and ``<name>_intermediate``), which :func:`to_read_opset` checks. A
``Softmax`` over the last axis, which the converter would also wrap in ``Flatten``/``Reshape``
(the converted attention probabilities would then be a fresh 2-D tensor), is first given
``axis=-1``, the same softmax in every opset, and stays one node writing its own output.

Public API
----------
READ_OPSET, LOWEST_OPSET
    The opset models are read at; the oldest one converted.
to_read_opset
    A model of opset 7 to 12 converted to :data:`READ_OPSET`.
mirror_outputs
    Name in the model as read the optional outputs the matcher named in its conversion.
"""

from __future__ import annotations

import onnx
from onnx import version_converter

from oversmooth.importers.errors import UnsupportedModelError
from oversmooth.importers.graph.node import DEFAULT_DOMAINS
from oversmooth.importers.graph.shapes import inferred_types, static_dims
from oversmooth.simulator.errors import one_line

__all__ = ["LOWEST_OPSET", "READ_OPSET", "mirror_outputs", "to_read_opset"]

#: The default-domain opset every model is read at (Softmax over one axis, axes as inputs).
READ_OPSET = 13
#: The oldest default-domain opset read (converted to :data:`READ_OPSET`).
LOWEST_OPSET = 7
#: Tensors up to this many bytes pass through the converter; larger ones only by name and dims.
_SMALL_TENSOR_BYTES = 1 << 16
#: Ops that coerced their input to 2-D at ``axis`` (default 1) before opset 13.
_COERCING = ("Softmax", "LogSoftmax", "Hardmax")


def to_read_opset(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """``proto`` (default-domain opset :data:`LOWEST_OPSET` to 12) converted to :data:`READ_OPSET`.

    ``proto`` is not changed. Its large tensors (initializers and ``Constant`` values over 64 KiB)
    pass through the converter as name and dims only, then are put back as they were (external
    data references included), so the weights are neither copied nor read.

    Raises
    ------
    UnsupportedModelError
        The converter refuses the model, or its result lacks a tensor the model has.
    """
    light, held = _light_copy(proto)
    _softmax_on_last_axis(light)
    try:
        converted = version_converter.convert_version(light, READ_OPSET)
    except Exception as err:  # the C++ converter's assertions and checks have no common base
        raise UnsupportedModelError(
            f"`model` must be convertible to opset {READ_OPSET} by ONNX's version converter; "
            f"{where} (opset {_default_version(proto)}) is not: {one_line(err)}"
        ) from None
    _restore(converted, held)
    lost = _outputs(proto) - _outputs(converted)
    if lost:
        raise UnsupportedModelError(
            f"`model` must keep its tensor names when converted to opset {READ_OPSET}; ONNX's "
            f"version converter dropped {sorted(lost)[:3]} of {where}"
        )
    return converted


def mirror_outputs(source: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Give ``source``'s nodes the optional outputs named on their conversions in ``converted``.

    The matcher names an optional output it needs (a fused skip norm's sum, see
    :meth:`oversmooth.importers.graph.GraphIndex.name_output`) on the converted graph; the node writing the
    same first output in ``source`` is given the same name, so a session on ``source`` can fetch
    it. ``source`` is edited in place.
    """
    converted_by_output = {node.output[0]: node for node in converted.graph.node if node.output}
    for node in source.graph.node:
        twin = converted_by_output.get(node.output[0]) if node.output else None
        if twin is None or twin.op_type != node.op_type:
            continue
        for position in range(len(node.output), len(twin.output)):
            node.output.append(twin.output[position])
        for position, name in enumerate(twin.output[: len(node.output)]):
            if name and not node.output[position]:
                node.output[position] = name


def _default_version(proto: onnx.ModelProto) -> int:
    return next(int(e.version) for e in proto.opset_import if e.domain in DEFAULT_DOMAINS)


def _outputs(proto: onnx.ModelProto) -> set[str]:
    return {name for node in proto.graph.node for name in node.output if name}


def _large(tensor: onnx.TensorProto) -> bool:
    return (
        tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.ByteSize() > _SMALL_TENSOR_BYTES
    )


def _name_and_dims(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)


def _light_copy(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """A copy of ``proto`` whose large tensors keep only their name and dims, and those tensors
    (initializers by name, ``Constant`` values by ``"<output> (Constant)"``)."""
    light = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(light, name, getattr(proto, name))
    light.opset_import.extend(proto.opset_import)
    light.functions.extend(proto.functions)
    light.metadata_props.extend(proto.metadata_props)
    graph = light.graph
    graph.name = proto.graph.name
    for name in ("input", "output", "value_info", "sparse_initializer"):
        getattr(graph, name).extend(getattr(proto.graph, name))
    held: dict[str, onnx.TensorProto] = {}
    for tensor in proto.graph.initializer:
        if _large(tensor):
            held[tensor.name] = tensor
            tensor = _name_and_dims(tensor)
        graph.initializer.append(tensor)
    for node in proto.graph.node:
        value = _constant_tensor(node)
        if value is None or not _large(value):
            graph.node.append(node)
            continue
        held[f"{node.output[0]} (Constant)"] = value
        copy = onnx.NodeProto(
            op_type=node.op_type, domain=node.domain, name=node.name, output=node.output
        )
        copy.attribute.add().CopyFrom(onnx.helper.make_attribute("value", _name_and_dims(value)))
        graph.node.append(copy)
    return light, held


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS or not node.output:
        return None
    return next((a.t for a in node.attribute if a.name == "value" and a.HasField("t")), None)


def _restore(converted: onnx.ModelProto, held: dict[str, onnx.TensorProto]) -> None:
    """Put the tensors :func:`_light_copy` held back into ``converted`` (same names)."""
    for tensor in converted.graph.initializer:
        if tensor.name in held:
            tensor.CopyFrom(held[tensor.name])
    for node in converted.graph.node:
        key = f"{node.output[0]} (Constant)" if node.output else ""
        if node.op_type == "Constant" and key in held:
            for attribute in node.attribute:
                if attribute.name == "value":
                    attribute.t.CopyFrom(held[key])


def _softmax_on_last_axis(model: onnx.ModelProto) -> None:
    """Set ``axis=-1`` on every pre-13 Softmax (LogSoftmax, Hardmax) of ``model`` whose axis is its
    input's last: the same op in every opset, which the converter keeps as one node."""
    coercing = [
        node
        for node in model.graph.node
        if node.op_type in _COERCING and node.domain in DEFAULT_DOMAINS and node.input
    ]
    if not coercing:
        return
    types = inferred_types(model)
    for value in model.graph.input:
        if value.type.HasField("tensor_type"):
            types.setdefault(value.name, value.type)
    for node in coercing:
        dims = static_dims(types, node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if dims is None or axis not in (len(dims) - 1, -1):
            continue  # not the last axis, or a rank nobody knows: the converter's own rewrite
        del node.attribute[:]
        node.attribute.add().CopyFrom(onnx.helper.make_attribute("axis", -1))
