"""Pieces for small transformer graphs built with ``onnx.helper`` in one exporter's style.

``Graph`` adds nodes, constants and weights, naming them the way one PyTorch exporter does:

* ``LEGACY`` (TorchScript exporter): module-path node names (``/encoder/layer.0/.../MatMul``),
  tensors ``<node>_output_0``, anonymous weights ``onnx::MatMul_NNN``, constants as ``Constant``
  nodes, the bias first in a bias ``Add``.
* ``DYNAMO`` (torch.export exporter): ``node_MatMul_NN`` nodes, ``matmul_NN`` tensors, anonymous
  weights ``val_NN``, constants as initializers, the bias second.

Only biases, norm parameters and LayerScale (and Gemm weights, which keep PyTorch's ``(out, in)``
layout) carry module-path names, as in real exports.

The functions below ``Graph`` each emit one recognisable sub-graph (a projection, the head split,
the scores, a mask, the softmax, the head merge, a norm, an MLP, RoPE, the GQA expansion) and return
the name of the tensor they produce. Shapes use ``B`` batch, ``T`` tokens, ``H`` heads, ``dh`` head
width, ``d`` model width. Every weight is given in the row-vector convention ``y = x @ W``.

``Recipe`` names every choice that distinguishes one variant's graph, and ``draw_model`` draws a
recipe's float32 parameters and feeds from a seed, before any graph exists.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Batch size of every feed; the batch axis itself is dynamic.
BATCH = 2
VOCAB = 50
N_CLASSES = 3

#: The additive mask value PyTorch uses (``torch.finfo(torch.float32).min``).
FLOAT32_MIN = float(np.finfo(np.float32).min)

#: Where head split / merge shapes come from: ``zeros`` a constant ``[0, 0, ...]`` (copy B and T),
#: ``infer`` a constant ``[0, -1, ...]``, ``dynamic`` a ``Concat`` of ``Shape -> Gather`` pieces.
SHAPE_FORMS = ("zeros", "infer", "dynamic")


@dataclass(frozen=True)
class Style:
    """How one exporter names things and where it keeps constants."""

    name: str
    constants_as_nodes: bool
    bias_first: bool
    ir_version: int
    producer_version: str


LEGACY = Style(
    "legacy", constants_as_nodes=True, bias_first=True, ir_version=8, producer_version="2.3.0"
)
DYNAMO = Style(
    "dynamo", constants_as_nodes=False, bias_first=False, ir_version=10, producer_version="2.11.0"
)


class Graph:
    """A graph under construction; ``build()`` returns the ``onnx.ModelProto``.

    Parameters
    ----------
    style : Style
        Naming and constant conventions.
    opset : int
        Default-domain opset; decides ``ReduceMean`` axes (attribute below 18, input from 18).
    """

    def __init__(self, style: Style, opset: int) -> None:
        self.style = style
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self._scope = ""
        self._ids = itertools.count(40)
        self._legacy_names: Counter[str] = Counter()

    @contextmanager
    def at(self, path: str) -> Iterator[None]:
        """Name what is added inside the block after the module ``path`` (``a/b.0/c``)."""
        outer, self._scope = self._scope, path
        try:
            yield
        finally:
            self._scope = outer

    # -- names ---------------------------------------------------------------------------------

    def _node_names(self, op_type: str, n_out: int) -> tuple[str, list[str]]:
        if self.style is LEGACY:
            base = f"/{self._scope}/{op_type}" if self._scope else f"/{op_type}"
            k = self._legacy_names[base]
            self._legacy_names[base] += 1
            name = base if k == 0 else f"{base}_{k}"
            return name, [f"{name}_output_{i}" for i in range(n_out)]
        n = next(self._ids)
        stem = f"{op_type.lower()}_{n}"
        return f"node_{op_type}_{n}", [stem if i == 0 else f"{stem}_{i}" for i in range(n_out)]

    def anonymous_name(self, consumer: str = "MatMul") -> str:
        """A fresh nameless-weight name: ``onnx::MatMul_NN`` (legacy) or ``val_NN`` (dynamo)."""
        n = next(self._ids)
        return f"onnx::{consumer}_{n}" if self.style is LEGACY else f"val_{n}"

    def module_name(self, leaf: str) -> str:
        """The parameter name of ``leaf`` in the current module (``a.b.0.c.weight``)."""
        return ".".join([*self._scope.split("/"), leaf]) if self._scope else leaf

    # -- graph pieces --------------------------------------------------------------------------

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs: object) -> str | list[str]:
        """Add one node; return its output name (a list when ``n_out > 1``)."""
        name, outputs = self._node_names(op_type, n_out)
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def rename_output(self, tensor: str, name: str) -> str:
        """Give the tensor produced last a public name (graph outputs are named by the user)."""
        node = self.nodes[-1]
        assert list(node.output) == [tensor], "rename only the tensor just produced"
        node.output[0] = name
        return name

    def initializer(self, value: np.ndarray, name: str) -> str:
        """Store ``value`` as an initializer called ``name``."""
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def const(self, value: object, dtype: type = np.float32) -> str:
        """A small constant: a ``Constant`` node (legacy) or an initializer (dynamo)."""
        array = np.asarray(value, dtype=dtype)
        if self.style.constants_as_nodes:
            return self.op("Constant", value=numpy_helper.from_array(array))
        return self.initializer(array, self.anonymous_name())

    def ints(self, *values: int) -> str:
        """A 1-D int64 constant (shapes, axes, indices)."""
        return self.const(list(values), np.int64)

    def weight(
        self, value: np.ndarray, *, leaf: str | None = None, consumer: str = "MatMul"
    ) -> str:
        """A parameter: module-named when ``leaf`` is given, anonymous otherwise."""
        name = self.module_name(leaf) if leaf else self.anonymous_name(consumer)
        return self.initializer(value, name)

    def input(self, name: str, value: np.ndarray, dims: Sequence[str | int]) -> str:
        """A graph input with symbolic ``dims``; ``value`` becomes its entry in ``feeds``."""
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(dims)))
        self.feeds[name] = value
        return name

    def output(self, name: str, dims: Sequence[str | int], elem: int = TensorProto.FLOAT) -> None:
        """Declare ``name`` a graph output."""
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(dims)))

    def build(self) -> onnx.ModelProto:
        """The finished model (default domain only)."""
        graph = helper.make_graph(
            self.nodes, "main_graph", self.inputs, self.outputs, initializer=self.initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", self.opset)],
            producer_name="pytorch",
            producer_version=self.style.producer_version,
        )
        model.ir_version = self.style.ir_version
        return model


# -- weight encodings ---------------------------------------------------------------------------

#: How weight matrices are stored: as float32, as float16 + ``Cast``, or as int8 + scale
#: dequantised by ``Cast -> Mul`` (per output column).
ENCODINGS = ("float32", "float16", "int8")


def int8_quantize(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-column int8 codes and float32 scales of a float32 ``(in, out)`` W."""
    scale = (np.max(np.abs(W), axis=0) / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(W / scale), -127, 127).astype(np.int8)
    return q, scale


def effective(W: np.ndarray | None, encoding: str) -> np.ndarray | None:
    """The float64 values the graph computes with after decoding a stored ``W``.

    float16 rounds once; int8 is ``float32(q) * scale`` in float32, as the ``Mul`` node does.
    """
    if W is None:
        return None
    if encoding == "float16":
        return W.astype(np.float16).astype(np.float64)
    if encoding == "int8" and W.ndim == 2:
        q, scale = int8_quantize(W)
        return (q.astype(np.float32) * scale).astype(np.float64)
    return W.astype(np.float64)


def emit_weight(
    g: Graph,
    W: np.ndarray,
    encoding: str,
    *,
    leaf: str | None = None,
    scale_input: str | None = None,
) -> str:
    """Store ``W`` in ``encoding`` and return the float32 tensor the graph computes with.

    int8 matrices become ``val_N_q`` + ``val_N_scale``; ``scale_input`` makes the scale a graph
    input of that name instead (a near miss: the weight is then not a constant).
    """
    if encoding == "float16":
        return g.op("Cast", g.weight(W.astype(np.float16), leaf=leaf), to=TensorProto.FLOAT)
    if encoding == "int8" and W.ndim == 2:
        q, scale = int8_quantize(W)
        base = g.anonymous_name()
        q_name = g.initializer(q, f"{base}_q")
        if scale_input:
            scale_name = g.input(scale_input, scale, [scale.shape[0]])
        else:
            scale_name = g.initializer(scale, f"{base}_scale")
        return g.op("Mul", g.op("Cast", q_name, to=TensorProto.FLOAT), scale_name)
    return g.weight(W.astype(np.float32), leaf=leaf)


# -- shapes ---------------------------------------------------------------------------------------


def token_shape(g: Graph, x: str, tail: Sequence[int], form: str) -> str:
    """A Reshape target keeping ``x``'s leading (B, T) and appending ``tail``."""
    if form == "zeros":
        return g.ints(0, 0, *tail)
    if form == "infer":
        return g.ints(0, -1, *tail)
    shape = g.op("Shape", x)
    lead = [
        g.op("Unsqueeze", g.op("Gather", shape, g.const(i, np.int64)), g.ints(0)) for i in (0, 1)
    ]
    return g.op("Concat", *lead, *(g.ints(t) for t in tail), axis=0)


# -- projections --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearForm:
    """How a linear layer is exported.

    ``kind``: ``matmul`` (MatMul + bias Add), ``gemm_transb`` (Reshape to 2-D, ``Gemm`` with
    ``transB=1`` on an ``(out, in)`` weight, Reshape back to the input's (B, T) read with
    ``Shape``) or ``gemm`` (the same with the ``(in, out)`` weight and ``transB=0``, GPT-2's
    Conv1D). ``encoding`` applies to ``matmul`` only; Gemm weights are float32.
    """

    kind: str = "matmul"
    encoding: str = "float32"


def linear(
    g: Graph,
    x: str,
    W: np.ndarray,
    b: np.ndarray | None,
    form: LinearForm,
    *,
    weight: str | None = None,
) -> str:
    """``x @ W + b`` for ``x (B, T, d_in)``, ``W (d_in, d_out)``; ``weight`` overrides the stored W."""
    if form.kind != "matmul":
        return _gemm(g, x, W, b, form)
    y = g.op("MatMul", x, weight or emit_weight(g, W, form.encoding))
    if b is None:
        return y
    bias = emit_weight(g, b, "float32" if form.encoding == "int8" else form.encoding, leaf="bias")
    return g.op("Add", bias, y) if g.style.bias_first else g.op("Add", y, bias)


def _gemm(g: Graph, x: str, W: np.ndarray, b: np.ndarray | None, form: LinearForm) -> str:
    transposed = form.kind == "gemm_transb"
    stored = np.ascontiguousarray(W.T) if transposed else W
    flat = g.op("Reshape", x, g.ints(-1, W.shape[0]))
    inputs = [flat, g.weight(stored, leaf="weight")]
    if b is not None:
        inputs.append(g.weight(b, leaf="bias"))
    y = g.op("Gemm", *inputs, transB=int(transposed))
    return g.op("Reshape", y, token_shape(g, x, [W.shape[1]], "dynamic"))


def split_fused(
    g: Graph, qkv: str, widths: Sequence[int], how: str, heads: Sequence[int]
) -> list[str]:
    """Split a fused ``(B, T, sum(widths))`` projection into Q, K, V.

    ``how``: ``split`` (one ``Split`` on axis -1), ``split_tokens`` (a ``Split`` on the token
    axis 1, ``widths`` then being token counts: a near miss), ``slice`` (three ``Slice``), or
    ``gather`` (Reshape to ``(B, T, 3, H, dh)``, then ``Gather`` on axis 2; this returns
    head-split ``(B, T, H, dh)`` tensors).
    """
    if how == "split":
        return g.op("Split", qkv, g.ints(*widths), axis=-1, n_out=3)
    if how == "split_tokens":
        return g.op("Split", qkv, g.ints(*widths), axis=1, n_out=3)
    if how == "gather":
        n_heads, d_head = heads
        parts = g.op("Reshape", qkv, g.ints(0, 0, 3, n_heads, d_head))
        return [g.op("Gather", parts, g.const(i, np.int64), axis=2) for i in range(3)]
    ends = np.cumsum(widths)
    return [
        g.op("Slice", qkv, g.ints(int(end - w)), g.ints(int(end)), g.ints(-1))
        for w, end in zip(widths, ends, strict=True)
    ]


# -- heads, scores, masks, softmax --------------------------------------------------------------


def split_heads(
    g: Graph, x: str, n_heads: int, d_head: int, shape_form: str, perm: Sequence[int] = (0, 2, 1, 3)
) -> str:
    """``(B, T, H*dh) -> (B, H, T, dh)``, or ``(B, H, dh, T)`` with ``perm=(0, 2, 3, 1)``."""
    heads = g.op("Reshape", x, token_shape(g, x, [n_heads, d_head], shape_form))
    return g.op("Transpose", heads, perm=list(perm))


def merge_heads(g: Graph, o: str, width: int, shape_form: str) -> str:
    """``(B, H, T, dh) -> (B, T, H*dh)``."""
    tokens_first = g.op("Transpose", o, perm=[0, 2, 1, 3])
    return g.op("Reshape", tokens_first, token_shape(g, tokens_first, [width], shape_form))


def scaled_scores(g: Graph, q: str, k_t: str, d_head: int, scale: str) -> str:
    """``q k_t / sqrt(dh)`` with the scaling where an exporter puts it.

    ``scale``: ``div_scores`` (Div of the scores by sqrt(dh)), ``mul_scores`` (Mul by
    1/sqrt(dh)), ``mul_qk`` (Mul of q and of k_t by dh^-1/4 each, as SDPA and DINOv2 exports do).
    """
    if scale == "mul_qk":
        root = g.const(d_head**-0.25)
        return g.op("MatMul", g.op("Mul", q, root), g.op("Mul", k_t, root))
    scores = g.op("MatMul", q, k_t)
    if scale == "div_scores":
        return g.op("Div", scores, g.const(np.sqrt(d_head)))
    return g.op("Mul", scores, g.const(1.0 / np.sqrt(d_head)))


@dataclass(frozen=True)
class Mask:
    """A mask ready to apply: ``add`` a float bias, or ``where`` keep scores where ``tensor``."""

    how: str
    tensor: str


def padding_bias_legacy(g: Graph, mask_ids: str) -> Mask:
    """``(1 - mask[:, None, None, :]) * finfo.min`` (BERT's extended attention mask)."""
    wide = g.op("Unsqueeze", g.op("Unsqueeze", mask_ids, g.ints(1)), g.ints(2))
    keep = g.op("Cast", wide, to=TensorProto.FLOAT)
    return Mask("add", g.op("Mul", g.op("Sub", g.const(1.0), keep), g.const(FLOAT32_MIN)))


def padding_bool(g: Graph, mask_ids: str) -> str:
    """``mask[:, None, None, :]`` as a boolean ``(B, 1, 1, T)`` tensor."""
    return g.op("Unsqueeze", g.op("Cast", mask_ids, to=TensorProto.BOOL), g.ints(1, 2))


def padding_bias_where(g: Graph, mask_ids: str) -> Mask:
    """``where(mask, 0, -inf)``, the additive bias the SDPA decomposition builds."""
    return Mask("add", g.op("Where", padding_bool(g, mask_ids), g.const(0.0), g.const(-np.inf)))


def causal_mask(g: Graph, n_tokens: int, how: str) -> Mask:
    """A constant lower-triangular mask ``(1, 1, T, T)``: boolean for ``where``, else additive."""
    lower = np.tril(np.ones((n_tokens, n_tokens), dtype=bool))[None, None]
    if how == "where":
        return Mask("where", g.const(lower, np.bool_))
    return Mask("add", g.const(np.where(lower, 0.0, FLOAT32_MIN)))


def apply_mask(g: Graph, scores: str, mask: Mask | None) -> str:
    """Add the bias, or replace masked scores by ``finfo.min`` with ``Where``."""
    if mask is None:
        return scores
    if mask.how == "add":
        return g.op("Add", scores, mask.tensor)
    return g.op("Where", mask.tensor, scores, g.const(FLOAT32_MIN))


def merged_batch_heads(g: Graph, x: str) -> str:
    """``(B, H, T, n) -> (B·H, T, n)`` (row-major: row ``b·H + h``)."""
    return g.op("Reshape", x, g.op("Concat", g.ints(-1), g.op("Shape", x, start=2), axis=0))


def split_batch_heads(g: Graph, x: str, like: str) -> str:
    """``(B·H, T, n) -> (B, H, T, n)``, B and H read from the 4-D tensor ``like``."""
    heads = g.op("Shape", like, start=0, end=2)
    return g.op("Reshape", x, g.op("Concat", heads, g.op("Shape", x, start=1), axis=0))


def attention_probs(g: Graph, scores: str, *, axis: int = -1, nan_guard: bool = False) -> str:
    """``Softmax`` over keys, optionally followed by ``IsNaN -> Where`` zeroing NaN rows."""
    probs = g.op("Softmax", scores, axis=axis)
    if not nan_guard:
        return probs
    return g.op("Where", g.op("IsNaN", probs), g.const(0.0), probs)


# -- RoPE and grouped-query attention ------------------------------------------------------------


def rope_angles(n_tokens: int, d_head: int, theta: float = 10000.0) -> np.ndarray:
    """Llama's rotary angles ``(T, dh)``: position times ``theta^(-2i/dh)``, both halves equal."""
    inv_freq = theta ** (-np.arange(0, d_head, 2) / d_head)
    angles = np.outer(np.arange(n_tokens), inv_freq)
    return np.concatenate([angles, angles], axis=-1).astype(np.float32)


def rope(g: Graph, x: str, cos: str, sin: str, d_head: int) -> str:
    """``x * cos + rotate_half(x) * sin`` on ``(B, H, T, dh)``; ``rotate_half = [-x2, x1]``."""
    half = d_head // 2
    first = g.op("Slice", x, g.ints(0), g.ints(half), g.ints(-1))
    second = g.op("Slice", x, g.ints(half), g.ints(d_head), g.ints(-1))
    rotated = g.op("Concat", g.op("Neg", second), first, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def expand_kv(g: Graph, x: str, n_heads: int, n_kv_heads: int, d_head: int) -> str:
    """``(B, Hkv, T, dh) -> (B, H, T, dh)``: kv head ``j`` serves heads ``j*r ... j*r + r - 1``.

    As Llama's ``repeat_kv``: Unsqueeze a group axis, Expand it to ``r = H / Hkv``, Reshape.
    """
    wide = g.op("Unsqueeze", x, g.ints(2))
    copies = g.op("Expand", wide, g.ints(1, 1, n_heads // n_kv_heads, 1, 1))
    return g.op("Reshape", copies, g.ints(0, n_heads, -1, d_head))


# -- norms and MLPs ------------------------------------------------------------------------------


def _reduce_mean(g: Graph, x: str) -> str:
    if g.opset >= 18:
        return g.op("ReduceMean", x, g.ints(-1), keepdims=1)
    return g.op("ReduceMean", x, axes=[-1], keepdims=1)


def layer_norm(
    g: Graph, x: str, gamma: np.ndarray, beta: np.ndarray, *, fused: bool, eps: float
) -> str:
    """Fused ``LayerNormalization`` or the 9-op chain ReduceMean/Sub/Pow/.../Mul/Add."""
    gamma_name, beta_name = g.weight(gamma, leaf="weight"), g.weight(beta, leaf="bias")
    if fused:
        return g.op("LayerNormalization", x, gamma_name, beta_name, axis=-1, epsilon=eps)
    centred = g.op("Sub", x, _reduce_mean(g, x))
    variance = _reduce_mean(g, g.op("Pow", centred, g.const(2.0)))
    std = g.op("Sqrt", g.op("Add", variance, g.const(eps)))
    return g.op("Add", g.op("Mul", g.op("Div", centred, std), gamma_name), beta_name)


def rms_norm(g: Graph, x: str, gamma: np.ndarray, *, eps: float) -> str:
    """Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul: ``gamma * x / sqrt(mean(x^2) + eps)``."""
    mean_square = _reduce_mean(g, g.op("Pow", x, g.const(2.0)))
    inv_rms = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean_square, g.const(eps))))
    return g.op("Mul", g.weight(gamma, leaf="weight"), g.op("Mul", x, inv_rms))


def gelu(g: Graph, x: str) -> str:
    """Exact GELU as exporters decompose it: ``x * 0.5 * (1 + erf(x / sqrt 2))``."""
    erf = g.op("Erf", g.op("Div", x, g.const(np.sqrt(2.0))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.const(1.0))), g.const(0.5))


def silu(g: Graph, x: str) -> str:
    """``x * sigmoid(x)``."""
    return g.op("Mul", x, g.op("Sigmoid", x))


# -- recipes ------------------------------------------------------------------------------------

#: Module paths per architecture, for node and parameter names. Block roles are relative to
#: ``layer``; ``embed``, ``final`` and ``head`` are model-level.
PATHS: dict[str, dict[str, str]] = {
    "bert": {
        "layer": "encoder/layer.{i}",
        "attn": "attention/self",
        "q": "attention/self/query",
        "k": "attention/self/key",
        "v": "attention/self/value",
        "o": "attention/output/dense",
        "norm1": "attention/output/LayerNorm",
        "up": "intermediate/dense",
        "down": "output/dense",
        "norm2": "output/LayerNorm",
        "embed": "embeddings",
        "head": "classifier",
    },
    "vit": {
        "layer": "encoder/layer.{i}",
        "norm1": "norm1",
        "attn": "attention/attention",
        "q": "attention/attention/query",
        "k": "attention/attention/key",
        "v": "attention/attention/value",
        "o": "attention/output/dense",
        "ls1": "layer_scale1",
        "norm2": "norm2",
        "up": "mlp/fc1",
        "down": "mlp/fc2",
        "ls2": "layer_scale2",
        "final": "layernorm",
    },
    "gpt2": {
        "layer": "transformer/h.{i}",
        "norm1": "ln_1",
        "attn": "attn",
        "qkv": "attn/c_attn",
        "o": "attn/c_proj",
        "norm2": "ln_2",
        "up": "mlp/c_fc",
        "down": "mlp/c_proj",
        "embed": "transformer",
        "final": "transformer/ln_f",
    },
    "llama": {
        "layer": "model/layers.{i}",
        "norm1": "input_layernorm",
        "attn": "self_attn",
        "q": "self_attn/q_proj",
        "k": "self_attn/k_proj",
        "v": "self_attn/v_proj",
        "o": "self_attn/o_proj",
        "norm2": "post_attention_layernorm",
        "gate": "mlp/gate_proj",
        "up": "mlp/up_proj",
        "down": "mlp/down_proj",
        "embed": "model/embed_tokens",
        "final": "model/norm",
    },
}


@dataclass(frozen=True)
class Recipe:
    """Everything that distinguishes one variant's graph.

    Options (defaults describe a legacy-exported post-LN BERT):

    - ``qkv``: ``separate`` projections, or one fused projection cut by ``split``, ``slice`` or
      ``gather`` (on a ``(B, T, 3, H, dh)`` reshape).
    - ``linear``: ``matmul`` (MatMul + Add), ``gemm_transb`` or ``gemm`` (see ``LinearForm``).
    - ``encoding``: stored weight dtype, ``float32``, ``float16`` (+Cast) or ``int8`` (+Cast, Mul).
    - ``shape_form``: head split/merge Reshape targets (see ``SHAPE_FORMS``).
    - ``k_perm``: ``direct`` (K Transpose perm [0, 2, 3, 1]) or ``twice`` ([0, 2, 1, 3], then
      [0, 1, 3, 2]).
    - ``scale``: ``div_scores``, ``mul_scores`` or ``mul_qk`` (see ``scaled_scores``).
    - ``mask``: ``padding_legacy`` (additive, Sub/Mul), ``padding_where_bias`` (additive bias from
      Where, then the softmax NaN guard if ``nan_guard``), ``padding_where_scores`` (Where on the
      scores), ``causal_where``, ``causal_add`` or ``none``.
    - ``tokens``: ``ids`` (input_ids through an embedding table) or ``embeddings`` (a float
      ``(B, T, d)`` input, as a ViT after its patch embedding).
    - ``tokens_first_view``: the projections read a ``(T, B, d)`` Transpose of the stream and the
      heads merge back to ``(T, B, d)``, transposed to ``(B, T, d)`` after W_O (PyTorch's
      ``nn.MultiheadAttention`` with ``batch_first=True``); separate projections only.
    - ``batched_3d``: the scores and the attended values are batched products of
      ``(B·H, T, ·)`` tensors; the scores are viewed as ``(B, H, T, T)`` for the mask and a floor
      at ``finfo.min`` (``Max``), then as ``(B·H, T, T)`` again for the Softmax (XGLM's and
      fairseq-style exports).
    """

    family: str
    style: Style
    opset: int
    d_model: int
    n_heads: int
    n_tokens: int
    n_kv_heads: int | None = None
    norm: str = "post"
    norm_kind: str = "layernorm"
    fused_ln: bool = True
    qkv: str = "separate"
    linear: str = "matmul"
    encoding: str = "float32"
    shape_form: str = "dynamic"
    k_perm: str = "direct"
    scale: str = "div_scores"
    mask: str = "padding_legacy"
    nan_guard: bool = False
    rope: bool = False
    layer_scale: bool = False
    biases: bool = True
    activation: str = "gelu"
    tokens: str = "ids"
    batched_3d: bool = False
    tokens_first_view: bool = False
    n_layers: int = 2
    d_ff: int = 48
    eps: float = 1e-5

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def path(self, role: str, layer: int | None = None) -> str:
        """The module path of ``role`` (in block ``layer`` for block roles)."""
        paths = PATHS[self.family]
        if layer is None:
            return paths[role]
        block = paths["layer"].format(i=layer)
        return block if role == "layer" else f"{block}/{paths[role]}"


# -- parameters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Norm:
    """Norm parameters (float32); ``beta`` is None for RMSNorm."""

    gamma: np.ndarray
    beta: np.ndarray | None


@dataclass(frozen=True)
class BlockParams:
    """One block's float32 parameters, ``(in, out)`` matrices; biases None when absent."""

    W_Q: np.ndarray
    W_K: np.ndarray
    W_V: np.ndarray
    W_O: np.ndarray
    b_Q: np.ndarray | None
    b_K: np.ndarray | None
    b_V: np.ndarray | None
    b_O: np.ndarray | None
    norm1: Norm
    norm2: Norm
    ls1: np.ndarray | None
    ls2: np.ndarray | None
    W_up: np.ndarray
    b_up: np.ndarray | None
    W_down: np.ndarray
    b_down: np.ndarray | None
    W_gate: np.ndarray | None


@dataclass(frozen=True)
class ModelParams:
    """Everything drawn from the seed, before any graph is built."""

    feeds: dict[str, np.ndarray]
    word: np.ndarray | None
    position: np.ndarray | None
    embed_norm: Norm | None
    blocks: list[BlockParams]
    final_norm: Norm | None
    head: tuple[np.ndarray, np.ndarray]
    value_table: np.ndarray
    memory: np.ndarray


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def _draw_norm(rng: np.random.Generator, r: Recipe) -> Norm:
    """gamma near 1 and beta near 0 (no beta for RMSNorm)."""
    gamma = (1 + _normal(rng, (r.d_model,), 0.1)).astype(np.float32)
    beta = _normal(rng, (r.d_model,), 0.1) if r.norm_kind == "layernorm" else None
    return Norm(gamma, beta)


def _draw_block(rng: np.random.Generator, r: Recipe) -> BlockParams:
    """Matrices with entries of variance 1/fan-in, so that scores stay of order one."""
    d, width, kv_width = r.d_model, r.n_heads * r.d_head, r.kv_heads * r.d_head

    def matrix(n_in: int, n_out: int) -> np.ndarray:
        return _normal(rng, (n_in, n_out), n_in**-0.5)

    def bias(n: int) -> np.ndarray | None:
        return _normal(rng, (n,), 0.1) if r.biases else None

    return BlockParams(
        W_Q=matrix(d, width),
        W_K=matrix(d, kv_width),
        W_V=matrix(d, kv_width),
        W_O=matrix(width, d),
        b_Q=bias(width),
        b_K=bias(kv_width),
        b_V=bias(kv_width),
        b_O=bias(d),
        norm1=_draw_norm(rng, r),
        norm2=_draw_norm(rng, r),
        ls1=(0.5 + _normal(rng, (d,), 0.1)) if r.layer_scale else None,
        ls2=(0.5 + _normal(rng, (d,), 0.1)) if r.layer_scale else None,
        W_up=matrix(d, r.d_ff),
        b_up=bias(r.d_ff),
        W_down=matrix(r.d_ff, d),
        b_down=bias(d),
        W_gate=matrix(d, r.d_ff) if r.activation == "swiglu" else None,
    )


def _draw_feeds(rng: np.random.Generator, r: Recipe) -> dict[str, np.ndarray]:
    """Batch-2 inputs; with a padding mask the second sequence's last two tokens are padding."""
    shape = (BATCH, r.n_tokens)
    if r.tokens == "embeddings":
        return {"embeddings": _normal(rng, (*shape, r.d_model), 1.0)}
    feeds = {"input_ids": rng.integers(0, VOCAB, shape, dtype=np.int64)}
    if r.mask.startswith("padding"):
        mask = np.ones(shape, dtype=np.int64)
        mask[1, -2:] = 0
        feeds["attention_mask"] = mask
    return feeds


def draw_model(r: Recipe, seed: int) -> ModelParams:
    """Every parameter and feed of recipe ``r``, drawn in a fixed order from ``seed``.

    A near miss is drawn from its base variant's recipe, so it shares that variant's weights for
    the same seed. The classifier head, the constant value table and the second token input are
    always drawn and used only by the near misses that need them.
    """
    rng = np.random.default_rng(seed)
    feeds = _draw_feeds(rng, r)
    word = _normal(rng, (VOCAB, r.d_model), 1.0)
    position = _normal(rng, (r.n_tokens, r.d_model), 0.3)
    embed_norm = _draw_norm(rng, r)
    blocks = [_draw_block(rng, r) for _ in range(r.n_layers)]
    final_norm = _draw_norm(rng, r)
    head = (_normal(rng, (r.d_model, N_CLASSES), r.d_model**-0.5), _normal(rng, (N_CLASSES,), 0.1))
    value_table = _normal(rng, (1, r.n_heads, r.n_tokens, r.d_head), 1.0)
    memory = _normal(rng, (BATCH, r.n_tokens, r.d_model), 1.0)
    ids = r.tokens == "ids"
    return ModelParams(
        feeds=feeds,
        word=word if ids else None,
        position=position if ids and r.family in ("bert", "gpt2") else None,
        embed_norm=embed_norm if ids and r.norm == "post" else None,
        blocks=blocks,
        final_norm=final_norm if r.norm == "pre" else None,
        head=head,
        value_table=value_table,
        memory=memory,
    )
