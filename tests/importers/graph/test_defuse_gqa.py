"""Defusing onnxruntime's ``GroupQueryAttention`` (``oversmooth.importers.graph.defuse_gqa``): the rewritten
graph computes what onnxruntime's CPU kernel computes (output and present key/value) for packed and
separate Q/K/V, rotary (rotate-half, interleaved, partial), local windows, soft-capped scores and
padded items, at past length 0 and with a past; the matcher reads the block with its true heads,
key/value heads and weights; features it does not rewrite are declined by name."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.weights import block_weights
from tests.importers.sessions import run_unoptimised

#: onnxruntime's CPU kernel needs a head size that is a multiple of 16.
BATCH, SEQ, D_MODEL, HEADS, KV_HEADS, HEAD = 2, 6, 32, 4, 2, 16
POSITIONS = 32
MS = "com.microsoft"
OUTPUT_RTOL = 1e-5


def _value(name: str, dims: list | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def _weights(seed: int, head: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {"q": HEADS * head, "k": KV_HEADS * head, "v": KV_HEADS * head}
    out = {role: rng.normal(0, 0.3, (D_MODEL, width)) for role, width in sizes.items()}
    out["o"] = rng.normal(0, 0.3, (HEADS * head, D_MODEL))
    return {role: value.astype(np.float32) for role, value in out.items()}


def _gqa_model(
    *,
    packed: bool = True,
    rotary_width: int = 0,
    head: int = HEAD,
    lengths_given: bool = False,
    **attrs: object,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x → projections → GroupQueryAttention (empty-able past) → W_O → + x; weights by role."""
    weights = _weights(rotary_width + len(attrs), head)
    inits, nodes = [], []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    def matmul(name: str, weight: np.ndarray) -> str:
        nodes.append(helper.make_node("MatMul", ["x", const(f"W_{name}", weight)], [name]))
        return name

    if packed:
        fused = np.concatenate([weights["q"], weights["k"], weights["v"]], axis=1)
        qkv = [matmul("qkv", fused), "", ""]
    else:
        qkv = [matmul(role, weights[role]) for role in "qkv"]
    rotary = ["", ""]
    if rotary_width:
        half = rotary_width // 2
        angles = np.arange(POSITIONS)[:, None] * 0.5 ** np.arange(half)[None, :]
        rotary = [
            const("cos", np.cos(angles).astype(np.float32)),
            const("sin", np.sin(angles).astype(np.float32)),
        ]
        attrs.setdefault("do_rotary", 1)
    # seqlens_k and total_sequence_length from the attention mask, as onnxruntime-genai writes them
    # (with ``lengths_given``: graph inputs of that name, the mask read by nothing else)
    nodes += [
        helper.make_node(
            "ReduceSum", ["attention_mask", const("axis", np.array([1]))], ["sum"], keepdims=0
        ),
        helper.make_node("Sub", ["sum", const("one", np.array(1))], ["last"]),
        helper.make_node("Cast", ["last"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", const("index", np.array(1))], ["total"]),
        helper.make_node("Cast", ["total"], ["total_sequence_length"], to=TensorProto.INT32),
    ]
    lengths = ["given_seqlens_k", "given_total"] if lengths_given else []
    inputs = [*qkv, "past_key", "past_value", *(lengths or ["seqlens_k", "total_sequence_length"])]
    inputs += rotary
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            inputs,
            ["attention", "present_key", "present_value"],
            domain=MS,
            name="gqa",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
            **attrs,
        )
    )
    nodes.append(helper.make_node("MatMul", ["attention", const("W_o", weights["o"])], ["out"]))
    nodes.append(helper.make_node("Add", ["x", "out"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "gqa",
        [
            _value("x", ["batch", "sequence", D_MODEL]),
            _value("past_key", ["batch", KV_HEADS, "past", head]),
            _value("past_value", ["batch", KV_HEADS, "past", head]),
            _value("attention_mask", ["batch", "total"], TensorProto.INT64),
            *[
                _value(name, dims, TensorProto.INT32)
                for name, dims in zip(lengths, (["batch"], []), strict=False)
            ],
        ],
        [_value(name, None) for name in ("y", "present_key", "present_value")],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10), weights


def _feeds(
    past: int = 0, lengths: tuple[int, ...] = (SEQ, SEQ), head: int = HEAD
) -> dict[str, np.ndarray]:
    """Inputs for ``SEQ`` new tokens after ``past`` cached ones; ``lengths``: new real tokens."""
    rng = np.random.default_rng(past)
    cache = (BATCH, KV_HEADS, past, head)
    return {
        "x": rng.standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32),
        "past_key": rng.standard_normal(cache).astype(np.float32),
        "past_value": rng.standard_normal(cache).astype(np.float32),
        "attention_mask": np.array(
            [[1] * (past + n) + [0] * (SEQ - n) for n in lengths], dtype=np.int64
        ),
    }


def _assert_same_outputs(
    proto: onnx.ModelProto, feeds: dict[str, np.ndarray], real: tuple[int, ...] = (SEQ, SEQ)
) -> None:
    """Fused and defused outputs agree on every real token (padded rows are the kernel's own)."""
    model = model_from_proto(proto)
    assert [item.op for item in model.defused] == ["com.microsoft GroupQueryAttention"]
    assert "GroupQueryAttention" not in {node.op_type for node in model.proto.graph.node}
    fused, defused = run_unoptimised(proto, feeds), run_unoptimised(model.proto, feeds)
    for item, length in enumerate(real):
        expected, found = fused[0][item, :length], defused[0][item, :length]
        scale = float(np.max(np.abs(expected)))
        assert float(np.max(np.abs(expected - found))) / scale < OUTPUT_RTOL
    for expected, found in zip(fused[1:], defused[1:], strict=True):  # present key and value
        np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize(
    ("rotary_width", "interleaved", "head"),
    [(0, 0, HEAD), (HEAD, 0, HEAD), (HEAD, 1, HEAD), (HEAD, 0, 2 * HEAD), (HEAD, 1, 2 * HEAD)],
)
def test_the_defused_graph_computes_what_the_kernel_does(
    packed: bool, rotary_width: int, interleaved: int, head: int
) -> None:
    """Without rotary, full rotary and (head 32, 16 columns rotated) partial rotary; onnxruntime
    needs a head size that is a multiple of 16 and a rotated half-width that is one of 8."""
    attrs = {"rotary_interleaved": interleaved} if rotary_width else {}
    proto, _ = _gqa_model(packed=packed, rotary_width=rotary_width, head=head, **attrs)
    _assert_same_outputs(proto, _feeds(head=head))


@pytest.mark.parametrize("attrs", [{"local_window_size": 3}, {"softcap": 2.0}, {"scale": 0.1}])
def test_window_softcap_and_scale(attrs: dict) -> None:
    proto, _ = _gqa_model(rotary_width=HEAD, **attrs)
    _assert_same_outputs(proto, _feeds())


def test_padded_items_and_a_past_without_padding() -> None:
    proto, _ = _gqa_model(rotary_width=HEAD, local_window_size=4)
    _assert_same_outputs(proto, _feeds(lengths=(SEQ, SEQ - 2)), real=(SEQ, SEQ - 2))
    # onnxruntime takes a past with several new tokens for one item at a time
    one = {name: value[:1] for name, value in _feeds(past=3).items()}
    _assert_same_outputs(proto, one, real=(SEQ,))


def test_lengths_given_as_graph_inputs_are_left_out() -> None:
    """Where ``seqlens_k`` and ``total_sequence_length`` are graph inputs, the rewrite (and the
    graph) does without them: at past length 0 the real tokens of a right-padded item compute
    what the kernel computes."""
    proto, _ = _gqa_model(rotary_width=HEAD, lengths_given=True)
    model = model_from_proto(proto)
    assert {spec.name for spec in model.inputs} == {"x", "past_key", "past_value", "attention_mask"}
    feeds = _feeds(lengths=(SEQ, SEQ - 2))
    given = {"given_seqlens_k": np.array([SEQ - 1, SEQ - 3], np.int32)}
    given["given_total"] = np.array(SEQ, np.int32)
    fused, defused = run_unoptimised(proto, feeds | given), run_unoptimised(model.proto, feeds)
    for item, length in enumerate((SEQ, SEQ - 2)):
        np.testing.assert_allclose(
            defused[0][item, :length], fused[0][item, :length], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("packed", [True, False])
def test_the_block_is_read_with_its_heads_and_weights(packed: bool) -> None:
    proto, weights = _gqa_model(packed=packed, rotary_width=HEAD, softcap=5.0)
    model = model_from_proto(proto)
    assert {spec.name: spec.past_axis for spec in model.inputs if spec.past_axis is not None} == {
        "past_key": 2,
        "past_value": 2,
    }
    (block,) = find_attention_blocks(model).blocks
    assert (block.n_heads, block.n_kv_heads, block.d_head) == (HEADS, KV_HEADS, HEAD)
    assert (block.rotary, block.rotary_width, block.causal) == ("full", HEAD, True)
    assert block.defused_from is not None
    assert "GroupQueryAttention 'gqa'" in block.defused_from
    assert any(note.startswith("scores soft-capped by") for note in block.notes)
    read = block_weights(model, block)
    for role in "qkvo":
        np.testing.assert_allclose(getattr(read, f"W_{role.upper()}"), weights[role], rtol=1e-6)


@pytest.mark.parametrize(
    ("change", "feature"),
    [
        ({"smooth_softmax": 1}, "with smooth_softmax"),
        ({"kv_num_heads": 3}, "4 query heads not a multiple of 3"),
        ({"do_rotary": 1}, "with do_rotary but no cos/sin cache"),
    ],
)
def test_features_not_rewritten_are_declined_by_name(change: dict, feature: str) -> None:
    proto, _ = _gqa_model()
    node = proto.graph.node[-3]
    kept = [attribute for attribute in node.attribute if attribute.name not in change]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend(helper.make_attribute(key, value) for key, value in change.items())
    (declined,) = model_from_proto(proto).declined
    assert feature in declined.line()
    assert declined.line().startswith("fused com.microsoft GroupQueryAttention 'gqa'")


def test_key_and_value_of_another_layout_are_declined() -> None:
    proto, _ = _gqa_model(packed=False)
    reshape = helper.make_node("Reshape", ["k", "kv_heads"], ["k4"])
    proto.graph.initializer.append(
        numpy_helper.from_array(np.array([0, 0, KV_HEADS, HEAD]), "kv_heads")
    )
    proto.graph.node.insert(len(proto.graph.node) - 3, reshape)
    proto.graph.node[-3].input[1] = "k4"
    (declined,) = model_from_proto(proto).declined
    assert "with key/value not of shape (batch, sequence, hidden)" in declined.line()


def test_explicit_position_ids_and_head_sinks_are_declined() -> None:
    for position, feature in ((9, "with position_ids"), (11, "with head_sink")):
        proto, _ = _gqa_model()
        node = proto.graph.node[-3]
        node.input.extend([""] * (position + 1 - len(node.input)))
        node.input[position] = "extra"
        proto.graph.input.append(_value("extra", ["batch", "sequence"]))
        (declined,) = model_from_proto(proto).declined
        assert feature in declined.line()
