"""Defusing fused attention operators (``oversmooth.importers.graph.defuse``): the rewritten graph computes
what the fused operator computes, as onnxruntime's CPU provider runs it, for every form the
rewrite implements; every form it does not implement is declined by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.runtime.runner import Runner
from tests.importers.family_corpus import FIXTURES, MANIFEST, fixture_proto, load_fixture
from tests.importers.sessions import run_unoptimised

#: Largest relative difference (max-abs over max-abs) between the fused and the defused outputs.
OUTPUT_RTOL = 1e-5
BATCH, SEQ, D_MODEL, HEADS = 2, 5, 16, 4
MS = "com.microsoft"
#: An IR version onnxruntime reads (onnx may write a newer one by default).
IR_VERSION = 10


def _assert_same_outputs(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    model = model_from_proto(proto)
    assert model.defused
    assert not model.declined
    ops = {node.op_type for node in model.proto.graph.node}
    assert not ops & {"Attention", "MultiHeadAttention"}
    for fused, defused in zip(
        run_unoptimised(proto, feeds), run_unoptimised(model.proto, feeds), strict=True
    ):
        scale = max(float(np.max(np.abs(fused))), 1e-30)
        assert float(np.max(np.abs(fused - defused))) / scale < OUTPUT_RTOL


def _value(name: str, dims: list, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _model(
    node: onnx.NodeProto,
    inputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph([node], "fused", inputs, [_value(node.output[0], [])], initializers)
    return helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
        ir_version=IR_VERSION,
    )


def _tensor(name: str, array: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(array.astype(np.float32), name)


# -- com.microsoft Attention ---------------------------------------------------------------------

_MASKS: dict[str, tuple[list, np.ndarray | None]] = {
    "none": ([], None),
    "lengths": (["batch"], np.array([SEQ, SEQ - 2])),
    "end_start": ([2 * BATCH], np.array([SEQ, SEQ - 1, 0, 2])),
    "keys": (["batch", "seq"], np.array([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0]])),
    "queries_keys": (["batch", "seq", "seq"], np.tril(np.ones((BATCH, SEQ, SEQ))) > 0),
    "dummy": (["batch", 1], np.ones((BATCH, 1))),
}


def _contrib_attention(mask: str, **attrs: object) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(0)
    sizes = attrs.pop("qkv_hidden_sizes", [D_MODEL] * 3)
    inputs = [_value("x", ["batch", "seq", D_MODEL])]
    feeds = {"x": rng.standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32)}
    names = ["x", "w", "b", ""]
    dims, values = _MASKS[mask]
    if values is not None:
        inputs.append(_value("mask", dims, TensorProto.INT32))
        feeds["mask"] = values.astype(np.int32)
        names[3] = "mask"
    if attrs.pop("attention_bias", False):
        names += ["", "bias"]
        inputs.append(_value("bias", [1, HEADS, "seq", "seq"]))
        feeds["bias"] = rng.standard_normal((1, HEADS, SEQ, SEQ)).astype(np.float32)
    if sizes != [D_MODEL] * 3:
        attrs["qkv_hidden_sizes"] = sizes
    node = helper.make_node(
        "Attention", names, ["y"], domain=MS, name="fused", num_heads=HEADS, **attrs
    )
    weights = [
        _tensor("w", rng.standard_normal((D_MODEL, sum(sizes)))),
        _tensor("b", rng.standard_normal(sum(sizes))),
    ]
    return _model(node, inputs, weights), feeds


@pytest.mark.parametrize("mask", sorted(_MASKS))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_contrib_attention_masks(mask: str, unidirectional: int) -> None:
    _assert_same_outputs(*_contrib_attention(mask, unidirectional=unidirectional))


def test_contrib_attention_sizes_scale_filter_and_bias() -> None:
    proto, feeds = _contrib_attention(
        "keys",
        qkv_hidden_sizes=[16, 16, 8],
        scale=0.3,
        mask_filter_value=-50.0,
        attention_bias=True,
    )
    _assert_same_outputs(proto, feeds)


@pytest.mark.parametrize(
    ("change", "feature"),
    [
        ({"do_rotary": 1}, "do_rotary"),
        ({"past_present_share_buffer": 1}, "past_present_share_buffer"),
        ({"qkv_hidden_sizes": [16, 8, 24]}, "qkv_hidden_sizes"),
    ],
)
def test_contrib_attention_features_not_implemented_are_declined(
    change: dict, feature: str
) -> None:
    proto, _ = _contrib_attention("none")
    node = proto.graph.node[0]
    for key, value in change.items():
        node.attribute.append(helper.make_attribute(key, value))
    (declined,) = model_from_proto(proto).declined
    assert feature in declined.line()
    assert "'fused'" in declined.line()


def test_a_past_of_fixed_length_and_megatron_masks_are_declined_by_name() -> None:
    """A past state is defused (``test_defuse_past.py``), but one of a fixed length 3 is no
    cache the audit can feed empty: the walk stops at its Concat, by name."""
    proto, _ = _contrib_attention("none")
    node = proto.graph.node[0]
    node.input.extend([""] * (5 - len(node.input)))
    node.input[4] = "past"
    proto.graph.input.append(_value("past", [2, "batch", HEADS, 3, D_MODEL // HEADS]))
    with pytest.raises(NoAttentionBlocksError, match=r"K projection not found.*reached Concat"):
        find_attention_blocks(model_from_proto(proto))
    proto, _ = _contrib_attention("keys")
    proto.graph.input[1].CopyFrom(_value("mask", ["batch", 1, 8, 8], TensorProto.INT32))
    assert "4-D (Megatron) mask" in model_from_proto(proto).declined[0].line()


def test_group_query_attention_is_declined_not_ignored() -> None:
    """A GroupQueryAttention the rewrite cannot read (here: no head counts) stays fused and is
    named (the rewrite itself: ``test_defuse_gqa.py``)."""
    node = helper.make_node("GroupQueryAttention", ["q"], ["y"], domain=MS, name="gqa")
    proto = _model(node, [_value("q", ["batch", "seq", D_MODEL])], [])
    model = model_from_proto(proto)
    assert [item.node for item in model.declined] == ["gqa"]
    with pytest.raises(NoAttentionBlocksError, match="GroupQueryAttention 'gqa'"):
        find_attention_blocks(model)


def test_the_callers_proto_is_left_unchanged() -> None:
    proto, _ = _contrib_attention("keys")
    before = proto.SerializeToString()
    model_from_proto(proto)
    assert proto.SerializeToString() == before


# -- com.microsoft MultiHeadAttention ------------------------------------------------------------


@pytest.mark.parametrize("mask", ["none", "keys", "lengths"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_multi_head_attention_separate_qkv(mask: str, unidirectional: int) -> None:
    rng = np.random.default_rng(1)
    inputs = [_value(name, ["batch", "seq", D_MODEL]) for name in "qkv"]
    feeds = {name: rng.standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32) for name in "qkv"}
    names = ["q", "k", "v", "bias"]
    dims, values = _MASKS[mask]
    if values is not None:
        inputs.append(_value("mask", dims, TensorProto.INT32))
        feeds["mask"] = values.astype(np.int32)
        names.append("mask")
    node = helper.make_node(
        "MultiHeadAttention",
        names,
        ["y"],
        domain=MS,
        name="mha",
        num_heads=HEADS,
        unidirectional=unidirectional,
    )
    bias = [_tensor("bias", rng.standard_normal(3 * D_MODEL))]
    _assert_same_outputs(_model(node, inputs, bias), feeds)


def test_multi_head_attention_packed_qkv() -> None:
    """Packed QKV (B, T, N, 3, H): onnxruntime's CPU provider cannot run it, so the reference is
    the spec's attention written out in NumPy."""
    rng = np.random.default_rng(2)
    d_head = D_MODEL // HEADS
    packed = rng.standard_normal((BATCH, SEQ, HEADS, 3, d_head)).astype(np.float32)
    node = helper.make_node(
        "MultiHeadAttention", ["qkv"], ["y"], domain=MS, name="mha", num_heads=HEADS
    )
    proto = _model(node, [_value("qkv", ["batch", "seq", HEADS, 3, d_head])], [])
    (found,) = run_unoptimised(model_from_proto(proto).proto, {"qkv": packed})
    q, k, v = (packed[:, :, :, role].transpose(0, 2, 1, 3).astype(np.float64) for role in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_head)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    context = (weights / weights.sum(axis=-1, keepdims=True)) @ v
    expected = context.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, D_MODEL)
    np.testing.assert_allclose(found, expected, rtol=OUTPUT_RTOL, atol=OUTPUT_RTOL)


# -- ONNX Attention (opset 23) -------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [HEADS, 2])
@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
def test_onnx_attention_3d(kv_heads: int, mask: str) -> None:
    rng = np.random.default_rng(3)
    d_kv = kv_heads * D_MODEL // HEADS
    shapes = {"q": (BATCH, SEQ, D_MODEL), "k": (BATCH, SEQ, d_kv), "v": (BATCH, SEQ, d_kv)}
    inputs = [_value(name, ["batch", "seq", shape[2]]) for name, shape in shapes.items()]
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    names, attrs = ["q", "k", "v"], {"q_num_heads": HEADS, "kv_num_heads": kv_heads}
    if mask in ("bool", "float"):
        keep = np.tril(np.ones((SEQ, SEQ))) > 0
        kind = TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT
        inputs.append(_value("mask", ["seq", "seq"], kind))
        feeds["mask"] = (
            keep if mask == "bool" else rng.standard_normal(keep.shape).astype(np.float32)
        )
        names.append("mask")
    if mask == "causal":
        attrs["is_causal"] = 1
    node = helper.make_node("Attention", names, ["y"], name="sdpa", **attrs)
    _assert_same_outputs(_model(node, inputs, [], opset=23), feeds)


def test_onnx_attention_4d_with_scale() -> None:
    rng = np.random.default_rng(4)
    shape = (BATCH, HEADS, SEQ, D_MODEL // HEADS)
    inputs = [_value(name, ["batch", HEADS, "seq", shape[3]]) for name in "qkv"]
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name in "qkv"}
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="sdpa", scale=0.2)
    _assert_same_outputs(_model(node, inputs, [], opset=23), feeds)


def test_onnx_attention_softcap_is_declined() -> None:
    inputs = [_value(name, ["batch", HEADS, "seq", 4]) for name in "qkv"]
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="sdpa", softcap=30.0)
    (declined,) = model_from_proto(_model(node, inputs, [], opset=23)).declined
    assert declined.line() == "fused ai.onnx Attention 'sdpa' with softcap: not defused"


# -- T5's RelativePositionBias -------------------------------------------------------------------


def _t5_buckets(q: int, k: int, n_buckets: int, max_distance: int, bidirectional: bool):
    """T5's relative position buckets (transformers' ``_relative_position_bucket``), in NumPy."""
    relative = np.arange(k)[None, :] - np.arange(q)[:, None]
    buckets = np.zeros_like(relative)
    if bidirectional:
        n_buckets //= 2
        buckets += (relative > 0) * n_buckets
        relative = np.abs(relative)
    else:
        relative = -np.minimum(relative, 0)
    exact = n_buckets // 2
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) where the exact bucket is taken
        large = exact + (
            np.log(relative.astype(np.float32) / exact)
            / np.log(max_distance / exact)
            * (n_buckets - exact)
        ).astype(np.int64)
    large = np.minimum(large, n_buckets - 1)
    return buckets + np.where(relative < exact, relative, large)


@pytest.mark.parametrize("bidirectional", [0, 1])
def test_relative_position_bias_is_t5s_bucketed_table(bidirectional: int) -> None:
    n_buckets, heads, length, max_distance = 16, 3, 40, 20
    table = np.random.default_rng(5).standard_normal((n_buckets, heads)).astype(np.float32)
    stored = np.ascontiguousarray(table.T).reshape(n_buckets, heads)  # column-major, as ORT's
    node = helper.make_node(
        "RelativePositionBias",
        ["table", "length", "length"],
        ["y"],
        domain=MS,
        name="rpb",
        max_distance=max_distance,
        is_bidirectional=bidirectional,
    )
    proto = _model(node, [_value("length", [], TensorProto.INT64)], [_tensor("table", stored)])
    (found,) = run_unoptimised(
        model_from_proto(proto).proto, {"length": np.array(length, np.int64)}
    )
    buckets = _t5_buckets(length, length, n_buckets, max_distance, bool(bidirectional))
    expected = table[buckets].transpose(2, 0, 1)[None]
    np.testing.assert_array_equal(found, expected)
    assert len(np.unique(buckets)) > n_buckets // 2  # the logarithmic buckets are reached


# -- the corpus ----------------------------------------------------------------------------------

_TRUTH = {entry["id"]: entry["truth"] for entry in MANIFEST["fixtures"]}
#: onnxruntime-optimized fixtures with fused attention that the CPU provider can run as they are.
_RUNNABLE = ["albert", "bert", "clip_vision", "roberta", "siglip_vision"]


@pytest.mark.parametrize("family", _RUNNABLE)
def test_defused_fixture_computes_what_the_fused_graph_computes(family: str) -> None:
    original = fixture_proto(f"{family}/optimized.onnx.xz")
    model = load_fixture(f"{family}/optimized.onnx.xz")
    assert model.defused
    with np.load(FIXTURES / _TRUTH[f"{family}-optimized"]) as truth:
        feeds = {item.name: truth[f"feed_{item.name}"] for item in model.inputs}
    for fused, defused in zip(
        run_unoptimised(original, feeds), run_unoptimised(model.proto, feeds), strict=True
    ):
        scale = max(float(np.max(np.abs(fused))), 1e-30)
        assert float(np.max(np.abs(fused - defused))) / scale < OUTPUT_RTOL


def test_the_runner_exposes_the_defused_attention_probabilities() -> None:
    model = load_fixture("bert/optimized.onnx.xz")
    blocks = find_attention_blocks(model).blocks
    assert [block.notes[0] for block in blocks] == [
        "defused from com.microsoft Attention 'Attention_0'",
        "defused from com.microsoft Attention 'Attention_1'",
    ]
    with np.load(FIXTURES / _TRUTH["bert-optimized"]) as truth:
        feeds = {item.name: truth[f"feed_{item.name}"].copy() for item in model.inputs}
    feeds["attention_mask"][1, -2:] = 0  # padding: keys the attention must not see
    names = [block.attention_name for block in blocks]
    outputs = Runner(model, expose=names, provider="cpu", threads=1).collect(feeds)
    batch, length = feeds["input_ids"].shape
    masked_keys = np.broadcast_to(
        (feeds["attention_mask"] == 0)[:, None, None, :], (batch, 4, length, length)
    )
    assert masked_keys.any()
    for name in names:
        probabilities = outputs[name]
        assert probabilities.shape == (batch, 4, length, length)
        np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-5)
        assert np.all(probabilities[masked_keys] < 1e-6)
