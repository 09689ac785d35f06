"""Statically quantised activations: each ``QuantizeLinear`` → ``DequantizeLinear`` pair on an
activation is read as the float tensor it rounds, while onnxruntime runs the pairs.

Checked here on builder models with pairs inserted by :func:`with_activation_pairs` (before every
float activation a node reads, as ``quantize_static``'s QDQ form puts them; the committed
``quantize_static`` fixtures are checked against their truths in ``test_families.py``): the
matcher finds the same blocks and weights as in the float model; the audit runs the graph with
its pairs and measures what the float model does, to the pairs' rounding; the session names only
tensors of the shipped graph; weights stored as integers behind a ``DequantizeLinear`` (per
tensor or per axis) or as floats behind their own pair are the rounded weights the model
multiplies by; ``QuantizeLinear``'s fold equals onnxruntime's, ties and saturation included; a
pair that does more than round is kept.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.session import audit_session, layer_tensors
from oversmooth.importers.graph import GraphIndex, model_from_proto
from oversmooth.importers.graph.quantized import read_through_activation_pairs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import block_weights
from tests.importers.audited import builder_inputs
from tests.importers.builders import Assembly, assemble
from tests.importers.sessions import captured_sessions

SEED = 5
MS = "com.microsoft"
#: Tensors holding a mask's large negative entries stay float (a scale calibrated on them would
#: round every score to 0; ``quantize_static`` does that to Llama's masked scores).
MASKED = 1e3
#: Builder recipes quantised here: post-LN with a padding mask, pre-LN rotary GQA with a causal
#: mask, and a 2-D Gemm layout.
RECIPE_NAMES = ("bert_legacy", "llama_rmsnorm_rope_gqa", "gemm_transb")
#: Activations are rounded to 16 bits here (steps of max|x| / 32767): with onnxruntime's graph
#: optimisations off, every layer stays within this relative distance of the model without the
#: pairs (measured 1.2e-4 at most).
INT16_RTOL = 1e-3
#: At onnxruntime's default level its QDQ kernels, with the layers exposed as outputs, move the
#: layers of these small 16-bit graphs further (measured 1.2e-2 on BERT and Llama; 0 to 1e-3 on
#: the int8 ``quantize_static`` fixtures): the audit's metrics are compared at this distance.
QDQ_KERNEL_RTOL = 5e-2
#: Ops whose float inputs are not rounded: the quantisers never put a pair on a shape, index or
#: mask computation feeding them, nor on a norm's statistics.
_UNQUANTISED_READERS = frozenset(
    {
        "Shape",
        "Reshape",
        "Gather",
        "Unsqueeze",
        "Squeeze",
        "Concat",
        "Slice",
        "Expand",
        "Range",
        "ConstantOfShape",
        "Cast",
        "Equal",
        "Where",
        "Less",
        "Greater",
        "Not",
        "Trilu",
    }
)


def _float_tensors(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every float node output of ``model`` on ``feeds`` (the calibration)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [out for node in probe.graph.node for out in node.output if out]
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip(names, session.run(None, feeds), strict=True))
    return {k: v for k, v in values.items() if np.asarray(v).dtype == np.float32}


def with_activation_pairs(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, int]:
    """``model`` with a symmetric int16 ``QuantizeLinear`` → ``DequantizeLinear`` pair (onnxruntime's
    ``com.microsoft`` ops, which take 16 bits at every opset; one
    per tensor, shared by its readers, scale ``max|x| / 32767`` calibrated on ``feeds``) before
    every float activation input (not a constant, no mask entries: :data:`MASKED`) of every
    node but the shape, index and mask arithmetic; and how many pairs it holds."""
    index = GraphIndex(model.graph)
    values = {
        name: value
        for name, value in _float_tensors(model, feeds).items()
        if not index.is_constant(name)  # weights, scales: see _integer_weights
    }
    quantised = onnx.ModelProto()
    quantised.CopyFrom(model)
    nodes, pairs = [], {}
    for node in quantised.graph.node:
        if node.op_type not in _UNQUANTISED_READERS:
            for position, name in enumerate(node.input):
                if name in values and 0 < float(np.abs(values[name]).max()) < MASKED:
                    if name not in pairs:
                        pairs[name] = _pair_nodes(quantised.graph, name, values[name])
                        nodes += pairs[name][1]
                    node.input[position] = pairs[name][0]
        nodes.append(node)
    del quantised.graph.node[:]
    quantised.graph.node.extend(_topological(nodes, quantised.graph))
    if MS not in {entry.domain for entry in quantised.opset_import}:
        quantised.opset_import.append(helper.make_opsetid(MS, 1))
    return quantised, len(pairs)


def _pair_nodes(
    graph: onnx.GraphProto, name: str, value: np.ndarray
) -> tuple[str, list[onnx.NodeProto]]:
    scale, zero = f"{name}__scale", f"{name}__zero"
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.float32(np.abs(value).max() / 32767), scale),
            numpy_helper.from_array(np.int16(0), zero),
        ]
    )
    codes, read = f"{name}__codes", f"{name}__read"
    return read, [  # onnxruntime's own domain: 16-bit codes before opset 21
        helper.make_node("QuantizeLinear", [name, scale, zero], [codes], domain=MS),
        helper.make_node("DequantizeLinear", [codes, scale, zero], [read], domain=MS),
    ]


def _topological(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """``nodes`` reordered so every node follows the producers of its inputs."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    ordered, pending = [], list(nodes)
    while pending:
        progress = [n for n in pending if all(i in ready for i in n.input)]
        assert progress, "cycle"
        for node in progress:
            ordered.append(node)
            ready.update(node.output)
        pending = [n for n in pending if n not in progress]
    return ordered


@functools.cache
def assembly_of(name: str) -> Assembly:
    return assemble(name, SEED)


@functools.cache
def _quantised(name: str) -> tuple[onnx.ModelProto, int]:
    built = assembly_of(name).built
    return with_activation_pairs(built.model, built.inputs)


@functools.cache
def _weights_stored(name: str) -> onnx.ModelProto:
    return _integer_weights(assembly_of(name).built.model, per_axis=False)[0]


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_the_read_graph_has_the_float_models_blocks_and_weights(name: str) -> None:
    proto, n_pairs = _quantised(name)
    plain, model = model_from_proto(assembly_of(name).built.model), model_from_proto(proto)
    assert model.read_through is not None
    assert model.read_through.pairs == n_pairs > 20
    assert model.source is not None
    assert plain.read_through is None
    ops = {node.op_type for node in model.proto.graph.node}
    assert not ops & {"QuantizeLinear", "DequantizeLinear"}
    found, expected = find_attention_blocks(model).blocks, find_attention_blocks(plain).blocks
    assert [b.to_dict() for b in found] == [b.to_dict() for b in expected]
    for block, twin in zip(found, expected, strict=True):
        got, want = block_weights(model, block), block_weights(plain, twin)
        for role in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_O", "gamma"):
            np.testing.assert_array_equal(getattr(got, role), getattr(want, role), err_msg=role)


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_the_audit_runs_the_pairs_and_measures_what_the_model_without_them_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """As ``quantize_static`` stores them: int8 weights behind their ``DequantizeLinear`` (with
    float weights, onnxruntime's own optimizer would round them to 8 bits at load, because their
    products' activations are quantised) and 16-bit activation pairs; compared with the same
    int8-weight model without the pairs."""
    assembly = assembly_of(name)
    plain_file, quantised_file = tmp_path / "plain.onnx", tmp_path / "qdq.onnx"
    onnx.save(_weights_stored(name), plain_file)
    onnx.save(
        with_activation_pairs(_weights_stored(name), assembly.built.inputs)[0], quantised_file
    )
    inputs = builder_inputs(assembly)
    expected = audit(plain_file, inputs, provider="cpu", cache=False)
    captured = captured_sessions(monkeypatch)
    result = audit(quantised_file, inputs, provider="cpu", cache=False)
    # the graph the audit gives onnxruntime; a post-LN model's session is then opened once more
    # on the graph onnxruntime optimised from it (the sums before the norms, graph_edits)
    session_model, *reopened = captured
    assert len(reopened) <= 1
    shipped = list(onnx.load(quantised_file).graph.node)
    assert list(session_model.graph.node)[: len(shipped)] == shipped  # the pairs run
    for metric, values in expected.metrics.items():
        np.testing.assert_allclose(
            result.metrics[metric], values, rtol=QDQ_KERNEL_RTOL, atol=1e-6, err_msg=metric
        )
    assert [n.kind for n in result.notes].count("quantized") == 1
    assert "quantized" not in [n.kind for n in expected.notes]


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_each_layer_is_the_tensor_of_the_model_without_the_pairs_to_their_rounding(
    name: str,
) -> None:
    """onnxruntime's optimisations off: the graph computes what its ONNX ops say."""
    plain = model_from_proto(_weights_stored(name))
    quantised = model_from_proto(
        with_activation_pairs(_weights_stored(name), assembly_of(name).built.inputs)[0]
    )
    layers = []
    for model in (plain, quantised):
        names = layer_tensors(
            [block_weights(model, b) for b in find_attention_blocks(model).blocks]
        )
        runner = Runner(model, expose=names, provider="cpu", threads=1, optimization="disable")
        outputs = runner.collect(assembly_of(name).built.inputs)
        layers.append([outputs[n].astype(np.float64) for n in names])
    for layer, (found, expected) in enumerate(zip(*reversed(layers), strict=True)):
        error = np.linalg.norm(found - expected) / np.linalg.norm(expected)
        assert error <= INT16_RTOL, f"layer {layer}: {error:.1e}"


def test_the_audit_session_names_only_tensors_of_the_shipped_graph() -> None:
    model = model_from_proto(_quantised("bert_legacy")[0])
    blocks = find_attention_blocks(model).blocks
    session = audit_session(
        model, blocks, builder_inputs(assembly_of("bert_legacy")), provider="cpu"
    )
    shipped = {name for node in model.source.graph.node for name in node.output}
    assert set(session.layers) == set(layer_tensors(blocks))
    assert set(session.layers) | set(session.attention) <= shipped


def _integer_weights(model: onnx.ModelProto, per_axis: bool) -> tuple[onnx.ModelProto, dict]:
    """``model`` with every 2-D float initializer stored as int8 codes behind a
    ``DequantizeLinear`` (symmetric; one scale, or one per output column along axis 1), and
    ``{name: the dequantised float64 weight}``."""
    stored = onnx.ModelProto()
    stored.CopyFrom(model)
    dequantised, kept, nodes = {}, [], []
    for tensor in stored.graph.initializer:
        weight = numpy_helper.to_array(tensor)
        if weight.ndim != 2 or weight.dtype != np.float32:
            kept.append(tensor)
            continue
        scale = np.abs(weight).max(axis=0 if per_axis else None) / 127
        codes = np.round(weight / scale).astype(np.int8)
        kept += [
            numpy_helper.from_array(codes, f"{tensor.name}__int8"),
            numpy_helper.from_array(scale.astype(np.float32), f"{tensor.name}__scale"),
        ]
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{tensor.name}__int8", f"{tensor.name}__scale"],
                [tensor.name],
                axis=1,
            )
        )
        dequantised[tensor.name] = codes.astype(np.float32) * scale.astype(np.float32)
    del stored.graph.initializer[:]
    stored.graph.initializer.extend(kept)
    ordered = _topological([*stored.graph.node, *nodes], stored.graph)
    del stored.graph.node[:]
    stored.graph.node.extend(ordered)
    return stored, dequantised


@pytest.mark.parametrize("per_axis", [False, True])
def test_integer_weights_are_read_as_the_model_multiplies_by_them(per_axis: bool) -> None:
    assembly = assembly_of("bert_legacy")
    weights_stored, _ = _integer_weights(assembly.built.model, per_axis)
    proto, _ = with_activation_pairs(weights_stored, assembly.built.inputs)
    model, reference = model_from_proto(proto), model_from_proto(weights_stored)
    blocks = find_attention_blocks(model).blocks
    assert len(blocks) == 2
    session = ort.InferenceSession(
        _exposing(weights_stored, [blocks[0].q.weight]), providers=["CPUExecutionProvider"]
    )
    (applied,) = session.run([blocks[0].q.weight], assembly.built.inputs)
    got = block_weights(model, blocks[0])
    assert got.W_Q.shape == applied.shape
    np.testing.assert_array_equal(model.index.constant_value(blocks[0].q.weight), applied)
    want = block_weights(reference, find_attention_blocks(reference).blocks[0])
    np.testing.assert_array_equal(got.W_V, want.W_V)


def _exposing(model: onnx.ModelProto, names: list[str]) -> bytes:
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    return exposed.SerializeToString()


_QUANTISED_TYPES = {
    np.int8: TensorProto.INT8,
    np.uint8: TensorProto.UINT8,
    np.int16: TensorProto.INT16,
    np.uint16: TensorProto.UINT16,
}


@pytest.mark.parametrize("dtype", list(_QUANTISED_TYPES))
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_linear_folds_as_onnxruntime_computes_it(dtype: type, per_axis: bool) -> None:
    """Ties (x / s = k + ½, rounded to even), saturation at both ends, per tensor and per axis."""
    rng = np.random.default_rng(SEED)
    limits = np.iinfo(dtype)
    scale = np.array([0.5, 0.25, 2.0], np.float32) if per_axis else np.array(0.5, np.float32)
    zero = (
        np.array([limits.min // 2 + 3, 0, limits.max // 3], dtype)
        if per_axis
        else np.array(limits.max // 4, dtype)
    )
    ties = (np.arange(-6, 6) + 0.5).astype(np.float32)
    x = (
        np.concatenate([ties, rng.normal(0, 40, 24).astype(np.float32), [1e6, -1e6, 0.0]])
        .astype(np.float32)[:39]
        .reshape(13, 3)
    )
    x = x * scale  # ties stay ties: x / s is the drawn value
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=1)
    graph = helper.make_graph(
        [node],
        "q",
        [],
        [helper.make_tensor_value_info("y", _QUANTISED_TYPES[dtype], None)],
        [
            numpy_helper.from_array(x, "x"),
            numpy_helper.from_array(scale, "s"),
            numpy_helper.from_array(zero, "z"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    (expected,) = ort.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {})
    folded = GraphIndex(proto.graph).constant_value("y")
    assert folded is not None
    assert folded.dtype == expected.dtype
    np.testing.assert_array_equal(folded, expected)


def test_a_float_weight_behind_its_own_pair_is_the_rounded_weight_not_read_through() -> None:
    """Quantisation-aware exports store a float weight with a ``QuantizeLinear`` →
    ``DequantizeLinear`` pair: that pair is a constant, folded through both nodes."""
    assembly = assembly_of("bert_legacy")
    stored, _ = _integer_weights(assembly.built.model, per_axis=False)
    for node in stored.graph.node:  # int8 codes → float weight behind Q → DQ
        if node.op_type == "DequantizeLinear" and node.input[0].endswith("__int8"):
            node.input[0] = node.input[0] + "_q"
    floats = []
    for tensor in stored.graph.initializer:
        if tensor.name.endswith("__int8"):
            codes = numpy_helper.to_array(tensor)
            scale = next(
                numpy_helper.to_array(t)
                for t in stored.graph.initializer
                if t.name == tensor.name.replace("__int8", "__scale")
            )
            floats.append(
                numpy_helper.from_array(
                    (codes.astype(np.float32) + 0.3) * scale, tensor.name + "_float"
                )
            )
            stored.graph.node.insert(
                0,
                helper.make_node(
                    "QuantizeLinear",
                    [
                        tensor.name + "_float",
                        tensor.name.replace("__int8", "__scale"),
                        tensor.name + "_zero",
                    ],
                    [tensor.name + "_q"],
                ),
            )
            floats.append(numpy_helper.from_array(np.int8(0), tensor.name + "_zero"))
    stored.graph.initializer.extend(floats)
    ordered = _topological(list(stored.graph.node), stored.graph)
    del stored.graph.node[:]
    stored.graph.node.extend(ordered)
    model = model_from_proto(stored)
    assert model.read_through is None  # a constant's pair is not an activation's
    reference = model_from_proto(_integer_weights(assembly.built.model, per_axis=False)[0])
    block, twin = (find_attention_blocks(m).blocks[0] for m in (model, reference))
    got, want = block_weights(model, block), block_weights(reference, twin)
    np.testing.assert_array_equal(got.W_Q, want.W_Q)  # codes + 0.3 round back to the codes


def _one_pair_model(**change: str) -> onnx.ModelProto:
    """``y = Relu(DQ(Q(x)))`` with the pair's parts renamed by ``change`` (``dq_scale``: another
    scale; ``output``: the dequantised tensor is also a graph output)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["c"]),
        helper.make_node("DequantizeLinear", ["c", change.get("dq_scale", "s"), "z"], ["d"]),
        helper.make_node("Neg", ["d"], ["y"]),
    ]
    outputs = ["y", *(["d"] if change.get("output") else [])]
    graph = helper.make_graph(
        nodes,
        "pair",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [
            numpy_helper.from_array(np.float32(0.1), "s"),
            numpy_helper.from_array(np.float32(0.2), "s2"),
            numpy_helper.from_array(np.int8(0), "z"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize(
    ("change", "read"),
    [({}, True), ({"dq_scale": "s2"}, False), ({"output": "yes"}, False)],
)
def test_only_a_pair_that_only_rounds_is_read_through(change: dict, read: bool) -> None:
    proto = _one_pair_model(**change)
    result, read_through = read_through_activation_pairs(proto, GraphIndex(proto.graph))
    assert (result is not None) == read
    if read:
        assert read_through is not None
        assert read_through.pairs == 1
        assert [(n.op_type, list(n.input)) for n in result.graph.node] == [
            ("Relu", ["x"]),
            ("Neg", ["r"]),
        ]
    assert [n.op_type for n in proto.graph.node][1:3] == ["QuantizeLinear", "DequantizeLinear"]


def test_a_pair_of_a_pair_reads_the_first_float_tensor() -> None:
    """Q → DQ → Q → DQ (two quantisers in a row) reads as the first pair's input."""
    proto = _one_pair_model()
    graph = proto.graph
    graph.node.insert(3, helper.make_node("QuantizeLinear", ["d", "s", "z"], ["c2"]))
    graph.node.insert(4, helper.make_node("DequantizeLinear", ["c2", "s", "z"], ["d2"]))
    graph.node[5].input[0] = "d2"
    result, read_through = read_through_activation_pairs(proto, GraphIndex(graph))
    assert result is not None
    assert read_through is not None
    assert read_through.pairs == 2
    assert [(n.op_type, list(n.input)) for n in result.graph.node] == [
        ("Relu", ["x"]),
        ("Neg", ["r"]),
    ]


@pytest.mark.parametrize("scale_read_elsewhere", [False, True])
def test_a_dequantised_dynamic_quantisation_is_read_as_its_input(
    scale_read_elsewhere: bool,
) -> None:
    """``DequantizeLinear`` of a ``DynamicQuantizeLinear``'s codes with its own scale and zero
    point rounds x; the quantiser goes with it unless something else reads its scale."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("DynamicQuantizeLinear", ["r"], ["c", "s", "z"]),
        helper.make_node("DequantizeLinear", ["c", "s", "z"], ["d"]),
        helper.make_node("Neg", ["d"], ["y"]),
    ]
    outputs = ["y"]
    if scale_read_elsewhere:
        nodes.append(helper.make_node("Identity", ["s"], ["s_copy"]))
        outputs.append("s_copy")
    graph = helper.make_graph(
        nodes,
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    result, read_through = read_through_activation_pairs(proto, GraphIndex(proto.graph))
    assert result is not None
    assert read_through is not None
    assert read_through.pairs == 1
    ops = [(n.op_type, list(n.input)) for n in result.graph.node]
    assert ("Neg", ["r"]) in ops
    assert ("DynamicQuantizeLinear" in [op for op, _ in ops]) == scale_read_elsewhere
