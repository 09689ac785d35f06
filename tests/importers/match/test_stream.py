"""The residual stream around each block (:mod:`oversmooth.importers.match.stream`) and the layer check.

Small two-block graphs, one per residual layout (pre-LN, post-LN, parallel attention + MLP, no MLP,
onnxruntime's fused ``SkipLayerNormalization`` in pre- and post-LN, with the last sum output left
out), run through onnxruntime: the audit's layer tensors must equal the stream a NumPy forward pass
computes. A block whose residual cannot be traced is refused with one line, and a layer that is not
the stream entering the next block is refused, never a number.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.errors import LayerStreamError
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.run.runner import Runner
from oversmooth.importers.run.session import attention_sublayer_tensor, layer_tensors
from oversmooth.importers.weights import BlockWeights, block_weights

D, HEADS, HIDDEN, EPS = 8, 2, 16, 1e-5
#: ``bare``: the attention reads the stream unnormalised and the MLP is pre-LN (ModernBERT's first
#: layer); ``skip_bare`` the same with the sum and the MLP's norm fused into one skip norm.
#: ``moe``: pre-LN with a mixture-of-experts MLP (a Softmax router over two experts and a
#: sigmoid-gated shared expert), whose router Softmax is not attention.
LAYOUTS = (
    "pre",
    "post",
    "parallel",
    "no_mlp",
    "skip_pre",
    "skip_post",
    "bare",
    "skip_bare",
    "moe",
)


class _Graph:
    """Nodes and initializers of one test graph, with fresh tensor names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.nodes, self.inits, self.count = rng, [], [], 0
        self.weights: dict[str, np.ndarray] = {}

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        self.weights[name] = np.asarray(value)
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: object) -> list[str]:
        outputs = [self.name(op_type.lower()) for _ in range(n_out)]
        domain = "com.microsoft" if op_type.startswith("Skip") else ""
        self.nodes.append(helper.make_node(op_type, inputs, outputs, domain=domain, **attrs))
        return outputs

    def linear(self, x: str, d_in: int, d_out: int) -> tuple[str, np.ndarray]:
        w = self.rng.normal(scale=0.4, size=(d_in, d_out)).astype(np.float32)
        return self.op("MatMul", [x, self.const(w, "w")])[0], w


def _ln(x: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS)


def _attention(g: _Graph, x: str) -> tuple[str, object]:
    """One attention branch on ``x``; returns its output and a NumPy function of the input."""
    dh = D // HEADS
    (q, wq), (k, wk), (v, wv) = (g.linear(x, D, D) for _ in range(3))
    split = g.const(np.array([0, 0, HEADS, dh], dtype=np.int64), "shape")

    def heads(t: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [t, split])[0]], perm=perm)[0]

    scores = g.op("MatMul", [heads(q, [0, 2, 1, 3]), heads(k, [0, 2, 3, 1])])[0]
    scaled = g.op("Mul", [scores, g.const(np.array(dh**-0.5, dtype=np.float32))])[0]
    probs = g.op("Softmax", [scaled], axis=-1)[0]
    mixed = g.op("MatMul", [probs, heads(v, [0, 2, 1, 3])])[0]
    merged = g.op("Transpose", [mixed], perm=[0, 2, 1, 3])[0]
    flat = g.op("Reshape", [merged, g.const(np.array([0, 0, D], dtype=np.int64), "shape")])[0]
    out, wo = g.linear(flat, D, D)

    def forward(h: np.ndarray) -> np.ndarray:
        b, t, _ = h.shape
        qh, kh, vh = ((h @ w).reshape(b, t, HEADS, dh).transpose(0, 2, 1, 3) for w in (wq, wk, wv))
        s = qh @ kh.transpose(0, 1, 3, 2) * dh**-0.5
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return (p @ vh).transpose(0, 2, 1, 3).reshape(b, t, D) @ wo

    return out, forward


def _mlp(g: _Graph, x: str) -> tuple[str, object]:
    hidden, w1 = g.linear(x, D, HIDDEN)
    out, w2 = g.linear(g.op("Relu", [hidden])[0], HIDDEN, D)
    return out, lambda h: np.maximum(h @ w1, 0) @ w2


def _moe(g: _Graph, x: str) -> tuple[str, object]:
    """A mixture-of-experts MLP: Softmax(x W_r) weighs two experts, plus a shared expert gated by
    sigmoid(x w_s)."""
    logits, wr = g.linear(x, D, 2)
    probs = g.op("Softmax", [logits], axis=-1)[0]
    (e0, f0), (e1, f1), (shared, fs) = _mlp(g, x), _mlp(g, x), _mlp(g, x)
    gate_logit, wg = g.linear(x, D, 1)
    gate = g.op("Sigmoid", [gate_logit])[0]
    axis = g.const(np.array([-1], dtype=np.int64), "axis")

    def weight(e: int) -> str:
        start, end = (g.const(np.array([v], dtype=np.int64), "idx") for v in (e, e + 1))
        return g.op("Slice", [probs, start, end, axis])[0]

    routed = g.op("Add", [g.op("Mul", [e0, weight(0)])[0], g.op("Mul", [e1, weight(1)])[0]])[0]
    out = g.op("Add", [routed, g.op("Mul", [shared, gate])[0]])[0]

    def forward(h: np.ndarray) -> np.ndarray:
        z = h @ wr
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        shared_gate = 1.0 / (1.0 + np.exp(-(h @ wg)))
        return f0(h) * p[..., :1] + f1(h) * p[..., 1:] + fs(h) * shared_gate  # type: ignore[operator]

    return out, forward


def _norm(g: _Graph, x: str) -> str:
    ones, zeros = np.ones(D, dtype=np.float32), np.zeros(D, dtype=np.float32)
    return g.op("LayerNormalization", [x, g.const(ones, "g"), g.const(zeros, "b")], epsilon=EPS)[0]


def _skip(g: _Graph, branch: str, stream: str, *, keep_sum: bool) -> tuple[str, str]:
    """SkipLayerNormalization(branch, stream): (normed, sum); the sum output is left out unless
    ``keep_sum``."""
    ones, zeros = np.ones(D, dtype=np.float32), np.zeros(D, dtype=np.float32)
    inputs = [branch, stream, g.const(ones, "g"), g.const(zeros, "b")]
    outputs = g.op("SkipLayerNormalization", inputs, n_out=4 if keep_sum else 1, epsilon=EPS)
    if keep_sum:
        g.nodes[-1].output[1:3] = ["", ""]
        return outputs[0], outputs[3]
    return outputs[0], ""


def _block(
    g: _Graph, layout: str, s: str, normed: str | None, last: bool
) -> tuple[str, str, object]:
    """One block on stream ``s``; ``normed`` is a fused norm of ``s`` already computed (skip
    layouts). Returns (stream out, normed stream out or "", NumPy block)."""
    if layout in ("pre", "no_mlp", "parallel", "moe"):
        a = _norm(g, s)
        attn, f_attn = _attention(g, a)
        if layout == "parallel":
            mlp, f_mlp = _mlp(g, a)
            both = g.op("Add", [attn, mlp])[0]
            return g.op("Add", [both, s])[0], "", lambda h: h + f_attn(_ln(h)) + f_mlp(_ln(h))
        r = g.op("Add", [s, attn])[0]
        if layout == "no_mlp":
            return r, "", lambda h: h + f_attn(_ln(h))
        mlp, f_mlp = (_moe if layout == "moe" else _mlp)(g, _norm(g, r))
        out = g.op("Add", [r, mlp])[0]
        return out, "", lambda h: (h + f_attn(_ln(h))) + f_mlp(_ln(h + f_attn(_ln(h))))
    if layout == "post":
        attn, f_attn = _attention(g, s)
        n1 = _norm(g, g.op("Add", [attn, s])[0])
        mlp, f_mlp = _mlp(g, n1)
        out = _norm(g, g.op("Add", [mlp, n1])[0])

        def post(h: np.ndarray) -> np.ndarray:
            mid = _ln(h + f_attn(h))
            return _ln(mid + f_mlp(mid))

        return out, "", post
    if layout in ("bare", "skip_bare"):
        attn, f_attn = _attention(g, s)
        if layout == "bare":
            r = g.op("Add", [s, attn])[0]
            n_mid = _norm(g, r)
        else:
            n_mid, r = _skip(g, attn, s, keep_sum=True)
        mlp, f_mlp = _mlp(g, n_mid)
        mid = lambda h: h + f_attn(h)  # noqa: E731
        return g.op("Add", [r, mlp])[0], "", lambda h: mid(h) + f_mlp(_ln(mid(h)))
    if layout == "skip_pre":
        attn, f_attn = _attention(g, normed or _norm(g, s))
        n_mid, r = _skip(g, attn, s, keep_sum=True)
        mlp, f_mlp = _mlp(g, n_mid)
        n_out, out = _skip(g, mlp, r, keep_sum=not last)
        mid = lambda h: h + f_attn(_ln(h))  # noqa: E731
        return out, n_out, lambda h: mid(h) + f_mlp(_ln(mid(h)))
    attn, f_attn = _attention(g, s)  # skip_post: the stream is the skip norms' normed output
    n1, _ = _skip(g, s, attn, keep_sum=False)
    mlp, f_mlp = _mlp(g, n1)
    n2, _ = _skip(g, mlp, n1, keep_sum=False)

    def skip_post(h: np.ndarray) -> np.ndarray:
        mid = _ln(h + f_attn(h))
        return _ln(mid + f_mlp(mid))

    return n2, "", skip_post


def build(
    layout: str, seed: int = 0, *, between: str = ""
) -> tuple[OnnxModel, np.ndarray, list[np.ndarray]]:
    """A two-block model of ``layout``, a batch of inputs and the true stream at every layer.

    ``between``: ``"constant"`` adds a constant to the stream between the blocks (YOLOS' position
    embeddings), ``"input"`` adds the graph input itself; the layers stay the blocks' outputs.
    """
    g = _Graph(np.random.default_rng(seed))
    position = g.rng.normal(size=(5, D)).astype(np.float32)
    stream, normed, forwards = g.op("Add", ["x", g.const(position, "pos")])[0], None, []
    added = g.rng.normal(size=(5, D)).astype(np.float32)
    for i in range(2):
        if i and between:
            term = g.const(added, "mid") if between == "constant" else "x"
            stream = g.op("Add", [stream, term])[0]
        stream, n_out, forward = _block(g, layout, stream, normed, last=i == 1)
        normed = n_out or None
        forwards.append(forward)
    final = stream or (normed or "")
    graph = helper.make_graph(
        g.nodes,
        layout,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", D])],
        [helper.make_tensor_value_info(normed or final, TensorProto.FLOAT, None)],
        g.inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = 8
    x = np.random.default_rng(seed + 1).normal(size=(2, 5, D)).astype(np.float32)
    hidden = [(x + position).astype(np.float64)]
    for i, forward in enumerate(forwards):
        extra = {"constant": added, "input": x}.get(between, 0.0) if i else 0.0
        hidden.append(forward(hidden[-1] + extra))  # type: ignore[operator]
    return model_from_proto(proto), x, hidden


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


def test_a_layer_that_is_not_the_next_blocks_input_is_refused() -> None:
    model, _, _ = build("pre")
    blocks = _blocks(model)
    wrong = [dataclasses.replace(blocks[0], output_name=blocks[0].residual_name), blocks[1]]
    with pytest.raises(LayerStreamError, match="layer 1 would not be the residual stream"):
        layer_tensors(wrong)
    notes: list[str] = []
    assert layer_tensors(wrong, notes, partial=True)[1] == blocks[0].residual_name
    assert "block 1 reads" in notes[0]
    assert LayerStreamError.exit_code == 1


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
