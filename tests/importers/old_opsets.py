"""Builder models spelled at the opsets older exporters write (7 to 12).

ONNX's version converter converts *up* (what the loader does with such a model), but has almost no
adapters *down*: ``convert_version`` of any builder model from opset 13 or 14 to 12 fails on the
first ``Gather``, ``Add`` or ``ReduceMean`` ("No Adapter From Version $13 for Gather"). So these
tests spell the old forms themselves, for the few ops whose signature changed and that the builders
emit, on a model built at opset 13:

- ``Unsqueeze``, ``Squeeze``, ``ReduceSum`` (below 13): the constant axes input becomes the ``axes``
  attribute; ``Split`` (below 13): the sizes input becomes the ``split`` attribute;
- ``Slice`` (below 10): constant starts, ends and axes become attributes (steps must be 1);
- ``Softmax`` (below 13) over the last axis: ``axis=-1`` becomes ``axis=rank-1``, as PyTorch's
  exporter writes it (the opset 1-12 Softmax coerces its input to 2-D at ``axis``, so on the last
  axis both are the same softmax);
- below 11, negative ``axis`` and ``axes`` attributes are counted from the front (they were not
  allowed before; onnxruntime runs them, but ONNX shape inference gives up on them);
- optionally every initializer becomes a ``Constant`` node (paddle2onnx keeps weights so).

Constants that only held the axes, sizes and bounds now in attributes are dropped.

Every other op must exist unchanged at the target opset (``onnx.defs`` is asked); the tests check
the result against onnxruntime's run of the original.

Public API
----------
downgrade
    A copy of an opset-13 model spelled for an older opset.
min_ir_version
    The oldest IR version that can hold a default-domain opset.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["downgrade", "min_ir_version"]

#: Ops whose constant axes input was an ``axes`` attribute before opset 13.
_AXES_BEFORE_13 = ("Unsqueeze", "Squeeze", "ReduceSum")
_SOFTMAX = ("Softmax", "LogSoftmax")


def min_ir_version(opset: int) -> int:
    """The oldest IR version listed for the default-domain ``opset`` (onnx's version table)."""
    return min(entry[1] for entry in helper.VERSION_TABLE if entry[2] == opset)


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    typed = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {
        value.name: len(value.type.tensor_type.shape.dim)
        for value in typed
        if value.type.tensor_type.HasField("shape")
    }


def _ints(values: dict[str, np.ndarray], name: str) -> list[int]:
    return [int(v) for v in np.ravel(values[name])]


def _respell(node: onnx.NodeProto, opset: int, values: dict, ranks: dict) -> onnx.NodeProto:
    """``node`` in its opset-``opset`` form."""
    inputs, attrs = (
        list(node.input),
        {a.name: helper.get_attribute_value(a) for a in node.attribute},
    )
    if node.op_type in _AXES_BEFORE_13 and opset < 13 and len(inputs) > 1:
        attrs["axes"] = _ints(values, inputs.pop(1))
    elif node.op_type == "Split" and opset < 13 and len(inputs) > 1:
        attrs["split"] = _ints(values, inputs.pop(1))
    elif node.op_type == "Slice" and opset < 10:
        starts, ends, *rest = (_ints(values, name) for name in inputs[1:])
        if len(rest) > 1 and any(step != 1 for step in rest[1]):
            raise ValueError(f"Slice {node.name!r} has steps, which opset {opset} cannot spell")
        attrs.update(starts=starts, ends=ends, **({"axes": rest[0]} if rest else {}))
        inputs = inputs[:1]
    elif node.op_type in _SOFTMAX and opset < 13 and attrs.get("axis", -1) == -1:
        if node.input[0] in ranks:
            attrs["axis"] = ranks[node.input[0]] - 1
    if opset < 11:
        _non_negative_axes(node, attrs, ranks)
    return helper.make_node(node.op_type, inputs, list(node.output), name=node.name, **attrs)


def _non_negative_axes(node: onnx.NodeProto, attrs: dict, ranks: dict) -> None:
    """Count ``axis``/``axes`` from the front, as opsets before 11 require (Unsqueeze's axes refer
    to its output)."""
    operand = node.output[0] if node.op_type == "Unsqueeze" or not node.input else node.input[0]
    rank = ranks.get(operand)
    if rank is None:
        return
    if isinstance(attrs.get("axis"), int):
        attrs["axis"] %= rank
    if isinstance(attrs.get("axes"), list):
        attrs["axes"] = [axis % rank for axis in attrs["axes"]]


def downgrade(
    model: onnx.ModelProto, opset: int, *, constants_as_nodes: bool = False
) -> onnx.ModelProto:
    """``model`` (default-domain opset 13) spelled for ``opset`` (7 to 12).

    Raises ValueError where a node has no form at ``opset`` that this module knows.
    """
    values, ranks = _constants(model), _ranks(model)
    nodes = []
    for node in model.graph.node:
        try:
            onnx.defs.get_schema(node.op_type, opset, node.domain)
        except onnx.defs.SchemaError:
            raise ValueError(f"{node.op_type} does not exist at opset {opset}") from None
        nodes.append(_respell(node, opset, values, ranks))
    used = {name for node in nodes for name in node.input} | {v.name for v in model.graph.output}
    nodes = [node for node in nodes if node.op_type != "Constant" or node.output[0] in used]
    initializers = [t for t in model.graph.initializer if t.name in used]
    if constants_as_nodes:
        nodes = [
            helper.make_node("Constant", [], [t.name], name=f"{t.name}.constant", value=t)
            for t in initializers
        ] + nodes
        initializers = []
    ir_version = min_ir_version(opset)
    inputs = list(model.graph.input)
    if ir_version < 4:  # before IR 4 every initializer is also a graph input
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in initializers]
    graph = helper.make_graph(
        nodes, model.graph.name, inputs, list(model.graph.output), initializer=initializers
    )
    old = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset)],
        producer_name=model.producer_name,
        producer_version=model.producer_version,
    )
    old.ir_version = ir_version
    onnx.checker.check_model(old)
    return old
