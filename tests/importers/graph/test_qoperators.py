"""Quantised operators (QOperator form) expanded into ``DequantizeLinear`` → float op →
``QuantizeLinear``, and integer codes moved by layout ops dequantised before the move.

Each operator's expansion is checked against onnxruntime's own integer kernel on one node with
random codes: the output codes agree, except where the float32 product lands within rounding of a
half step (at most one code, on at most :data:`MOVED_FRACTION` of them). A constant operand whose
float32 dequantisation overflows (a quantised ``finfo.min`` mask) is saturated, as the kernel
never forms it. A node with an output scale that is not a constant is left as it is;
``QAttention`` runs as the ``Attention`` of its dequantised operands and is matched. For reading, a
``DequantizeLinear`` of moved codes climbs the moves to its ``QuantizeLinear`` (a pair then),
and only then: codes of ``DynamicQuantizeLinear`` and integer weights are read as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph import GraphIndex, model_from_proto
from oversmooth.importers.graph.qoperators import expand_quantized_operators
from oversmooth.importers.graph.quantized import read_through_activation_pairs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.weights import block_weights
from tests.importers.family_corpus import fixture_bytes

MS = "com.microsoft"
SEED = 11
#: Codes that may move by one step between the integer kernel and its float expansion: onnxruntime
#: requantises an exact integer accumulator, the expansion a float32 result, and a value within
#: float32 rounding of a half step rounds either way.
MOVED_FRACTION = 0.02
I8, U8, F = TensorProto.INT8, TensorProto.UINT8, TensorProto.FLOAT


def _codes(rng: np.random.Generator, shape: tuple[int, ...], dtype: type = np.int8) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _model(
    node: onnx.NodeProto,
    inputs: dict[str, np.ndarray],
    constants: dict[str, np.ndarray],
    output_type: int,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "one",
        [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape
            )
            for name, value in inputs.items()
        ],
        [helper.make_tensor_value_info(node.output[0], output_type, None)],
        [numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
        ir_version=9,
    )


def _scalar(value: float) -> np.ndarray:
    return np.array(value, np.float32)


def _case(name: str, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One quantised node with its feeds: the integer inputs fed, scales and weights constant."""
    zero8 = np.array(0, np.int8)
    if name in ("QLinearMatMul", "QLinearMatMul_per_column"):
        per_column = name.endswith("per_column")
        b_scale = rng.uniform(0.005, 0.02, 6) if per_column else rng.uniform(0.005, 0.02)
        node = helper.make_node(
            "QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"]
        )
        constants = {
            "sa": _scalar(0.05),
            "za": zero8,
            "b": _codes(rng, (16, 6)),
            "sb": np.asarray(b_scale, np.float32),
            "zb": np.zeros(np.shape(b_scale), np.int8),
            "sy": _scalar(0.4),
            "zy": np.array(3, np.int8),
        }
        feeds = {"a": _codes(rng, (2, 5, 16))}
        return _model(node, feeds, constants, I8), feeds
    if name in ("QLinearAdd", "QLinearMul"):
        node = helper.make_node(
            name, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain=MS
        )
        constants = {
            "sa": _scalar(0.05),
            "za": np.array(4, np.uint8),
            "sb": _scalar(0.03),
            "zb": np.array(200, np.uint8),
            "sy": _scalar(0.07 if name == "QLinearAdd" else 0.04),
            "zy": np.array(128, np.uint8),
        }
        feeds = {"a": _codes(rng, (3, 8), np.uint8), "b": _codes(rng, (3, 8), np.uint8)}
        return _model(node, feeds, constants, U8), feeds
    unary = {
        "QLinearSoftmax": ({"axis": -1, "opset": 13}, (2, 3, 7)),
        "QLinearSigmoid": ({}, (4, 9)),
        "QLinearLeakyRelu": ({"alpha": 0.1}, (4, 9)),
        "QLinearAveragePool": ({"kernel_shape": [2], "strides": [1]}, (2, 3, 8)),
        "QLinearGlobalAveragePool": ({}, (2, 3, 8)),
    }
    if name in unary:
        attributes, shape = unary[name]
        node = helper.make_node(name, ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attributes)
        y_scale = 1 / 256 if name == "QLinearSoftmax" else 0.02
        y_zero = np.array(0 if name == "QLinearSoftmax" else 5, np.uint8)
        constants = {
            "sx": _scalar(0.1),
            "zx": np.array(128, np.uint8),
            "sy": _scalar(y_scale),
            "zy": y_zero,
        }
        feeds = {"x": _codes(rng, shape, np.uint8)}
        return _model(node, feeds, constants, U8), feeds
    if name == "QLinearConcat":
        node = helper.make_node(
            name, ["sy", "zy", "a", "sa", "za", "b", "sb", "zb"], ["y"], domain=MS, axis=1
        )
        constants = {
            "sy": _scalar(0.06),
            "zy": zero8,
            "sa": _scalar(0.05),
            "za": zero8,
            "sb": _scalar(0.08),
            "zb": np.array(-3, np.int8),
        }
        feeds = {"a": _codes(rng, (2, 3)), "b": _codes(rng, (2, 4))}
        return _model(node, feeds, constants, I8), feeds
    if name in ("QGemm", "QGemm_float_output"):
        node_inputs = ["a", "sa", "za", "b", "sb", "zb", "c"]
        node_inputs += ["sy", "zy"] if name == "QGemm" else []
        node = helper.make_node("QGemm", node_inputs, ["y"], domain=MS, transB=1, alpha=0.5)
        constants = {
            "sa": _scalar(0.05),
            "za": zero8,
            "b": _codes(rng, (6, 16)),
            "sb": rng.uniform(0.005, 0.02, 6).astype(np.float32),
            "zb": np.zeros(6, np.int8),
            "c": rng.integers(-500, 500, 6).astype(np.int32),
            "sy": _scalar(0.3),
            "zy": zero8,
        }
        feeds = {"a": _codes(rng, (5, 16))}
        return _model(node, feeds, constants, I8 if name == "QGemm" else F), feeds
    if name == "DynamicQuantizeMatMul":
        node = helper.make_node(name, ["a", "b", "sb", "zb", "bias"], ["y"], domain=MS)
        constants = {
            "b": _codes(rng, (16, 6)),
            "sb": rng.uniform(0.005, 0.02, 6).astype(np.float32),
            "zb": np.zeros(6, np.int8),
            "bias": rng.normal(size=6).astype(np.float32),
        }
        feeds = {"a": rng.normal(size=(2, 5, 16)).astype(np.float32)}
        return _model(node, feeds, constants, F), feeds
    if name == "MatMulIntegerToFloat":
        node = helper.make_node(name, ["a", "b", "sa", "sb", "za", "zb"], ["y"], domain=MS)
        constants = {
            "b": _codes(rng, (16, 6)),
            "sa": _scalar(0.03),
            "sb": _scalar(0.01),
            "za": np.array(128, np.uint8),
            "zb": np.array(0, np.int8),
        }
        feeds = {"a": _codes(rng, (5, 16), np.uint8)}
        return _model(node, feeds, constants, F), feeds
    if name == "FusedMatMul":
        node = helper.make_node(name, ["q", "k"], ["y"], domain=MS, transB=1, alpha=0.125)
        feeds = {
            "q": rng.normal(size=(2, 4, 5, 8)).astype(np.float32),
            "k": rng.normal(size=(2, 4, 5, 8)).astype(np.float32),
        }
        return _model(node, feeds, {}, F), feeds
    if name == "QLinearConv":
        node = helper.make_node(
            name,
            ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"],
            ["y"],
            kernel_shape=[3],
            pads=[1, 1],
        )
        constants = {
            "sx": _scalar(0.05),
            "zx": zero8,
            "w": _codes(rng, (4, 2, 3)),
            "sw": rng.uniform(0.005, 0.02, 4).astype(np.float32),
            "zw": np.zeros(4, np.int8),
            "sy": _scalar(0.2),
            "zy": zero8,
            "bias": rng.integers(-300, 300, 4).astype(np.int32),
        }
        feeds = {"x": _codes(rng, (2, 2, 9))}
        return _model(node, feeds, constants, I8), feeds
    raise AssertionError(name)


CASES = [
    "QLinearMatMul",
    "QLinearMatMul_per_column",
    "QLinearAdd",
    "QLinearMul",
    "QLinearSoftmax",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearConcat",
    "QGemm",
    "QGemm_float_output",
    "QLinearConv",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "FusedMatMul",
]


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("name", CASES)
def test_an_expanded_operator_computes_what_the_integer_kernel_does(name: str) -> None:
    model, feeds = _case(name, np.random.default_rng(SEED))
    expansion = expand_quantized_operators(model, GraphIndex(model.graph))
    assert expansion.proto is not None
    assert expansion.expanded == ((model.graph.node[0].op_type, 1),)
    ops = [node.op_type for node in expansion.proto.graph.node]
    assert model.graph.node[0].op_type not in ops
    kernel, expanded = _run(model, feeds), _run(expansion.proto, feeds)
    assert expanded.dtype == kernel.dtype
    assert expanded.shape == kernel.shape
    if kernel.dtype == np.float32:  # float outputs: QGemm without an output scale, the fused
        # dynamic products
        np.testing.assert_allclose(expanded, kernel, rtol=1e-5, atol=1e-5)
        return
    steps = np.abs(expanded.astype(np.int64) - kernel.astype(np.int64))
    assert steps.max() <= 1
    assert np.count_nonzero(steps) <= MOVED_FRACTION * steps.size


def test_a_constant_whose_float_dequantisation_overflows_is_saturated() -> None:
    """``(1 − mask) · finfo.min`` quantised with a scale a hair too large: kept tokens stay 0,
    as in the integer kernel (float32 dequantisation would give 0 · −inf = NaN → the lowest code:
    every token masked)."""
    node = helper.make_node(
        "QLinearMul", ["keep", "s1", "z", "big", "sbig", "z", "s1", "z"], ["y"], domain=MS
    )
    constants = {
        "s1": _scalar(1.0),
        "z": np.array(0, np.int8),
        "big": np.array(-127, np.int8),
        "sbig": _scalar(2.6793887e36),
    }
    feeds = {"keep": np.array([[0, 0, 1, 1]], np.int8)}
    model = _model(node, feeds, constants, I8)
    expansion = expand_quantized_operators(model, GraphIndex(model.graph))
    assert expansion.proto is not None
    np.testing.assert_array_equal(_run(expansion.proto, feeds), _run(model, feeds))
    np.testing.assert_array_equal(_run(expansion.proto, feeds), [[0, 0, -128, -128]])


def test_an_operator_whose_output_scale_is_computed_is_left_as_it_is() -> None:
    model, _ = _case("QLinearAdd", np.random.default_rng(SEED))
    scale = next(t for t in model.graph.initializer if t.name == "sy")
    model.graph.initializer.remove(scale)
    model.graph.input.append(helper.make_tensor_value_info("sy", F, []))
    expansion = expand_quantized_operators(model, GraphIndex(model.graph))
    assert expansion.proto is None


def _moved_codes_model(quantiser: str) -> onnx.ModelProto:
    """x → (``QuantizeLinear`` or ``DynamicQuantizeLinear``) → Reshape → Transpose →
    ``DequantizeLinear`` → Relu."""
    nodes: list[Any] = []
    if quantiser == "QuantizeLinear":
        nodes.append(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["codes"]))
        scale, zero = "s", "z"
    else:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["x"], ["codes", "ds", "dz"]))
        scale, zero = "ds", "dz"
    nodes += [
        helper.make_node("Reshape", ["codes", "shape"], ["split"]),
        helper.make_node("Transpose", ["split"], ["moved"], perm=[0, 2, 1, 3]),
        helper.make_node("DequantizeLinear", ["moved", scale, zero], ["float"]),
        helper.make_node("Relu", ["float"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "moved",
        [helper.make_tensor_value_info("x", F, [2, 3, 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [
            numpy_helper.from_array(np.float32(0.05), "s"),
            numpy_helper.from_array(np.uint8(128), "z"),
            numpy_helper.from_array(np.array([2, 3, 2, 4], np.int64), "shape"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_a_dequantisation_of_moved_codes_reads_the_moves_of_the_float_tensor() -> None:
    proto = _moved_codes_model("QuantizeLinear")
    read, read_through = read_through_activation_pairs(proto, GraphIndex(proto.graph))
    assert read is not None
    assert read_through is not None
    assert read_through.pairs == 1
    assert [(n.op_type, n.input[0]) for n in read.graph.node] == [
        ("Reshape", "x"),
        ("Transpose", read.graph.node[0].output[0]),
        ("Relu", "float"),
    ]
    x = np.random.default_rng(SEED).normal(size=(2, 3, 8)).astype(np.float32)
    shipped, as_read = _run(proto, {"x": x}), _run(read, {"x": x})
    np.testing.assert_allclose(as_read, shipped, atol=0.05 / 2 + 1e-7)  # half a step


def test_codes_of_a_dynamic_quantiser_are_not_moved() -> None:
    proto = _moved_codes_model("DynamicQuantizeLinear")
    read, read_through = read_through_activation_pairs(proto, GraphIndex(proto.graph))
    assert read is None
    assert read_through is None


def test_the_expansion_is_what_onnxruntime_runs_and_what_the_matcher_reads_through() -> None:
    model, _ = _case("QLinearMatMul", np.random.default_rng(SEED))
    loaded = model_from_proto(model)
    assert loaded.read_through is not None
    assert loaded.read_through.expanded == (("QLinearMatMul", 1),)
    assert "QLinearMatMul ×1" in loaded.read_through.note()
    assert "QLinearMatMul" not in {node.op_type for node in loaded.session_model().graph.node}


def _qattention_block(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """x → DynamicQuantizeLinear → QAttention (4 heads of 4, packed int8 QKV weight, one scale
    per column) → W_O → + x, as ``quantize_dynamic`` writes an optimizer-fused attention; with
    the dequantised packed weight and W_O."""
    d, heads = 16, 4
    codes = _codes(rng, (d, 3 * d))
    scale = rng.uniform(0.01, 0.03, 3 * d).astype(np.float32)
    w_o = (rng.normal(size=(d, d)) / 4).astype(np.float32)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node(
            "QAttention",
            ["xq", "w", "b", "xs", "ws", "", "xz", "wz"],
            ["context"],
            domain=MS,
            num_heads=heads,
        ),
        helper.make_node("MatMul", ["context", "w_o"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["y"]),
    ]
    constants = {
        "w": codes,
        "ws": scale,
        "wz": np.zeros(3 * d, np.int8),
        "b": (rng.normal(size=3 * d) / 10).astype(np.float32),
        "w_o": w_o,
    }
    graph = helper.make_graph(
        nodes,
        "qattention",
        [helper.make_tensor_value_info("x", F, ["batch", "tokens", d])],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
        ir_version=9,
    )
    return model, codes.astype(np.float32) * scale, w_o


def test_qattention_runs_as_the_attention_of_its_dequantised_operands_and_is_matched() -> None:
    rng = np.random.default_rng(SEED)
    model, packed, w_o = _qattention_block(rng)
    loaded = model_from_proto(model)
    assert loaded.read_through is not None
    assert ("QAttention", 1) in loaded.read_through.expanded
    x = {"x": rng.normal(size=(2, 5, 16)).astype(np.float32)}
    kernel, expanded = _run(model, x), _run(loaded.session_model(), x)
    np.testing.assert_allclose(expanded, kernel, rtol=1e-4, atol=1e-5)
    (block,) = find_attention_blocks(loaded).blocks
    weights = block_weights(loaded, block)
    assert (weights.n_heads, weights.d_head) == (4, 4)
    np.testing.assert_array_equal(weights.W_V, packed[:, 32:])
    np.testing.assert_array_equal(weights.W_Q, packed[:, :16])
    np.testing.assert_array_equal(weights.W_O, w_o)


@pytest.mark.parametrize("family", ["bert", "distilbert", "vit"])
def test_a_graph_saved_by_onnxruntimes_optimizer_reads_as_the_graph_it_optimised(
    tmp_path: Path, family: str
) -> None:
    """onnxruntime's session optimizer, saving a dynamically quantised graph, fuses its products
    into DynamicQuantizeMatMul / MatMulIntegerToFloat and Q·Kᵀ with its scale into FusedMatMul:
    read back, every block and product equals the graph it optimised."""
    source = fixture_bytes(f"{family}/int8.onnx.xz")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "saved.onnx")
    ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    saved = onnx.load(tmp_path / "saved.onnx")
    fused = {node.op_type for node in saved.graph.node}
    assert {"FusedMatMul", "DynamicQuantizeMatMul"} <= fused
    model, reference = model_from_proto(saved), model_from_proto(onnx.load_from_string(source))
    found, expected = find_attention_blocks(model).blocks, find_attention_blocks(reference).blocks
    assert len(found) == len(expected) == 2
    for block, twin in zip(found, expected, strict=True):
        got, want = block_weights(model, block), block_weights(reference, twin)
        assert block.score_bias == twin.score_bias
        assert block.scale == pytest.approx(twin.scale, rel=1e-6)  # float32 alpha vs Div by √d
        for role in ("W_Q", "W_K", "W_V", "W_O"):
            np.testing.assert_array_equal(getattr(got, role), getattr(want, role), err_msg=role)


def test_a_fusedmatmul_by_a_constant_weight_stays_the_projection_the_matcher_reads() -> None:
    """Only a product of two activations (Q·Kᵀ) is expanded; ``x · W`` stays fused."""
    rng = np.random.default_rng(SEED)
    node = helper.make_node("FusedMatMul", ["x", "w"], ["y"], domain=MS, transB=1, alpha=0.5)
    weight = rng.normal(size=(6, 8)).astype(np.float32)
    feeds = {"x": rng.normal(size=(2, 5, 8)).astype(np.float32)}
    model = _model(node, feeds, {"w": weight}, F)
    assert expand_quantized_operators(model, GraphIndex(model.graph)).proto is None
