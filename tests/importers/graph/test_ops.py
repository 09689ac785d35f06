"""The op table's one evaluator (:func:`oversmooth.importers.graph.ops.fold`): what onnxruntime computes.

An op's value is ``onnx.reference``'s at the opset the model imports, or one of the table's few
hand-written rules; either way it must be what onnxruntime computes on a one-node model of that
opset, dtype included (a folded float32 weight must be the runtime's). An op that may outgrow its
inputs is refused beyond ``max_elements`` before anything is allocated, and an op no rule or
reference implementation gives has no value.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph import GraphIndex, Node
from oversmooth.importers.graph.ops import FOLDERS, OPS, fold

F32, I64 = np.float32, np.int64
BIG = 2**40


def _f(*values: float) -> np.ndarray:
    return np.array(values, F32)


def _i(*values: int) -> np.ndarray:
    return np.array(values, I64)


_GRID = np.arange(24, dtype=F32).reshape(2, 3, 4) - 11.5
_HALVES = _f(-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -0.6)

#: (op, opset, inputs in order (None: omitted), attributes, outputs)
CASES = [
    ("Identity", 17, [_GRID], {}, 1),
    ("Constant", 13, [], {"value_floats": [1.5, -2.0]}, 1),
    ("Constant", 17, [], {"value_ints": [3, 4]}, 1),
    ("Cast", 13, [_GRID], {"to": TensorProto.FLOAT16}, 1),
    ("Cast", 21, [_HALVES], {"to": TensorProto.INT32}, 1),
    ("Transpose", 13, [_GRID], {"perm": [2, 0, 1]}, 1),
    ("Unsqueeze", 11, [_GRID], {"axes": [0, -1]}, 1),
    ("Unsqueeze", 13, [_GRID, _i(1)], {}, 1),
    ("Squeeze", 11, [_GRID[:1]], {"axes": [0]}, 1),
    ("Squeeze", 13, [_GRID[:1], _i(0)], {}, 1),
    ("Flatten", 13, [_GRID], {"axis": 2}, 1),
    ("Concat", 13, [_GRID, _GRID], {"axis": -1}, 1),
    ("Gather", 13, [_GRID, _i(-1, 0, 2)], {"axis": 1}, 1),
    ("GatherND", 13, [_GRID, np.array([[[1, 2]], [[0, -1]]], I64)], {"batch_dims": 1}, 1),
    ("Neg", 13, [_GRID], {}, 1),
    ("Abs", 13, [_GRID], {}, 1),
    ("Sqrt", 13, [np.abs(_GRID)], {}, 1),
    ("Reciprocal", 13, [_HALVES], {}, 1),
    ("Floor", 13, [_HALVES], {}, 1),
    ("Ceil", 13, [_HALVES], {}, 1),
    ("Round", 13, [_HALVES], {}, 1),
    ("Add", 14, [_GRID, _f(1, 2, 3, 4)], {}, 1),
    ("Sub", 14, [_i(7, -7), _i(2)], {}, 1),
    ("Mul", 14, [_GRID, _f(0.5)], {}, 1),
    ("Div", 14, [_i(7, -7, 6, -1), _i(2, 2, -4, 3)], {}, 1),
    ("Div", 14, [_GRID, _f(3, 7, -9, 11)], {}, 1),
    ("Pow", 15, [np.abs(_GRID), _f(0.5)], {}, 1),
    ("Mod", 13, [_i(7, -7, 7, -7), _i(3, 3, -3, -3)], {}, 1),
    ("Mod", 13, [_f(7.5, -7.5), _f(2, 2)], {"fmod": 1}, 1),
    ("Max", 13, [_GRID, _f(0), _f(-3, 1, 5, -20)], {}, 1),
    ("Min", 13, [_GRID, _f(2, -1, 0, 30)], {}, 1),
    ("Equal", 13, [_i(1, 2, 3), _i(2)], {}, 1),
    ("Greater", 13, [_HALVES, _f(0)], {}, 1),
    ("Less", 13, [_HALVES, _f(0)], {}, 1),
    ("GreaterOrEqual", 16, [_HALVES, _f(0.5)], {}, 1),
    ("LessOrEqual", 16, [_HALVES, _f(0.5)], {}, 1),
    ("And", 7, [np.array([True, False, True]), np.array([True])], {}, 1),
    ("Or", 7, [np.array([True, False, False]), np.array([False])], {}, 1),
    ("Not", 1, [np.array([True, False])], {}, 1),
    ("Where", 16, [_HALVES > 0, _HALVES, _f(-1e4)], {}, 1),
    ("Range", 11, [np.array(2, I64), np.array(11, I64), np.array(3, I64)], {}, 1),
    ("Range", 11, [np.array(0.5, F32), np.array(-1, F32), np.array(-0.25, F32)], {}, 1),
    ("ReduceProd", 13, [_GRID], {"axes": [1]}, 1),
    ("ReduceProd", 18, [_GRID, _i(-1)], {"keepdims": 0}, 1),
    ("Expand", 13, [_f(1, 2), _i(3, 1, 2)], {}, 1),
    ("Tile", 13, [_GRID[0], _i(2, 1)], {}, 1),
    ("ConstantOfShape", 9, [_i(2, 3)], {"value": numpy_helper.from_array(_i(7))}, 1),
    ("Slice", 13, [_GRID, _i(-1), _i(-(10**9)), _i(2), _i(-2)], {}, 1),
    ("Split", 13, [_GRID, _i(1, 3)], {"axis": 2}, 2),
    ("Split", 18, [_GRID], {"axis": 1, "num_outputs": 2}, 2),
    ("Reshape", 14, [_GRID, _i(0, -1)], {}, 1),
    ("Clip", 6, [_HALVES], {"min": -1.0, "max": 1.0}, 1),  # no table value: the reference's
    ("Clip", 13, [_HALVES, np.array(-1, F32), np.array(1, F32)], {}, 1),
    (
        "QuantizeLinear",
        13,
        [_f(1e10, -1e10, np.inf, -np.inf, 2.5, -0.5), np.array(1, F32), None],
        {},
        1,
    ),
    ("QuantizeLinear", 21, [_HALVES * 100, np.array(0.5, F32), np.array(-3, np.int8)], {}, 1),
    ("DequantizeLinear", 21, [np.array([-128, 0, 127], np.int8), np.array(0.5, F32)], {}, 1),
]


def _one_node(op: str, opset: int, values: list, attributes: dict, outputs: int):
    """A one-node model of ``op`` at ``opset`` whose inputs are graph inputs, with its output types
    inferred; the node's input and output names."""
    names = [f"in{i}" if value is not None else "" for i, value in enumerate(values)]
    node = helper.make_node(op, names, [f"out{i}" for i in range(outputs)], **attributes)
    inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape
        )
        for name, value in zip(names, values, strict=True)
        if value is not None
    ]
    graph = helper.make_graph(
        [node], op, inputs, [helper.make_empty_tensor_value_info(name) for name in node.output]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), names


def _runtime(model: onnx.ModelProto, names: list[str], values: list) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {name: value for name, value in zip(names, values, strict=True) if name}
    return session.run(None, feeds)


def _case_id(case: tuple) -> str:
    op, opset, _, attributes, _ = case
    return f"{op}@{opset}" + ("-" + "-".join(sorted(attributes)) if attributes else "")


@pytest.mark.parametrize("case", CASES, ids=[_case_id(case) for case in CASES])
def test_the_tables_value_is_onnxruntimes(case: tuple) -> None:
    """Read through the graph index, as the importer does: the node carries the model's opset."""
    op, opset, values, attributes, outputs = case
    model, names = _one_node(op, opset, values, attributes, outputs)
    (node,) = GraphIndex(model.graph, opset_import=model.opset_import).nodes
    assert node.opset == opset
    expected = _runtime(model, names, values)
    for output in range(outputs):
        found = fold(node, values, output)
        assert found is not None
        assert found.dtype == expected[output].dtype, (op, output)
        np.testing.assert_array_equal(found, expected[output], strict=True)


def test_the_value_is_read_at_the_models_opset() -> None:
    """Clip's bounds are attributes up to opset 10 and inputs from 11: the same node has a value
    at the opset that spells it so, and none at the newest."""
    clip = helper.make_node("Clip", ["x"], ["y"], min=-1.0, max=1.0)
    np.testing.assert_array_equal(fold(Node(0, clip, 6), [_HALVES]), np.clip(_HALVES, -1, 1))
    with pytest.raises(ValueError, match="Clip"):
        fold(Node(0, clip, None), [_HALVES])


def test_dequantize_per_axis_at_opset_13_folds_exactly() -> None:
    """onnx.reference implements DequantizeLinear from opset 19 only: the hand-written rule folds
    an int8 weight per output column to ``(x - zero_point) * scale`` in float32, bit for bit."""
    rng = np.random.default_rng(3)
    codes = rng.integers(-128, 128, size=(5, 3), dtype=np.int8)
    scale = np.array([0.017, 0.5, 3.25e-3], F32)
    zero_point = np.array([-3, 0, 127], np.int8)
    model, names = _one_node("DequantizeLinear", 13, [codes, scale, zero_point], {"axis": 1}, 1)
    (node,) = GraphIndex(model.graph, opset_import=model.opset_import).nodes
    folded = fold(node, [codes, scale, zero_point])
    assert folded is not None
    assert folded.dtype == F32
    exact = (codes.astype(np.int32) - zero_point.astype(np.int32)).astype(F32) * scale
    np.testing.assert_array_equal(folded, exact, strict=True)
    np.testing.assert_array_equal(folded, _runtime(model, names, [codes, scale, zero_point])[0])
    assert FOLDERS["DequantizeLinear"](node, [codes, scale, zero_point]) is not None


@pytest.mark.parametrize(
    ("op", "values"),
    [
        ("Expand", [np.zeros(1, np.int8), _i(BIG)]),
        ("Tile", [np.zeros(1, np.int8), _i(BIG)]),
        ("ConstantOfShape", [_i(2**20, 2**20)]),
        ("Range", [np.array(0, I64), np.array(BIG, I64), np.array(1, I64)]),
        ("Add", [np.zeros((2**20, 1), np.int8), np.zeros((1, 2**20), np.int8)]),
        ("Gather", [np.zeros((2, 2**20), np.int8), np.zeros(2**20, I64)]),
    ],
)
def test_an_output_beyond_the_limit_is_refused_before_it_is_built(op: str, values: list) -> None:
    """2^40 elements: unknown (None) at once, nothing of that size allocated."""
    node = Node(0, helper.make_node(op, [f"in{i}" for i in range(len(values))], ["y"]), 17)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        assert fold(node, values) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert time.perf_counter() - start < 1.0


def test_an_op_that_may_grow_is_not_built_when_its_size_cannot_be_told() -> None:
    """A Pad whose axes input is named but unknown: its shape rule cannot tell the output's size,
    so it is unknown (None), not padded on every axis by the reference unchecked."""
    node = Node(0, helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"]), 18)
    pads = _i(2**21, 2**21, 2**21, 2**21)
    assert fold(node, [np.zeros((2, 2), F32), pads, None, None]) is None


def test_the_guard_follows_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "100")
    add = Node(0, helper.make_node("Add", ["a", "b"], ["y"]), 17)
    assert fold(add, [np.zeros((10, 1)), np.zeros((1, 10))]) is not None
    assert fold(add, [np.zeros((10, 1)), np.zeros((1, 11))]) is None


@pytest.mark.parametrize(
    "node",
    [
        helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft"),
        helper.make_node("NoSuchOp", ["a", "b"], ["y"]),
        helper.make_node("Gelu", ["a", "b"], ["y"], domain="com.microsoft"),
    ],
    ids=lambda node: f"{node.domain or 'ai.onnx'}.{node.op_type}",
)
def test_an_op_with_no_value_anywhere_has_none(node: onnx.NodeProto) -> None:
    assert fold(Node(0, node, 17), [np.ones((2, 2), F32), np.ones((2, 2), F32)]) is None


def test_an_attribute_stored_outside_the_model_is_never_read() -> None:
    """Only the graph index reads external data (from inside the model's folder); the reference
    would resolve the location against the working directory."""
    value = numpy_helper.from_array(_f(1))
    value.data_location = TensorProto.EXTERNAL
    value.ClearField("raw_data")
    value.external_data.add(key="location", value="../../etc/passwd")
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)
    assert fold(Node(0, node, 17), [_i(2)]) is None


def test_shape_arithmetic_evaluates_only_the_ops_it_did() -> None:
    """The set of ops whose value shape arithmetic and the layout probe read is the table's own
    (fold evaluates more, for the score terms, but the shape context asks only these)."""
    valued = sorted(op for op, semantics in OPS.items() if semantics.value is not None)
    assert valued == sorted(
        "Abs Add And Cast Ceil Concat Constant ConstantOfShape DequantizeLinear Div Equal Expand "
        "Flatten Floor Gather GatherND Greater GreaterOrEqual Identity Less LessOrEqual Max Min "
        "Mod Mul Neg Not Or Pow QuantizeLinear Range Reciprocal ReduceProd Reshape Round Slice "
        "Split Sqrt Squeeze Sub Tile Transpose Unsqueeze Where".split()
    )
