"""Navigation over a graph (:mod:`oversmooth.importers.graph.index`): producers and consumers,
naming an optional output, constants folded from chains of constants (numpy's answer in the
graph's dtype, None for anything read from an input or caught in a cycle), and the tensors a graph
stores, subgraphs included.

Hostile external data (outside the folder, links, the model file itself) is ``test_hostile``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.errors import ExternalDataError, ModelFileError
from oversmooth.importers.graph.index import (
    GraphIndex,
    external_data_path,
    graph_tensors,
    uses_external_data,
)

F = TensorProto.FLOAT
CODES = np.array([[-128, -3], [7, 127]], np.int8)


def _graph(nodes: list, initializers: list, inputs=("x",)) -> onnx.GraphProto:
    return helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, F, [2, 2]) for name in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], F, None)],
        initializers,
    )


def _index() -> GraphIndex:
    """``w = Cast(codes) * 0.5`` folded, ``y = x + w``, ``z = Identity(z2)``/``z2 = Identity(z)``
    (a cycle) and a node reading ``ghost``, defined nowhere."""
    nodes = [
        helper.make_node("Cast", ["codes"], ["as_float"], to=F),
        helper.make_node("Mul", ["as_float", "half"], ["w"]),
        helper.make_node("Transpose", ["w"], ["wT"], perm=[1, 0]),
        helper.make_node("Add", ["x", "wT"], ["y"]),
        helper.make_node("Identity", ["z2"], ["z"]),
        helper.make_node("Identity", ["z"], ["z2"]),
        helper.make_node("Add", ["ghost", "y"], ["out"]),
    ]
    inits = [
        numpy_helper.from_array(CODES, "codes"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    model = helper.make_model(_graph(nodes, inits), opset_imports=[helper.make_opsetid("", 17)])
    return GraphIndex(model.graph, opset_import=model.opset_import)


def test_producers_consumers_and_definitions() -> None:
    index = _index()
    assert index.producer("w").op_type == "Mul"
    assert index.producer("x") is None
    assert index.producer("codes") is None
    assert [node.op_type for node in index.consumers("y")] == ["Add"]
    assert [node.outputs[0] for node in index.consumers("z")] == ["z2"]
    assert [node.position for node in index.nodes_of_type("Identity")] == [4, 5]
    assert all(index.is_defined(name) for name in ("x", "codes", "w", "z2"))
    assert not index.is_defined("ghost")
    assert [(node.op_type, name) for node, name in index.undefined_inputs()] == [("Add", "ghost")]
    assert {node.opset for node in index.nodes} == {17}


def test_a_chain_of_constants_is_folded_in_the_graphs_dtype() -> None:
    """The int8 codes cast and halved, then transposed: numpy's float32 answer exactly."""
    index = _index()
    expected = (CODES.astype(np.float32) * np.float32(0.5)).T
    found = index.constant_value("wT")
    np.testing.assert_array_equal(found, expected, strict=True)
    assert index.is_constant("w")
    assert not index.is_constant("y")  # reads the graph input x
    assert index.constant_value("x") is None
    assert index.constant_value("") is None


def test_a_cycle_is_no_constant() -> None:
    index = _index()
    assert index.constant_value("z") is None
    assert index.constant_value("z2") is None


def test_naming_an_optional_output_keeps_an_existing_name() -> None:
    """A LayerNormalization with one output gets its third named (the second padded empty); an
    output that has a name keeps it."""
    x = helper.make_tensor_value_info("x", F, [2, 4])
    node = helper.make_node("LayerNormalization", ["x", "g"], ["normed"])
    graph = helper.make_graph(
        [node],
        "g",
        [x],
        [helper.make_tensor_value_info("normed", F, None)],
        [numpy_helper.from_array(np.ones(4, np.float32), "g")],
    )
    index = GraphIndex(graph)
    (norm,) = index.nodes
    assert index.name_output(norm, 2, "inv_std") == "inv_std"
    assert list(norm.proto.output) == ["normed", "", "inv_std"]
    assert index.producer("inv_std") is norm
    assert index.is_defined("inv_std")
    assert index.name_output(norm, 0, "other") == "normed"
    assert not index.is_defined("other")


def test_a_truncated_initializer_is_a_model_file_error() -> None:
    tensor = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    tensor.raw_data = tensor.raw_data[:10]
    with pytest.raises(ModelFileError, match=r"'w' cannot be decoded .* may be truncated"):
        GraphIndex(_graph([helper.make_node("Identity", ["w"], ["y"])], [tensor])).read_tensor(
            tensor
        )


def test_graph_tensors_reach_into_subgraphs() -> None:
    """Initializers, a Constant's value and an If branch's initializer, in that order; only a
    tensor stored in a file counts as external data."""
    inner = numpy_helper.from_array(np.zeros(1, np.float32), "inner")
    branch = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["b"])],
        "branch",
        [],
        [helper.make_tensor_value_info("b", F, None)],
        [inner],
    )
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], value=numpy_helper.from_array(np.ones(1, np.float32), "cv")
        ),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch),
    ]
    outer = numpy_helper.from_array(np.ones(1, np.float32), "outer")
    graph = _graph(nodes, [outer], inputs=())
    assert [t.name for t in graph_tensors(graph)] == ["outer", "cv", "inner", "inner"]
    assert not uses_external_data(graph)
    inner.data_location = TensorProto.EXTERNAL
    graph.node[1].attribute[0].g.initializer[0].data_location = TensorProto.EXTERNAL
    assert uses_external_data(graph)


def test_an_external_location_resolves_inside_the_folder_only(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    assert (
        external_data_path(tmp_path, "data/w.bin", "w") == (tmp_path / "data" / "w.bin").resolve()
    )
    for location in ("", "/etc/passwd", "C:\\w.bin", "data/../../w.bin"):
        with pytest.raises(ExternalDataError, match="initializer 'w'"):
            external_data_path(tmp_path, location, "w")
    with pytest.raises(ExternalDataError, match="a model without a path"):
        external_data_path(None, "w.bin", "w")
