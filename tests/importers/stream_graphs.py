"""Small two-block graphs, one per residual layout (pre-LN, post-LN, parallel attention + MLP, no MLP,
onnxruntime's fused ``SkipLayerNormalization`` in pre- and post-LN, an unnormalised attention, a
mixture-of-experts MLP), with the NumPy forward pass they compute: the stream tests' models, shared
by the boundary tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from oversmooth.importers.graph import OnnxModel, model_from_proto

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


class StreamGraph:
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


def layer_norm_ref(x: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS)


def attention_branch(g: StreamGraph, x: str) -> tuple[str, object]:
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


def mlp_branch(g: StreamGraph, x: str) -> tuple[str, object]:
    hidden, w1 = g.linear(x, D, HIDDEN)
    out, w2 = g.linear(g.op("Relu", [hidden])[0], HIDDEN, D)
    return out, lambda h: np.maximum(h @ w1, 0) @ w2


def moe_branch(g: StreamGraph, x: str) -> tuple[str, object]:
    """A mixture-of-experts MLP: Softmax(x W_r) weighs two experts, plus a shared expert gated by
    sigmoid(x w_s)."""
    logits, wr = g.linear(x, D, 2)
    probs = g.op("Softmax", [logits], axis=-1)[0]
    (e0, f0), (e1, f1), (shared, fs) = mlp_branch(g, x), mlp_branch(g, x), mlp_branch(g, x)
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


def norm_node(g: StreamGraph, x: str) -> str:
    ones, zeros = np.ones(D, dtype=np.float32), np.zeros(D, dtype=np.float32)
    return g.op("LayerNormalization", [x, g.const(ones, "g"), g.const(zeros, "b")], epsilon=EPS)[0]


def skip_norm(g: StreamGraph, branch: str, stream: str, *, keep_sum: bool) -> tuple[str, str]:
    """SkipLayerNormalization(branch, stream): (normed, sum); the sum output is left out unless
    ``keep_sum``."""
    ones, zeros = np.ones(D, dtype=np.float32), np.zeros(D, dtype=np.float32)
    inputs = [branch, stream, g.const(ones, "g"), g.const(zeros, "b")]
    outputs = g.op("SkipLayerNormalization", inputs, n_out=4 if keep_sum else 1, epsilon=EPS)
    if keep_sum:
        g.nodes[-1].output[1:3] = ["", ""]
        return outputs[0], outputs[3]
    return outputs[0], ""


def residual_block(
    g: StreamGraph, layout: str, s: str, normed: str | None, last: bool
) -> tuple[str, str, object]:
    """One block on stream ``s``; ``normed`` is a fused norm of ``s`` already computed (skip
    layouts). Returns (stream out, normed stream out or "", NumPy block)."""
    if layout in ("pre", "no_mlp", "parallel", "moe"):
        a = norm_node(g, s)
        attn, f_attn = attention_branch(g, a)
        if layout == "parallel":
            mlp, f_mlp = mlp_branch(g, a)
            both = g.op("Add", [attn, mlp])[0]
            return (
                g.op("Add", [both, s])[0],
                "",
                lambda h: h + f_attn(layer_norm_ref(h)) + f_mlp(layer_norm_ref(h)),
            )
        r = g.op("Add", [s, attn])[0]
        if layout == "no_mlp":
            return r, "", lambda h: h + f_attn(layer_norm_ref(h))
        mlp, f_mlp = (moe_branch if layout == "moe" else mlp_branch)(g, norm_node(g, r))
        out = g.op("Add", [r, mlp])[0]
        return (
            out,
            "",
            lambda h: (
                (h + f_attn(layer_norm_ref(h)))
                + f_mlp(layer_norm_ref(h + f_attn(layer_norm_ref(h))))
            ),
        )
    if layout == "post":
        attn, f_attn = attention_branch(g, s)
        n1 = norm_node(g, g.op("Add", [attn, s])[0])
        mlp, f_mlp = mlp_branch(g, n1)
        out = norm_node(g, g.op("Add", [mlp, n1])[0])

        def post(h: np.ndarray) -> np.ndarray:
            mid = layer_norm_ref(h + f_attn(h))
            return layer_norm_ref(mid + f_mlp(mid))

        return out, "", post
    if layout in ("bare", "skip_bare"):
        attn, f_attn = attention_branch(g, s)
        if layout == "bare":
            r = g.op("Add", [s, attn])[0]
            n_mid = norm_node(g, r)
        else:
            n_mid, r = skip_norm(g, attn, s, keep_sum=True)
        mlp, f_mlp = mlp_branch(g, n_mid)
        mid = lambda h: h + f_attn(h)  # noqa: E731
        return g.op("Add", [r, mlp])[0], "", lambda h: mid(h) + f_mlp(layer_norm_ref(mid(h)))
    if layout == "skip_pre":
        attn, f_attn = attention_branch(g, normed or norm_node(g, s))
        n_mid, r = skip_norm(g, attn, s, keep_sum=True)
        mlp, f_mlp = mlp_branch(g, n_mid)
        n_out, out = skip_norm(g, mlp, r, keep_sum=not last)
        mid = lambda h: h + f_attn(layer_norm_ref(h))  # noqa: E731
        return out, n_out, lambda h: mid(h) + f_mlp(layer_norm_ref(mid(h)))
    attn, f_attn = attention_branch(g, s)  # skip_post: the stream is the skip norms' normed output
    n1, _ = skip_norm(g, s, attn, keep_sum=False)
    mlp, f_mlp = mlp_branch(g, n1)
    n2, _ = skip_norm(g, mlp, n1, keep_sum=False)

    def skip_post(h: np.ndarray) -> np.ndarray:
        mid = layer_norm_ref(h + f_attn(h))
        return layer_norm_ref(mid + f_mlp(mid))

    return n2, "", skip_post


def build(
    layout: str, seed: int = 0, *, between: str = ""
) -> tuple[OnnxModel, np.ndarray, list[np.ndarray]]:
    """A two-block model of ``layout``, a batch of inputs and the true stream at every layer.

    ``between``: ``"constant"`` adds a constant to the stream between the blocks (YOLOS' position
    embeddings), ``"input"`` adds the graph input itself; the layers stay the blocks' outputs.
    """
    g = StreamGraph(np.random.default_rng(seed))
    position = g.rng.normal(size=(5, D)).astype(np.float32)
    stream, normed, forwards = g.op("Add", ["x", g.const(position, "pos")])[0], None, []
    added = g.rng.normal(size=(5, D)).astype(np.float32)
    for i in range(2):
        if i and between:
            term = g.const(added, "mid") if between == "constant" else "x"
            stream = g.op("Add", [stream, term])[0]
        stream, n_out, forward = residual_block(g, layout, stream, normed, last=i == 1)
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
