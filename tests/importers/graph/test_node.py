"""One graph node (importers.graph.node): its label, its attributes as Python values (tensors as
arrays, external ones never resolved), its raw tensor attributes, and its optional inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph.node import DEFAULT_DOMAINS, Node


def _node(**attributes: object) -> Node:
    """Node 7 of a graph: a nameless ``Constant`` with ``attributes``."""
    return Node(7, helper.make_node("Constant", [], ["c"], **attributes))


def test_a_node_is_labelled_by_its_name_or_its_op_and_position() -> None:
    named = Node(3, helper.make_node("Softmax", ["s"], ["p"], name="attn/Softmax"))
    assert named.label == "attn/Softmax"
    assert _node(value_float=1.0).label == "Constant#7"


def test_the_proto_is_read_through() -> None:
    node = Node(0, helper.make_node("Skip", ["a", "", "b"], ["y", "sum"], domain="com.microsoft"))
    assert (node.op_type, node.domain) == ("Skip", "com.microsoft")
    assert node.inputs == ["a", "", "b"]
    assert node.outputs == ["y", "sum"]
    assert [node.input(i) for i in range(5)] == ["a", "", "b", "", ""]  # omitted and absent: ""
    assert DEFAULT_DOMAINS == ("", "ai.onnx")


@pytest.mark.parametrize(
    ("attributes", "name", "expected"),
    [
        ({"axis": -1}, "axis", -1),
        ({"alpha": 0.5}, "alpha", 0.5),
        ({"perm": [0, 2, 1, 3]}, "perm", [0, 2, 1, 3]),
        ({"mode": "constant"}, "mode", b"constant"),
    ],
)
def test_attributes_are_python_values(attributes: dict, name: str, expected: object) -> None:
    node = Node(0, helper.make_node("Op", ["x"], ["y"], **attributes))
    assert node.attr(name) == expected
    assert node.attr("absent", "fallback") == "fallback"
    assert node.attr("absent") is None


def test_a_tensor_attribute_is_an_array_and_its_proto() -> None:
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    node = _node(value=numpy_helper.from_array(value))
    np.testing.assert_array_equal(node.attr("value"), value)
    raw = node.tensor_attr("value")
    assert isinstance(raw, onnx.TensorProto)
    np.testing.assert_array_equal(numpy_helper.to_array(raw), value)
    assert node.tensor_attr("absent") is None
    assert _node(value_float=1.0).tensor_attr("value_float") is None  # not a tensor


def test_an_external_tensor_attribute_is_never_resolved() -> None:
    """Its file would be looked up in the current folder: only the graph index may read it."""
    tensor = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2])
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "elsewhere.bin"
    node = _node(value=tensor)
    assert node.attr("value", "unread") == "unread"
    assert node.tensor_attr("value") == tensor  # the reference itself is there to follow
