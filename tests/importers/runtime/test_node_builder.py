"""NodeBuilder: fresh names, shared constants, and each op spelled for the graph's opset."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.runtime.node_builder import NodeBuilder

#: Opsets whose spellings differ: attributes (7), Slice bounds as inputs (10), ReduceSum and
#: Unsqueeze axes as inputs (13), every reduction's axes as inputs (18).
OPSETS = [7, 9, 10, 13, 18]


def _run(builder: NodeBuilder, outputs: list[str], x: np.ndarray) -> list[np.ndarray]:
    graph = helper.make_graph(
        builder.nodes,
        "built",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, list(x.shape))],
        [helper.make_tensor_value_info(name, TensorProto.DOUBLE, None) for name in outputs],
        initializer=list(builder.initializers.values()),
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", builder.opset)], ir_version=7
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(outputs, {"x": x})


@pytest.mark.parametrize("opset", OPSETS)
def test_each_op_is_spelled_for_the_opset_and_computes_the_same(opset: int) -> None:
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    b = NodeBuilder(opset, {"x"}, "test")
    summed = b.reduce("ReduceSum", "x", [2], "sum")
    largest = b.reduce("ReduceMax", "x", [1], "max", keepdims=1)
    inner = b.slice("x", 1, 3, 1, "slice")
    lifted = b.unsqueeze(summed, 0, "lift")
    ones = b.ones_like_lead("x", "ones")
    got = _run(b, [summed, largest, inner, lifted, ones], x)
    for value, expected in zip(
        got,
        [x.sum(2), x.max(1, keepdims=True), x[:, 1:3], x.sum(2)[None], np.ones((2, 3))],
        strict=True,
    ):
        np.testing.assert_array_equal(value, expected)


def test_names_are_fresh_and_equal_constants_are_stored_once() -> None:
    b = NodeBuilder(18, {"x"}, "ns")
    first, second = b.op("Abs", ["x"], "abs"), b.op("Abs", ["x"], "abs")
    assert first != second
    assert first.startswith("ns.abs.")
    assert b.const([1, 2], np.int64) == b.const(np.array([1, 2]), np.int64)
    assert b.const([1, 2], np.int64) != b.const([1, 2], np.float64)
    assert len(b.initializers) == 2


def test_a_name_the_graph_already_has_is_refused() -> None:
    with pytest.raises(
        ImporterInputError, match=re.escape("already has a tensor named 'ns.abs.1'")
    ):
        NodeBuilder(18, {"ns.abs.1"}, "ns").op("Abs", ["x"], "abs")
    with pytest.raises(ImporterInputError, match="already has a tensor named 'y'"):
        NodeBuilder(18, {"y"}, "ns").output("Abs", ["x"], "y")
