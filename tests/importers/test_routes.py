"""Routes of issue 26 beyond the corpus check (``test_families``): each structure the walk now
passes is passed only in the form that keeps every entry in place, and its note says so.

The fixtures are the corpus's own (``tests/fixtures/families/``, docs/fixtures.md); a test here
edits one of them where it shows that a look-alike graph is still refused.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import NoAttentionBlocksError, find_attention_blocks
from oversmooth.importers.runtime.runner import Runner
from tests.importers.family_corpus import FIXTURES, fixture_proto, load_fixture


def _per_head_concats(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Concats joining one LayerNormalization per head (StableLM's qk_layernorm)."""
    producers = {output: node for node in proto.graph.node for output in node.output}
    return [
        node
        for node in proto.graph.node
        if node.op_type == "Concat"
        and len(node.input) > 1
        and all(
            name in producers and producers[name].op_type == "LayerNormalization"
            for name in node.input
        )
    ]


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_per_head_qk_norms_are_passed_and_noted(variant: str) -> None:
    """StableLM's qk_layernorm (a Split into heads, one LayerNorm each, a Concat) is a Q/K norm:
    both blocks are found and both say that W_Q and W_K are read before a per-head norm."""
    report = find_attention_blocks(load_fixture(f"stablelm/{variant}.onnx.xz"))
    assert len(report.blocks) == 2
    assert not report.unmatched
    for block in report.blocks:
        notes = [note for note in block.notes if note.startswith("Q/K normalised")]
        assert len(notes) == 1, block.notes
        assert notes[0].count("per-head layernorm") == 2, block.notes


def test_per_head_norms_joined_out_of_order_are_refused() -> None:
    """The same Concat with two heads swapped moves entries between heads: not a norm step, so
    the Q projection is not found (one line naming the Concat), never read as if in place."""
    file = "stablelm/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    concats = _per_head_concats(proto)
    assert len(concats) == 4  # Q and K of two blocks
    for concat in concats:
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    with pytest.raises(NoAttentionBlocksError, match="reached Concat"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))


def _qk_position_adds(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Adds whose output both the Q and the K projection read and V's does not (DETR)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return [
        node
        for node in proto.graph.node
        if node.op_type == "Add"
        and sum(user.op_type == "MatMul" for user in readers.get(node.output[0], [])) == 2
    ]


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_a_position_term_on_the_qk_input_is_read_on_the_stream(variant: str) -> None:
    """DETR adds its position embeddings to the Q and K inputs, not to V's: each block reads the
    stream V projects, W_Q and W_K on it, and says so in one note."""
    report = find_attention_blocks(load_fixture(f"detr_encoder/{variant}.onnx.xz"))
    assert len(report.blocks) == 2
    for block in report.blocks:
        notes = [note for note in block.notes if "position embeddings added to the Q/K" in note]
        assert len(notes) == 1, block.notes
        assert repr(block.input_name) in notes[0]


def test_a_term_computed_from_the_stream_on_the_qk_input_is_refused() -> None:
    """The same graph with the position term replaced by the stream itself (Q and K read
    X + X): a term that depends on the inputs, so Q, K and V project different tensors."""
    file = "detr_encoder/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    report = find_attention_blocks(load_fixture(file))
    adds = _qk_position_adds(proto)
    assert len(adds) == 2
    for add, block in zip(adds, report.blocks, strict=True):
        stream = block.input_name
        assert stream in add.input
        add.input[1 - list(add.input).index(stream)] = stream
    with pytest.raises(NoAttentionBlocksError, match="project different tensors"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_gated_positional_attention_is_read_at_the_mix(variant: str) -> None:
    """ConViT mixes each head's Softmax with a positional softmax by a learned gate and
    renormalises: A is that mix (the matrix the audit exposes, rows summing to 1, not the content
    Softmax), each block says so naming the gate, and the positional Softmaxes are not attention."""
    file = f"convit/{variant}.onnx.xz"
    model = load_fixture(file)
    report = find_attention_blocks(model)
    assert len(report.blocks) == 2
    assert not report.unmatched
    with np.load(FIXTURES / "convit" / "truth.npz") as truth:
        feeds = {"pixel_values": truth["feed_pixel_values"]}
    names = [name for block in report.blocks for name in (block.attention_name, block.softmax)]
    softmax_outputs = {
        node.name: node.output[0] for node in model.proto.graph.node if node.op_type == "Softmax"
    }
    expose = [softmax_outputs.get(name, name) for name in names]
    values = Runner(model, expose=expose, provider="cpu", threads=1).collect(feeds)
    pairs = list(zip(expose[::2], expose[1::2], strict=True))
    for block, (mix, content) in zip(report.blocks, pairs, strict=True):
        notes = [note for note in block.notes if note.startswith("gated positional")]
        assert len(notes) == 1, block.notes
        assert "gate" in notes[0]
        np.testing.assert_allclose(values[mix].sum(axis=-1), 1.0, rtol=1e-5)
        assert not np.allclose(values[mix], values[content], atol=1e-3)


def test_a_gate_computed_from_the_inputs_is_refused() -> None:
    """The same graph with each gate replaced by the content Softmax itself (a gate that depends
    on the inputs): no gated mix, so the value MatMul is not found and the model is refused."""
    file = "convit/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    softmaxes = {node.output[0] for node in proto.graph.node if node.op_type == "Softmax"}
    gated = [
        node for node in proto.graph.node if node.op_type == "Mul" and softmaxes & set(node.input)
    ]
    assert gated
    for node in gated:
        probabilities = next(name for name in node.input if name in softmaxes)
        node.input[1 - list(node.input).index(probabilities)] = probabilities
    with pytest.raises(NoAttentionBlocksError, match="value MatMul not found"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))


def test_keras_einsum_projections_are_read() -> None:
    """Keras' EinsumDense (``abc,cde->abde`` and a bias Add; W_O ``abcd,cde->abe``) is a
    projection: both blocks are found with their heads, W_O reading the heads' two axes."""
    report = find_attention_blocks(load_fixture("keras_mha/keras_export.onnx.xz"))
    assert [(block.n_heads, block.d_head) for block in report.blocks] == [(4, 8), (4, 8)]
    for block in report.blocks:
        assert {block.q.kind, block.k.kind, block.v.kind, block.o.kind} == {"einsum"}
        assert block.q.bias is not None
        assert (block.q.out_dims, block.o.in_axes) == ((4, 8), 2)


def test_an_einsum_that_reorders_the_head_axes_is_refused() -> None:
    """The same graph with the Q projections writing (head size, heads) instead of (heads, head
    size): no longer the product the head split reads, so Q's projection is not found."""
    file = "keras_mha/keras_export.onnx.xz"
    proto = fixture_proto(file)
    queries = [
        node
        for node in proto.graph.node
        if node.op_type == "Einsum"
        and onnx.helper.get_attribute_value(node.attribute[0]) == b"abc,cde->abde"
    ][::3]
    assert len(queries) == 2
    for node in queries:
        node.attribute[0].s = b"abc,cde->abed"
    with pytest.raises(NoAttentionBlocksError, match="Q projection not found"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_a_channel_first_stream_is_read_through_its_token_major_views(variant: str) -> None:
    """SqueezeBERT keeps its stream (batch, features, tokens) and projects it by grouped 1×1
    convolutions: every block is found, its projections are convolutions with their groups, and
    its layer tensors are (batch, tokens, features) views of the stream, with a note."""
    model = load_fixture(f"squeezebert/{variant}.onnx.xz")
    report = find_attention_blocks(model)
    assert len(report.blocks) == 2
    with np.load(FIXTURES / "squeezebert" / "truth.npz") as truth:
        feeds = {name: truth[f"feed_{name}"] for name in ("input_ids", "attention_mask")}
        hidden = truth["hidden"]
    for block in report.blocks:
        assert (block.q.kind, block.q.groups, block.o.groups) == ("conv", 4, 1)
        assert any(note.startswith("the residual stream is channel-first") for note in block.notes)
    names = [report.blocks[0].input_name] + [block.output_name for block in report.blocks]
    values = Runner(model, expose=names, provider="cpu", threads=1).collect(feeds)
    for layer, name in enumerate(names):
        np.testing.assert_allclose(values[name], hidden[layer], rtol=1e-4, atol=1e-5)


def test_a_strided_conv_is_no_projection() -> None:
    """The same graph with the query convolutions strided (every other token): a conv that moves
    tokens is no projection, so Q's projection is not found."""
    file = "squeezebert/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    report = find_attention_blocks(load_fixture(file))
    queries = {block.q.nodes[0] for block in report.blocks}
    for node in proto.graph.node:
        if node.name in queries:
            kept = [attribute for attribute in node.attribute if attribute.name != "strides"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("strides", [2])])
    with pytest.raises(NoAttentionBlocksError, match="Q projection not found"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_rotary_on_some_tokens_only_is_walked_and_noted(variant: str) -> None:
    """EVA rotates the patch tokens' Q and K and concatenates the class token back unrotated:
    a rotary step (W_Q, W_K read before it), full on the head's columns, noted with the count."""
    report = find_attention_blocks(load_fixture(f"eva/{variant}.onnx.xz"))
    assert len(report.blocks) == 2
    for block in report.blocks:
        assert (block.rotary, block.rotary_width) == ("full", block.d_head)
        assert any("on 16 of 17 tokens" in note for note in block.notes), block.notes


def test_tokens_concatenated_out_of_order_are_refused() -> None:
    """The same graph with the class token concatenated after the patch tokens: the Concat no
    longer gives Q and K back in place, so it is no rotary step and Q's projection is not found."""
    file = "eva/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    concats = [
        node
        for node in proto.graph.node
        if node.op_type == "Concat"
        and len(node.input) == 2
        and onnx.helper.get_attribute_value(node.attribute[0]) == 2  # the token axis
    ]
    assert len(concats) == 4  # Q and K of two blocks
    for node in concats:
        node.input[0], node.input[1] = node.input[1], node.input[0]
    with pytest.raises(NoAttentionBlocksError, match="projection not found"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))


def _producers(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {output: node for node in proto.graph.node for output in node.output}


@pytest.mark.parametrize("variant", ["legacy_eager", "dynamo_eager"])
def test_rotary_before_the_projections_is_recorded(variant: str) -> None:
    """wav2vec2-conformer rotates the normalised stream before its Q and K projections (V reads
    it unrotated): W_Q and W_K are read on the stream, the block is rotary and its note says
    where; the macaron block's further residual sub-layers lie between two attentions, and each
    layer begins before its half-step FFN: the block's input is not the stream its attention reads."""
    report = find_attention_blocks(load_fixture(f"w2v2_conformer/{variant}.onnx.xz"))
    assert len(report.blocks) == 2
    for block in report.blocks:
        assert block.rotary == "full"
        notes = [note for note in block.notes if "before the projections" in note]
        assert len(notes) == 1, block.notes
    assert "further sub-layers" in report.blocks[0].roles
    assert report.blocks[0].output_name == report.blocks[1].input_name
    for block in report.blocks:
        assert block.attention_input_name not in (None, block.input_name)


def test_a_qk_input_computed_otherwise_from_the_stream_is_refused() -> None:
    """The same graph with each rotation's sum made a difference (no longer a rotation of the
    stream): Q and K project a tensor computed from the stream, so the blocks are refused."""
    file = "w2v2_conformer/legacy_eager.onnx.xz"
    proto = fixture_proto(file)
    producers = _producers(proto)
    report = find_attention_blocks(load_fixture(file))
    for block in report.blocks:
        node = producers[block.q.x]
        while node.op_type != "Add":
            node = producers[node.input[0]]
        node.op_type = "Sub"
    with pytest.raises(NoAttentionBlocksError, match="project different tensors"):
        find_attention_blocks(model_from_proto(proto, path=FIXTURES / file))
