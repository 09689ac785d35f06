"""Layer boundaries where a layer holds residual sub-layers before its attention
(:mod:`oversmooth.importers.match.boundaries`).

Small graphs of three layers, run through onnxruntime: the audit's layers must be the stream
between whole layers that a NumPy forward pass computes, whatever sub-layers come before each
attention (one FFN; a Conformer's half-step FFN, with a convolution-module stand-in, a second
half-step FFN and a final LayerNorm after it), and a residual sum the model adds before its first
layer (HuBERT's positional convolution) stays outside layer 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.audit.session import layer_tensors
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.match.boundaries import sublayers_before_attention
from oversmooth.importers.runtime.runner import Runner
from tests.importers.stream_graphs import (
    D,
    StreamGraph,
    attention_branch,
    layer_norm_ref,
    mlp_branch,
    norm_node,
)

LAYERS = 3


def _sublayer(g: StreamGraph, s: str, half: bool = False) -> tuple[str, object]:
    """``s + f(LN(s))`` (``f`` halved for a half-step FFN) and its NumPy function."""
    branch, f = mlp_branch(g, norm_node(g, s))
    if half:
        branch = g.op("Mul", [branch, g.const(np.array(0.5, dtype=np.float32), "half")])[0]
    scale = 0.5 if half else 1.0
    return g.op("Add", [s, branch])[0], lambda h: h + scale * f(layer_norm_ref(h))  # type: ignore[operator]


def _layer(g: StreamGraph, layout: str, s: str) -> tuple[str, list[object]]:
    """One layer on ``s``: its output and its steps as NumPy functions, in order."""
    macaron = layout == "macaron"
    s, before = _sublayer(g, s, half=macaron)
    attn, f_attn = attention_branch(g, norm_node(g, s))
    s = g.op("Add", [s, attn])[0]
    steps = [before, lambda h: h + f_attn(layer_norm_ref(h))]  # type: ignore[operator]
    s, after = _sublayer(g, s)
    steps.append(after)
    if macaron:
        s, second = _sublayer(g, s, half=True)
        steps += [second, layer_norm_ref]
        s = norm_node(g, s)
    return s, steps


def build(layout: str, seed: int = 0) -> tuple[OnnxModel, np.ndarray, list[np.ndarray]]:
    """A model of three ``layout`` layers after a front-end residual sum ``x + f(x)``, a batch of
    inputs, and the true stream between whole layers (the input of layer 0 first)."""
    g = StreamGraph(np.random.default_rng(seed))
    front, f_front = mlp_branch(g, "x")
    stream = g.op("Add", ["x", front])[0]
    layers = []
    for _ in range(LAYERS):
        stream, steps = _layer(g, layout, stream)
        layers.append(steps)
    stream = norm_node(g, stream)  # the encoder's own final norm
    graph = helper.make_graph(
        g.nodes,
        layout,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", D])],
        [helper.make_tensor_value_info(stream, TensorProto.FLOAT, None)],
        g.inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    x = np.random.default_rng(seed + 1).normal(size=(2, 5, D)).astype(np.float32)
    h = x.astype(np.float64)
    hidden = [h + f_front(h)]  # type: ignore[operator]
    for steps in layers:
        h = hidden[-1]
        for step in steps:
            h = step(h)  # type: ignore[operator]
        hidden.append(h)
    return model_from_proto(proto), x, hidden


@pytest.mark.parametrize("layout", ["one_before", "macaron"])
def test_layers_are_the_stream_between_whole_layers(layout: str) -> None:
    model, x, hidden = build(layout)
    blocks = find_attention_blocks(model).blocks
    assert len(blocks) == LAYERS
    assert all(block.stream_error is None for block in blocks), blocks[0].stream_error
    assert sublayers_before_attention(blocks) == 1
    names = layer_tensors(blocks)
    outputs = Runner(model, expose=names, provider="cpu", threads=1).collect({"x": x})
    for layer, name in enumerate(names):
        np.testing.assert_allclose(
            outputs[name], hidden[layer], rtol=1e-4, atol=1e-4, err_msg=f"{layout} layer {layer}"
        )
    for block in blocks:
        assert block.attention_input_name not in (None, block.input_name)
        assert any("1 residual sub-layer(s) come before the attention" in n for n in block.notes)
        assert block.to_dict()["tensors"]["attention_input"] == block.attention_input_name


def test_a_single_layer_keeps_the_attention_input() -> None:
    """With one block nothing tells the layer's sub-layers from what precedes it: unchanged."""
    model, _, _ = build("one_before")
    blocks = find_attention_blocks(model).blocks
    assert sublayers_before_attention(blocks[:1]) == 0
    assert sublayers_before_attention([*blocks[:1], *blocks[2:]]) == 1
