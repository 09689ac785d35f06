"""Small ONNX transformers with known weights: one per attention-graph variant the importer reads.

Each model has two blocks with an MLP, ``d_model`` 16-32, 2-4 heads, 5-7 tokens and a dynamic batch,
and is laid out the way one exporter writes that architecture (see ``_builder_parts``). The weights
are drawn from a seed, so the expected extraction is known exactly.

Contract
--------
ExpectedBlock -- what the importer must extract from one attention block (row-vector convention)
Built         -- a model, its expected blocks and a valid batch-2 feed for onnxruntime
NearMiss      -- a model with one deliberately broken attention candidate, a ``broken`` tag and why
VARIANTS      -- variant name -> ``seed -> Built``
NEAR_MISSES   -- tag -> ``seed -> NearMiss``

Also, for the NumPy forward pass that checks this ground truth: ``assemble(name, seed)`` and
``assemble_near_miss(tag, seed)`` return an ``Assembly``: the ``Built`` plus a ``Reference`` holding
what a forward pass needs beyond the attention weights (embeddings, MLPs, masks, RoPE angles).

Every weight is drawn in float32 and stored exactly (float16 and int8 variants report the values
the graph computes with: the float16 numbers, and ``float32(q) * scale`` rounded in float32).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tests.importers._builder_parts import (
    DYNAMO,
    LEGACY,
    Graph,
    LinearForm,
    Mask,
    Style,
    apply_mask,
    attention_probs,
    causal_mask,
    effective,
    emit_weight,
    expand_kv,
    gelu,
    layer_norm,
    linear,
    merge_heads,
    padding_bias_legacy,
    padding_bias_where,
    padding_bool,
    rms_norm,
    rope,
    rope_angles,
    scaled_scores,
    silu,
    split_fused,
    split_heads,
)

__all__ = [
    "NEAR_MISSES",
    "RECIPES",
    "VARIANTS",
    "Assembly",
    "Built",
    "ExpectedBlock",
    "MlpReference",
    "NearMiss",
    "Recipe",
    "Reference",
    "assemble",
    "assemble_near_miss",
]

F64 = np.ndarray

#: Batch size of every feed; the batch axis itself is dynamic.
BATCH = 2
VOCAB = 50
N_CLASSES = 3


# -- the contract -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedBlock:
    """One attention block as the importer must report it (float64, ``y = x @ W``).

    ``W_Q`` is ``(d_model, n_heads*d_head)`` with heads as contiguous column blocks, ``W_K`` and
    ``W_V`` are ``(d_model, n_kv_heads*d_head)``, ``W_O`` is ``(n_heads*d_head, d_model)`` with
    heads as contiguous row blocks. ``gamma``/``beta`` belong to the attention sub-block's norm:
    the norm before attention (pre-LN) or after the attention residual ``Add`` (post-LN).
    """

    index: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: str
    norm_kind: str | None
    W_Q: F64
    W_K: F64
    W_V: F64
    W_O: F64
    b_Q: F64 | None
    b_K: F64 | None
    b_V: F64 | None
    b_O: F64 | None
    gamma: F64 | None
    beta: F64 | None
    layer_scale: F64 | None


@dataclass(frozen=True)
class Built:
    """A model, the blocks it contains (in depth order) and a batch-2 feed for onnxruntime."""

    model: onnx.ModelProto
    blocks: list[ExpectedBlock]
    inputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class NearMiss:
    """A model with one attention candidate broken on purpose; ``broken`` is a stable tag."""

    model: onnx.ModelProto
    broken: str
    description: str


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
    - ``linear``: ``matmul`` (MatMul + Add) or ``gemm_transb`` (Gemm on a 2-D reshape).
    - ``encoding``: stored weight dtype, ``float32``, ``float16`` (+Cast) or ``int8`` (+Cast, Mul).
    - ``shape_form``: head split/merge Reshape targets (see ``_builder_parts.SHAPE_FORMS``).
    - ``k_perm``: ``direct`` (K Transpose perm [0, 2, 3, 1]) or ``twice`` ([0, 2, 1, 3], then
      [0, 1, 3, 2]).
    - ``scale``: ``div_scores``, ``mul_scores`` or ``mul_qk`` (see ``scaled_scores``).
    - ``mask``: ``padding_legacy`` (additive, Sub/Mul), ``padding_where_bias`` (additive bias from
      Where, then the softmax NaN guard if ``nan_guard``), ``padding_where_scores`` (Where on the
      scores), ``causal_where``, ``causal_add`` or ``none``.
    - ``tokens``: ``ids`` (input_ids through an embedding table) or ``embeddings`` (a float
      ``(B, T, d)`` input, as a ViT after its patch embedding).
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


_BERT_LEGACY = Recipe(family="bert", style=LEGACY, opset=17, d_model=24, n_heads=4, n_tokens=6)
_BERT_DYNAMO = replace(
    _BERT_LEGACY,
    style=DYNAMO,
    d_model=32,
    shape_form="zeros",
    k_perm="twice",
    scale="mul_qk",
    mask="padding_where_bias",
    nan_guard=True,
)
_GPT2 = Recipe(
    family="gpt2",
    style=DYNAMO,
    opset=17,
    d_model=32,
    n_heads=4,
    n_tokens=6,
    norm="pre",
    qkv="split",
    shape_form="infer",
    k_perm="twice",
    mask="causal_where",
)

#: The variants built from a recipe (``dynamic_quant`` is derived from ``bert_dynamo`` instead).
RECIPES: dict[str, Recipe] = {
    "bert_legacy": _BERT_LEGACY,
    "bert_dynamo": _BERT_DYNAMO,
    "bert_decomposed_ln": replace(
        _BERT_LEGACY, opset=14, fused_ln=False, d_model=16, n_heads=2, n_tokens=5
    ),
    "vit_prenorm_layerscale": replace(
        _BERT_LEGACY,
        family="vit",
        opset=14,
        n_heads=3,
        n_tokens=5,
        norm="pre",
        fused_ln=False,
        k_perm="twice",
        scale="mul_qk",
        mask="none",
        layer_scale=True,
        tokens="embeddings",
    ),
    "gpt2_fused_qkv": _GPT2,
    "gpt2_slice_qkv": replace(_GPT2, style=LEGACY, qkv="slice", d_model=16, n_heads=2, n_tokens=7),
    "gpt2_gather_qkv": replace(_GPT2, qkv="gather", shape_form="zeros", d_model=24, n_heads=3),
    "gemm_transb": replace(_BERT_LEGACY, linear="gemm_transb", d_model=32, n_tokens=7),
    "llama_rmsnorm_rope_gqa": replace(
        _GPT2,
        family="llama",
        opset=18,
        n_kv_heads=2,
        n_tokens=7,
        norm_kind="rmsnorm",
        qkv="separate",
        shape_form="zeros",
        scale="mul_scores",
        mask="causal_add",
        rope=True,
        biases=False,
        activation="swiglu",
    ),
    "fp16_weights": replace(_BERT_DYNAMO, encoding="float16"),
    "int8_weight_only": replace(_BERT_DYNAMO, encoding="int8"),
    "scale_mul_scores": replace(
        _BERT_DYNAMO,
        scale="mul_scores",
        mask="padding_legacy",
        nan_guard=False,
        d_model=16,
        n_heads=2,
        n_tokens=7,
    ),
    "where_mask": replace(
        _BERT_LEGACY, mask="padding_where_scores", d_model=16, n_heads=2, n_tokens=5
    ),
}


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
    gamma = (1 + _normal(rng, (r.d_model,), 0.1)).astype(np.float32)
    beta = _normal(rng, (r.d_model,), 0.1) if r.norm_kind == "layernorm" else None
    return Norm(gamma, beta)


def _draw_block(rng: np.random.Generator, r: Recipe) -> BlockParams:
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
    shape = (BATCH, r.n_tokens)
    if r.tokens == "embeddings":
        return {"embeddings": _normal(rng, (*shape, r.d_model), 1.0)}
    feeds = {"input_ids": rng.integers(0, VOCAB, shape, dtype=np.int64)}
    if r.mask.startswith("padding"):
        mask = np.ones(shape, dtype=np.int64)
        mask[1, -2:] = 0
        feeds["attention_mask"] = mask
    return feeds


def _draw_model(r: Recipe, seed: int) -> ModelParams:
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


# -- graph assembly -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    """Model-level tensors the attention blocks share."""

    mask: Mask | None
    rope: tuple[str, str] | None
    memory: str | None
    value_table: np.ndarray


def _form(r: Recipe) -> LinearForm:
    return LinearForm(r.linear, r.encoding, r.shape_form)


def _norm(g: Graph, x: str, norm: Norm, r: Recipe) -> str:
    if r.norm_kind == "rmsnorm":
        return rms_norm(g, x, norm.gamma, eps=r.eps)
    return layer_norm(g, x, norm.gamma, norm.beta, fused=r.fused_ln, eps=r.eps)


def _embed(g: Graph, r: Recipe, m: ModelParams) -> str:
    if r.tokens == "embeddings":
        return g.input("embeddings", m.feeds["embeddings"], ["batch", r.n_tokens, r.d_model])
    ids = g.input("input_ids", m.feeds["input_ids"], ["batch", r.n_tokens])
    with g.at(r.path("embed")):
        x = g.op("Gather", g.weight(m.word, leaf="word_embeddings.weight"), ids)
        if m.position is not None:
            x = g.op("Add", x, g.weight(m.position, leaf="position_embeddings.weight"))
    if m.embed_norm is None:
        return x
    with g.at(f"{r.path('embed')}/LayerNorm"):
        return _norm(g, x, m.embed_norm, r)


def _mask(g: Graph, r: Recipe, feeds: dict[str, np.ndarray]) -> Mask | None:
    if r.mask == "none":
        return None
    if r.mask.startswith("causal"):
        return causal_mask(g, r.n_tokens, "where" if r.mask == "causal_where" else "add")
    ids = g.input("attention_mask", feeds["attention_mask"], ["batch", r.n_tokens])
    if r.mask == "padding_legacy":
        return padding_bias_legacy(g, ids)
    if r.mask == "padding_where_bias":
        return padding_bias_where(g, ids)
    return Mask("where", padding_bool(g, ids))


def _context(g: Graph, r: Recipe, m: ModelParams, brk: str | None) -> _Context:
    mask = _mask(g, r, m.feeds)
    tables = None
    if r.rope:
        with g.at("model/rotary_emb"):
            angles = g.const(rope_angles(r.n_tokens, r.d_head))
            tables = (g.op("Cos", angles), g.op("Sin", angles))
    memory = None
    if brk == "kv_from_other_input":
        memory = g.input("encoder_hidden_states", m.memory, ["batch", r.n_tokens, r.d_model])
    return _Context(mask, tables, memory, m.value_table)


def _weight_source(g: Graph, W: np.ndarray, role: str, r: Recipe, brk: str | None) -> str | None:
    """The stored projection weight (None: ``linear`` stores it, as Gemm does)."""
    if role == "q" and brk == "q_weight_not_constant":
        return g.input("query_weight", W, list(W.shape))
    if role == "q" and brk == "int8_scale_not_constant":
        return emit_weight(g, W, "int8", scale_input="query_weight_scale")
    return emit_weight(g, W, r.encoding) if r.linear == "matmul" else None


def _project(
    g: Graph, x: str, i: int, p: BlockParams, r: Recipe, ctx: _Context, brk: str | None
) -> tuple[list[str | None], dict[str, str]]:
    """Q, K, V projections ``(B, T, width)``; V is None when it is a constant (near miss)."""
    if r.qkv != "separate":
        return _project_fused(g, x, i, p, r, brk), {}
    kv_input = ctx.memory or x
    outputs: list[str | None] = []
    names: dict[str, str] = {}
    for role, W, b, source in (
        ("q", p.W_Q, p.b_Q, x),
        ("k", p.W_K, p.b_K, kv_input),
        ("v", p.W_V, p.b_V, kv_input),
    ):
        if role == "v" and brk == "value_not_projected":
            outputs.append(None)
            continue
        with g.at(r.path(role, i)):
            stored = _weight_source(g, W, role, r, brk)
            names[role] = stored or ""
            outputs.append(linear(g, source, W, b, _form(r), weight=stored))
    return outputs, names


def _project_fused(
    g: Graph, x: str, i: int, p: BlockParams, r: Recipe, brk: str | None
) -> list[str]:
    W = np.concatenate([p.W_Q, p.W_K, p.W_V], axis=1)
    b = np.concatenate([p.b_Q, p.b_K, p.b_V]) if r.biases else None
    with g.at(r.path("qkv", i)):
        qkv = linear(g, x, W, b, _form(r))
    widths, how = [p.W_Q.shape[1], p.W_K.shape[1], p.W_V.shape[1]], r.qkv
    if brk == "qkv_split_axis":
        widths, how = [r.n_tokens // 3] * 3, "split_tokens"
    with g.at(r.path("attn", i)):
        return split_fused(g, qkv, widths, how, (r.n_heads, r.d_head))


def _heads(
    g: Graph, t: str, n_heads: int, r: Recipe, brk: str | None, perm: tuple[int, ...]
) -> str:
    """Head split of one projection; ``gather`` projections are already ``(B, T, H, dh)``."""
    if r.qkv == "gather":
        return g.op("Transpose", t, perm=list(perm))
    if brk == "head_reshape_mismatch":
        return split_heads(g, t, n_heads, r.d_head // 2, "infer", perm)
    return split_heads(g, t, n_heads, r.d_head, r.shape_form, perm)


def _keys(g: Graph, k: str, r: Recipe, ctx: _Context, brk: str | None) -> str:
    """``(B, H, dh, T)`` keys from the projection: transpose, RoPE, GQA expansion."""
    if brk == "k_not_transposed":
        return _heads(g, k, r.kv_heads, r, brk, (0, 2, 1, 3))
    if r.k_perm == "direct":
        return _heads(g, k, r.kv_heads, r, brk, (0, 2, 3, 1))
    k = _heads(g, k, r.kv_heads, r, brk, (0, 2, 1, 3))
    if ctx.rope:
        k = rope(g, k, *ctx.rope, r.d_head)
    if r.kv_heads != r.n_heads:
        k = expand_kv(g, k, r.n_heads, r.kv_heads, r.d_head)
    return g.op("Transpose", k, perm=[0, 1, 3, 2])


def _values(g: Graph, v: str | None, r: Recipe, ctx: _Context, brk: str | None) -> str:
    if v is None:
        return g.weight(ctx.value_table)
    v = _heads(g, v, r.kv_heads, r, brk, (0, 2, 1, 3))
    return expand_kv(g, v, r.n_heads, r.kv_heads, r.d_head) if r.kv_heads != r.n_heads else v


def _scores(g: Graph, q: str, k_t: str, r: Recipe, brk: str | None) -> str:
    if brk != "score_scale_not_constant":
        return scaled_scores(g, q, k_t, r.d_head, r.scale)
    data_scale = g.op("Reciprocal", g.op("ReduceMax", g.op("Abs", q), keepdims=0))
    return g.op("Mul", g.op("MatMul", q, k_t), data_scale)


def _attend(g: Graph, probs: str, v: str, brk: str | None) -> str:
    if brk == "value_matmul_missing":
        return g.op("Mul", g.op("ReduceSum", probs, g.ints(-1), keepdims=1), v)
    return g.op("MatMul", probs, v)


def _attention(
    g: Graph, x: str, i: int, p: BlockParams, r: Recipe, ctx: _Context, brk: str | None
) -> tuple[str, dict[str, str]]:
    """The attention sub-block up to and including the output projection ``(B, T, d)``."""
    (q, k, v), names = _project(g, x, i, p, r, ctx, brk)
    with g.at(r.path("attn", i)):
        q = _heads(g, q, r.n_heads, r, brk, (0, 2, 1, 3))
        if ctx.rope:
            q = rope(g, q, *ctx.rope, r.d_head)
        scores = apply_mask(g, _scores(g, q, _keys(g, k, r, ctx, brk), r, brk), ctx.mask)
        probs = attention_probs(
            g, scores, axis=1 if brk == "softmax_axis" else -1, nan_guard=r.nan_guard
        )
        context = _attend(g, probs, _values(g, v, r, ctx, brk), brk)
        shape_form = "infer" if brk == "head_reshape_mismatch" else r.shape_form
        merged = merge_heads(g, context, r.n_heads * r.d_head, shape_form)
    if brk == "no_output_projection":
        return merged, names
    with g.at(r.path("o", i)):
        stored = emit_weight(g, p.W_O, r.encoding) if r.linear == "matmul" else None
        names["o"] = stored or ""
        return linear(g, merged, p.W_O, p.b_O, _form(r), weight=stored), names


def _mlp(g: Graph, x: str, i: int, p: BlockParams, r: Recipe) -> str:
    with g.at(r.path("up", i)):
        up = linear(g, x, p.W_up, p.b_up, _form(r))
        if p.W_gate is None:
            hidden = gelu(g, up)
    if p.W_gate is not None:
        with g.at(r.path("gate", i)):
            hidden = g.op("Mul", silu(g, linear(g, x, p.W_gate, None, _form(r))), up)
    with g.at(r.path("down", i)):
        return linear(g, hidden, p.W_down, p.b_down, _form(r))


def _scaled(g: Graph, x: str, scale: np.ndarray | None, path: str) -> str:
    if scale is None:
        return x
    with g.at(path):
        return g.op("Mul", x, g.weight(scale, leaf="lambda1"))


def _block(
    g: Graph, x: str, i: int, p: BlockParams, r: Recipe, ctx: _Context, brk: str | None
) -> tuple[str, dict[str, str]]:
    """One transformer block: pre-LN ``x + ls*attn(N(x))`` or post-LN ``N(x + attn(x))``, + MLP."""
    if r.norm == "post":
        attended, names = _attention(g, x, i, p, r, ctx, brk)
        with g.at(r.path("norm1", i)):
            h = _norm(g, g.op("Add", attended, x), p.norm1, r)
        with g.at(r.path("norm2", i)):
            return _norm(g, g.op("Add", _mlp(g, h, i, p, r), h), p.norm2, r), names
    with g.at(r.path("norm1", i)):
        normed = _norm(g, x, p.norm1, r)
    attended, names = _attention(g, normed, i, p, r, ctx, brk)
    with g.at(r.path("layer", i)):
        h = g.op(
            "Add", x, _scaled(g, attended, p.ls1, r.path("ls1", i) if p.ls1 is not None else "")
        )
    with g.at(r.path("norm2", i)):
        normed = _norm(g, h, p.norm2, r)
    mlp = _scaled(g, _mlp(g, normed, i, p, r), p.ls2, r.path("ls2", i) if p.ls2 is not None else "")
    with g.at(r.path("layer", i)):
        return g.op("Add", h, mlp), names


def _classifier_head(g: Graph, x: str, r: Recipe, head: tuple[np.ndarray, np.ndarray]) -> None:
    """Softmax(x_cls W + b): a Softmax whose input is not a Q-K product."""
    with g.at(r.path("head")):
        cls = g.op("Gather", x, g.const(0, np.int64), axis=1)
        logits = g.op("Add", g.op("MatMul", cls, g.weight(head[0])), g.weight(head[1], leaf="bias"))
        g.rename_output(g.op("Softmax", logits, axis=-1), "probabilities")
    g.output("probabilities", ["batch", N_CLASSES])


# -- expected values ----------------------------------------------------------------------------


def _expected(i: int, p: BlockParams, r: Recipe) -> ExpectedBlock:
    enc = r.encoding if r.linear == "matmul" else "float32"
    bias_enc = "float32" if enc == "int8" else enc
    return ExpectedBlock(
        index=i,
        n_heads=r.n_heads,
        n_kv_heads=r.kv_heads,
        d_model=r.d_model,
        d_head=r.d_head,
        norm=r.norm,
        norm_kind=r.norm_kind,
        W_Q=effective(p.W_Q, enc),
        W_K=effective(p.W_K, enc),
        W_V=effective(p.W_V, enc),
        W_O=effective(p.W_O, enc),
        b_Q=effective(p.b_Q, bias_enc),
        b_K=effective(p.b_K, bias_enc),
        b_V=effective(p.b_V, bias_enc),
        b_O=effective(p.b_O, bias_enc),
        gamma=effective(p.norm1.gamma, "float32"),
        beta=effective(p.norm1.beta, "float32"),
        layer_scale=effective(p.ls1, "float32"),
    )


@dataclass(frozen=True)
class MlpReference:
    """The rest of one block in float64: the MLP's norm, weights and LayerScale."""

    norm_gamma: F64
    norm_beta: F64 | None
    W_up: F64
    b_up: F64 | None
    W_down: F64
    b_down: F64 | None
    W_gate: F64 | None
    layer_scale: F64 | None


@dataclass(frozen=True)
class Reference:
    """What a NumPy forward pass needs besides the ``ExpectedBlock`` weights.

    ``mask``: the ``Recipe.mask`` kind; ``rope_angles``: ``(T, dh)`` rotary angles or None;
    ``output``: the graph output holding the last hidden state ``(B, T, d)``.
    """

    recipe: Recipe
    word_embeddings: F64 | None
    position_embeddings: F64 | None
    embed_norm: tuple[F64, F64 | None] | None
    mlps: list[MlpReference]
    final_norm: tuple[F64, F64 | None] | None
    rope_angles: F64 | None
    output: str = "last_hidden_state"


def _f64(value: np.ndarray | None) -> F64 | None:
    return None if value is None else value.astype(np.float64)


def _norm64(norm: Norm | None) -> tuple[F64, F64 | None] | None:
    return None if norm is None else (_f64(norm.gamma), _f64(norm.beta))


def _mlp_reference(p: BlockParams, r: Recipe) -> MlpReference:
    enc = r.encoding if r.linear == "matmul" else "float32"
    bias_enc = "float32" if enc == "int8" else enc
    return MlpReference(
        norm_gamma=_f64(p.norm2.gamma),
        norm_beta=_f64(p.norm2.beta),
        W_up=effective(p.W_up, enc),
        b_up=effective(p.b_up, bias_enc),
        W_down=effective(p.W_down, enc),
        b_down=effective(p.b_down, bias_enc),
        W_gate=effective(p.W_gate, enc),
        layer_scale=_f64(p.ls2),
    )


def _reference(r: Recipe, m: ModelParams) -> Reference:
    return Reference(
        recipe=r,
        word_embeddings=_f64(m.word),
        position_embeddings=_f64(m.position),
        embed_norm=_norm64(m.embed_norm),
        mlps=[_mlp_reference(p, r) for p in m.blocks],
        final_norm=_norm64(m.final_norm),
        rope_angles=rope_angles(r.n_tokens, r.d_head).astype(np.float64) if r.rope else None,
    )


# -- public builders ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Assembly:
    """A built variant with its reference data; ``weight_names`` maps, per block, ``q``/``k``/
    ``v``/``o`` to the tensor the projection MatMul reads (the initializer for float32)."""

    built: Built
    reference: Reference
    weight_names: list[dict[str, str]] = field(default_factory=list)


def _assemble(r: Recipe, seed: int, brk: str | None = None) -> Assembly:
    m = _draw_model(r, seed)
    g = Graph(r.style, r.opset)
    x = _embed(g, r, m)
    ctx = _context(g, r, m, brk)
    names = []
    for i, p in enumerate(m.blocks):
        x, block_names = _block(g, x, i, p, r, ctx, brk if i == 0 else None)
        names.append(block_names)
    if m.final_norm is not None:
        with g.at(r.path("final")):
            x = _norm(g, x, m.final_norm, r)
    g.rename_output(x, "last_hidden_state")
    g.output("last_hidden_state", ["batch", r.n_tokens, r.d_model])
    if brk == "not_qk_product":
        _classifier_head(g, "last_hidden_state", r, m.head)
    blocks = [_expected(i, p, r) for i, p in enumerate(m.blocks)]
    built = Built(model=g.build(), blocks=blocks, inputs=dict(g.feeds))
    return Assembly(built, _reference(r, m), names)


def _dequantised(model: onnx.ModelProto, name: str) -> F64:
    """``float32(q - zero_point) * scale`` (float32 multiply) of ``quantize_dynamic``'s weight."""
    tensors = {t.name: t for t in model.graph.initializer}
    q = numpy_helper.to_array(tensors[f"{name}_quantized"]).astype(np.int32)
    zero = numpy_helper.to_array(tensors[f"{name}_zero_point"]).astype(np.int32)
    scale = numpy_helper.to_array(tensors[f"{name}_scale"]).astype(np.float32)
    return ((q - zero).astype(np.float32) * scale).astype(np.float64)


def _dynamic_quant(seed: int) -> Assembly:
    """``bert_dynamo`` after ``onnxruntime.quantization.quantize_dynamic`` (QInt8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    base = _assemble(RECIPES["bert_dynamo"], seed)
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder, "float.onnx"), Path(folder, "dynamic.onnx")
        onnx.save(base.built.model, source)
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        model = onnx.load(target)
    blocks = [
        replace(
            block,
            W_Q=_dequantised(model, names["q"]),
            W_K=_dequantised(model, names["k"]),
            W_V=_dequantised(model, names["v"]),
            W_O=_dequantised(model, names["o"]),
        )
        for block, names in zip(base.built.blocks, base.weight_names, strict=True)
    ]
    return replace(base, built=Built(model, blocks, base.built.inputs))


def assemble(name: str, seed: int) -> Assembly:
    """Build variant ``name`` (a key of ``VARIANTS``) from ``seed``."""
    if name == "dynamic_quant":
        return _dynamic_quant(seed)
    return _assemble(RECIPES[name], seed)


#: tag -> (variant it breaks, description). Block 0 is the broken one; block 1 stays intact.
NEAR_MISS_SPECS: dict[str, tuple[str, str]] = {
    "value_matmul_missing": (
        "bert_legacy",
        "block 0: the Softmax output feeds a ReduceSum over keys that is multiplied elementwise "
        "with V; no MatMul(probabilities, V) exists",
    ),
    "softmax_axis": (
        "bert_dynamo",
        "block 0: the Softmax normalises axis 1 (heads) of the (B, H, T, T) scores instead of the "
        "key axis -1",
    ),
    "q_weight_not_constant": (
        "bert_legacy",
        "block 0: the Q projection MatMul reads its weight from the graph input 'query_weight', "
        "not from an initializer or Constant",
    ),
    "no_output_projection": (
        "vit_prenorm_layerscale",
        "block 0: the merged heads go through LayerScale straight into the residual Add; no "
        "MatMul with a constant W_O follows the attention",
    ),
    "head_reshape_mismatch": (
        "vit_prenorm_layerscale",
        "block 0: Q, K and V are reshaped to [0, -1, H, d_head/2], so H*d_head/2 does not match "
        "the projection width H*d_head (the token axis silently doubles)",
    ),
    "not_qk_product": (
        "bert_dynamo",
        "both blocks are intact; an extra classifier head applies Softmax to MatMul(CLS token, "
        "constant) + bias, a Softmax whose input is not a query-key product",
    ),
    "k_not_transposed": (
        "bert_legacy",
        "block 0: K is only head-split (perm [0, 2, 1, 3]) and never transposed, so the score "
        "MatMul is Q K rather than Q K^T (it runs only because d_head equals the token count)",
    ),
    "qkv_split_axis": (
        "gpt2_fused_qkv",
        "block 0: the fused QKV output is Split along the token axis 1 instead of the feature "
        "axis -1; the [0, -1, H, d_head] reshape hides the mismatch",
    ),
    "kv_from_other_input": (
        "bert_dynamo",
        "block 0: K and V are projections of the graph input 'encoder_hidden_states', not of the "
        "tensor Q is projected from (cross-attention, not self-attention)",
    ),
    "value_not_projected": (
        "bert_legacy",
        "block 0: the Softmax output is multiplied by a constant (1, H, T, d_head) initializer "
        "instead of a projection of the tokens; there is no V projection",
    ),
    "score_scale_not_constant": (
        "scale_mul_scores",
        "block 0: the scores are multiplied by 1/ReduceMax(|Q|), a value computed from the input, "
        "instead of a constant 1/sqrt(d_head)",
    ),
    "int8_scale_not_constant": (
        "int8_weight_only",
        "block 0: the int8 Q weight is dequantised with a scale read from the graph input "
        "'query_weight_scale', so W_Q is not a constant",
    ),
}


def assemble_near_miss(tag: str, seed: int) -> Assembly:
    """Build near miss ``tag`` (a key of ``NEAR_MISSES``) from ``seed``."""
    return _assemble(RECIPES[NEAR_MISS_SPECS[tag][0]], seed, brk=tag)


def _variant(name: str) -> Callable[[int], Built]:
    def build(seed: int) -> Built:
        return assemble(name, seed).built

    build.__name__ = name
    return build


def _near_miss(tag: str) -> Callable[[int], NearMiss]:
    def build(seed: int) -> NearMiss:
        return NearMiss(assemble_near_miss(tag, seed).built.model, tag, NEAR_MISS_SPECS[tag][1])

    build.__name__ = tag
    return build


VARIANTS: dict[str, Callable[[int], Built]] = {
    name: _variant(name) for name in [*RECIPES, "dynamic_quant"]
}
NEAR_MISSES: dict[str, Callable[[int], NearMiss]] = {
    tag: _near_miss(tag) for tag in NEAR_MISS_SPECS
}
