"""The residual stream around each block (:mod:`oversmooth.importers.match.stream`) and the layer check.

Small two-block graphs, one per residual layout (pre-LN, post-LN, parallel attention + MLP, no MLP,
onnxruntime's fused ``SkipLayerNormalization`` in pre- and post-LN, with the last sum output left
out), run through onnxruntime: the audit's layer tensors must equal the stream a NumPy forward pass
computes. A block whose residual cannot be traced is refused with one line, and a layer that is not
the stream entering the next block is refused, never a number.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.audit.session import attention_sublayer_tensor, layer_tensors
from oversmooth.importers.errors import LayerStreamError
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import BlockWeights, block_weights
from tests.importers.stream_graphs import LAYOUTS, D, build


def _blocks(model: OnnxModel) -> list[BlockWeights]:
    return [block_weights(model, block) for block in find_attention_blocks(model).blocks]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layers_are_the_residual_stream(layout: str) -> None:
    model, x, hidden = build(layout)
    blocks = _blocks(model)
    assert len(blocks) == 2
    assert all(block.stream_error is None for block in blocks), blocks[0].stream_error
    assert [block.parallel for block in blocks] == [layout == "parallel"] * 2
    expected_norm = "post" if layout.endswith("post") else "none" if "bare" in layout else "pre"
    assert [block.norm for block in blocks] == [expected_norm] * 2
    names = layer_tensors(blocks)
    outputs = Runner(model, expose=names, provider="cpu", threads=1).collect({"x": x})
    for layer, name in enumerate(names):
        np.testing.assert_allclose(
            outputs[name], hidden[layer], rtol=1e-4, atol=1e-4, err_msg=f"{layout} layer {layer}"
        )


def test_a_left_out_skip_norm_sum_is_named_in_the_loaded_graph() -> None:
    model, _, _ = build("skip_pre")
    last = [node for node in model.proto.graph.node if node.op_type == "SkipLayerNormalization"][-1]
    assert len(last.output) == 1
    output = _blocks(model)[-1].output_name
    assert list(last.output)[3] == output


def test_an_attention_residual_not_on_the_stream_is_refused_with_one_line() -> None:
    model, _, _ = build("pre")
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    graph = proto.graph
    graph.input.append(
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", D])
    )
    first_residual = [node for node in graph.node if node.op_type == "Add"][1]
    first_residual.input[0] = "y"  # the attention output is added to another tensor
    blocks = _blocks(model_from_proto(proto))
    assert blocks[0].stream_error is not None
    assert "residual sum" in blocks[0].stream_error
    assert "\n" not in blocks[0].stream_error
    with pytest.raises(LayerStreamError, match=r"layer 1 .* cannot be read"):
        layer_tensors(blocks)


def test_a_constant_added_between_blocks_keeps_the_blocks_outputs_as_layers() -> None:
    """YOLOS adds position embeddings between blocks: layer 1 is block 0's output, noted."""
    model, x, hidden = build("pre", between="constant")
    blocks = _blocks(model)
    notes: list[str] = []
    names = layer_tensors(blocks, notes)
    assert blocks[1].input_base == blocks[0].output_name != blocks[1].input_name
    assert names[1] == blocks[0].output_name
    assert "plus a term that does not depend on the inputs" in notes[0]
    outputs = Runner(model, expose=names, provider="cpu", threads=1).collect({"x": x})
    for layer, name in enumerate(names):
        np.testing.assert_allclose(outputs[name], hidden[layer], rtol=1e-4, atol=1e-4)


def test_an_input_dependent_term_added_between_blocks_is_refused() -> None:
    model, _, _ = build("pre", between="input")
    blocks = _blocks(model)
    assert blocks[1].input_base is None
    with pytest.raises(LayerStreamError, match="layer 1 would not be the residual stream"):
        layer_tensors(blocks)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_stream_after_attention_is_a_tensor_of_the_graph_except_for_parallel_blocks(
    layout: str,
) -> None:
    model, x, _ = build(layout)
    blocks = _blocks(model)
    mids = [attention_sublayer_tensor(block) for block in blocks]
    if layout == "parallel":
        assert mids == [None, None]
        return
    assert all(mid is not None for mid in mids)
    names = [str(mid) for mid in mids]
    outputs = Runner(model, expose=names, provider="cpu", threads=1).collect({"x": x})
    for block, name in zip(blocks, names, strict=True):
        assert outputs[name].shape == x.shape
        expected = block.norm_output_name if block.norm == "post" else block.residual_name
        assert name == expected
