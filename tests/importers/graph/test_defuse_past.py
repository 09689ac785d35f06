"""Defusing onnxruntime's ``Attention`` and ``MultiHeadAttention`` with past state
(``oversmooth.importers.graph.defuse``): the rewritten graph computes what onnxruntime's CPU kernels compute
(output and present state) with an empty and a non-empty past, causal or not, with a key mask; the
past inputs are key/value cache inputs (fed empty by the audit) and the matcher reads the block with
its true heads and weights; features the rewrite does not reproduce are declined by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.inputs.decoder_feeds import with_empty_caches
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.weights import block_weights
from tests.importers.sessions import run_unoptimised

BATCH, SEQ, D_MODEL, HEADS, HEAD = 2, 5, 16, 4, 4
MS = "com.microsoft"
OUTPUT_RTOL = 1e-5


def _value(name: str, dims: list | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {role: rng.normal(0, 0.4, (D_MODEL, D_MODEL)) for role in "qkvo"}
    out["bias"] = rng.normal(0, 0.1, 3 * D_MODEL)
    return {role: value.astype(np.float32) for role, value in out.items()}


def _model(
    op: str, *, mask: bool = False, **attrs: object
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x → fused op (past state in, present state out) → W_O → + x; the weights by role.

    ``Attention``: packed weights, ``past`` (2, B, N, P, H) input 4, ``present`` output 1.
    ``MultiHeadAttention``: Q/K/V projected outside, packed bias, ``past_key``/``past_value``
    inputs 6 and 7, ``present_key``/``present_value`` outputs 1 and 2.
    """
    weights = _weights(len(op) + len(attrs))
    inits = [numpy_helper.from_array(weights["o"], "W_o")]
    nodes = []
    cache = ["batch", HEADS, "past", HEAD]
    mask_name = "attention_mask" if mask else ""
    if op == "Attention":
        packed = np.concatenate([weights["q"], weights["k"], weights["v"]], axis=1)
        inits += [numpy_helper.from_array(packed, "W_qkv")]
        inits += [numpy_helper.from_array(weights["bias"], "b_qkv")]
        inputs = ["x", "W_qkv", "b_qkv", mask_name, "past"]
        outputs = ["attention", "present"]
        caches = [_value("past", [2, *cache])]
    else:
        for role in "qkv":
            inits.append(numpy_helper.from_array(weights[role], f"W_{role}"))
            nodes.append(helper.make_node("MatMul", ["x", f"W_{role}"], [role]))
        inits += [numpy_helper.from_array(weights["bias"], "b_qkv")]
        inputs = ["q", "k", "v", "b_qkv", mask_name, "", "past_key", "past_value"]
        outputs = ["attention", "present_key", "present_value"]
        caches = [_value("past_key", cache), _value("past_value", cache)]
    nodes.append(
        helper.make_node(op, inputs, outputs, domain=MS, name="fused", num_heads=HEADS, **attrs)
    )
    nodes.append(helper.make_node("MatMul", ["attention", "W_o"], ["out"]))
    nodes.append(helper.make_node("Add", ["x", "out"], ["y"]))
    masks = [_value("attention_mask", ["batch", "total"], TensorProto.INT32)] if mask else []
    graph = helper.make_graph(
        nodes,
        "past",
        [_value("x", ["batch", "sequence", D_MODEL]), *caches, *masks],
        [_value(name, None) for name in ("y", *outputs[1:])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10), weights


def _feeds(op: str, past: int, mask: bool = False) -> dict[str, np.ndarray]:
    """``SEQ`` new tokens after ``past`` cached ones (the second item's first two keys masked)."""
    rng = np.random.default_rng(past)
    cache = (BATCH, HEADS, past, HEAD)
    feeds = {"x": rng.standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32)}
    if op == "Attention":
        feeds["past"] = rng.standard_normal((2, *cache)).astype(np.float32)
    else:
        feeds["past_key"] = rng.standard_normal(cache).astype(np.float32)
        feeds["past_value"] = rng.standard_normal(cache).astype(np.float32)
    if mask:
        keys = np.ones((BATCH, past + SEQ), np.int32)
        keys[1, :2] = 0
        feeds["attention_mask"] = keys
    return feeds


OPS = ["Attention", "MultiHeadAttention"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("past", [0, 3])
@pytest.mark.parametrize(("causal", "mask"), [(1, False), (0, False), (1, True), (0, True)])
def test_the_defused_graph_computes_what_the_kernel_does(
    op: str, past: int, causal: int, mask: bool
) -> None:
    """Output and present state, with an empty and a non-empty past (a raw (B, P + S) key mask
    hiding two keys of the second item, the causal mask bottom-right after the past)."""
    proto, _ = _model(op, mask=mask, unidirectional=causal)
    model = model_from_proto(proto)
    assert [item.op for item in model.defused] == [f"{MS} {op}"]
    assert op not in {node.op_type for node in model.proto.graph.node}
    feeds = _feeds(op, past, mask)
    fused, defused = run_unoptimised(proto, feeds), run_unoptimised(model.proto, feeds)
    scale = float(np.max(np.abs(fused[0])))
    assert float(np.max(np.abs(fused[0] - defused[0]))) / scale < OUTPUT_RTOL
    for expected, found in zip(fused[1:], defused[1:], strict=True):  # the present state
        assert found.shape == expected.shape
        np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("op", "axes"), [("Attention", {"past": 3}), (OPS[1], None)])
def test_the_past_inputs_are_caches_and_the_block_is_read(op: str, axes: dict | None) -> None:
    """The past inputs are key/value cache inputs (the packed one along its axis 3), fed empty by
    the audit; the block has its heads and weights (W_Q, W_K before the scale, biases apart)."""
    proto, weights = _model(op, unidirectional=1)
    model = model_from_proto(proto)
    found = {spec.name: spec.past_axis for spec in model.inputs if spec.past_axis is not None}
    assert found == (axes or {"past_key": 2, "past_value": 2})
    x = np.random.default_rng(1).standard_normal((3, SEQ, D_MODEL)).astype(np.float32)
    feeds = with_empty_caches({"x": x}, model.inputs)
    shapes = {name: value.shape for name, value in feeds.items() if name != "x"}
    empty = (3, HEADS, 0, HEAD)
    assert shapes == ({"past": (2, *empty)} if axes else {"past_key": empty, "past_value": empty})
    np.testing.assert_allclose(
        run_unoptimised(model.proto, feeds)[0], run_unoptimised(proto, feeds)[0], rtol=1e-5
    )
    (block,) = find_attention_blocks(model).blocks
    assert (block.n_heads, block.n_kv_heads, block.d_head, block.causal) == (
        HEADS,
        HEADS,
        HEAD,
        True,
    )
    assert block.defused_from is not None
    assert f"{op} 'fused'" in block.defused_from
    read = block_weights(model, block)
    for role in "qkvo":
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)


def _declined(proto: onnx.ModelProto) -> str:
    (declined,) = model_from_proto(proto).declined
    return declined.line()


@pytest.mark.parametrize(
    ("op", "position", "feature"),
    [
        ("Attention", 6, "with past state (past_sequence_length)"),
        (OPS[1], 8, "with past state (past_sequence_length)"),
        (OPS[1], 9, "with cache_indirection (beam search)"),
    ],
)
def test_a_shared_buffer_length_or_beam_search_is_declined_by_name(
    op: str, position: int, feature: str
) -> None:
    proto, _ = _model(op)
    node = proto.graph.node[-3]
    node.input.extend([""] * (position + 1 - len(node.input)))
    node.input[position] = "extra"
    proto.graph.input.append(_value("extra", [1], TensorProto.INT32))
    assert feature in _declined(proto)


def test_a_shared_past_present_buffer_is_declined_by_name() -> None:
    proto, _ = _model("Attention", past_present_share_buffer=1)
    assert "with past_present_share_buffer" in _declined(proto)


def test_a_past_key_without_a_past_value_is_declined_by_name() -> None:
    proto, _ = _model(OPS[1])
    proto.graph.node[-3].input[7] = ""
    line = _declined(proto)
    assert "with a past key but no past value" in line
    assert line.startswith("fused com.microsoft MultiHeadAttention 'fused'")


def test_a_past_of_another_layout_is_declined_by_name() -> None:
    proto, _ = _model("Attention")
    proto.graph.input[1].CopyFrom(_value("past", ["batch", HEADS, "past", HEAD]))
    assert "with a past that is not (2, batch, heads, past, head size)" in _declined(proto)
