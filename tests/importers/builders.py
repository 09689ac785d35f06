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

Every weight is drawn in float32 and stored exactly. The float16 and weight-only int8 variants
report the values the graph computes with: the float16 numbers, and ``float32(q) * scale`` rounded
in float32 as the dequantising ``Mul`` does. ``dynamic_quant`` reports ``(q - zero_point) * scale``
exactly (in float64), since its graph never forms that product on its own.
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
    FLOAT32_MIN,
    LEGACY,
    N_CLASSES,
    BlockParams,
    Graph,
    LinearForm,
    Mask,
    ModelParams,
    Norm,
    Recipe,
    apply_mask,
    attention_probs,
    causal_mask,
    draw_model,
    effective,
    emit_weight,
    expand_kv,
    gelu,
    layer_norm,
    linear,
    merge_heads,
    merged_batch_heads,
    padding_bias_legacy,
    padding_bias_where,
    padding_bool,
    rms_norm,
    rope,
    rope_angles,
    scaled_scores,
    silu,
    split_batch_heads,
    split_fused,
    split_heads,
)

__all__ = [
    "NEAR_MISSES",
    "NEAR_MISS_SPECS",
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
    "assemble_recipe",
    "poisoned",
]

F64 = np.ndarray


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


# -- the variants -----------------------------------------------------------------------------

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
    "gpt2_gemm_conv1d": replace(_GPT2, style=LEGACY, linear="gemm", d_model=24, n_tokens=5),
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
    "batched_3d_scores": replace(_BERT_LEGACY, batched_3d=True, n_tokens=7),
    "tokens_first_view": replace(_BERT_DYNAMO, tokens_first_view=True, n_tokens=5),
}


# -- graph assembly -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shared:
    """Model-level tensors every attention block reads."""

    mask: Mask | None
    rope: tuple[str, str] | None
    memory: str | None


class _Assembler:
    """Emits one model from its recipe and drawn parameters; ``brk`` breaks block 0 only.

    ``weight_names[i]`` maps ``q``/``k``/``v``/``o`` to the tensor block ``i``'s projection
    MatMul reads as its weight (the initializer itself for float32 weights).
    """

    def __init__(self, r: Recipe, m: ModelParams, brk: str | None) -> None:
        self.r, self.m, self.brk = r, m, brk
        self.g = Graph(r.style, r.opset)
        self.form = LinearForm(r.linear, r.encoding)
        self.broken: str | None = None
        self.weight_names: list[dict[str, str]] = []

    def build(self) -> onnx.ModelProto:
        g, r, m = self.g, self.r, self.m
        x = self._embed()
        self.shared = self._shared()
        for i, p in enumerate(m.blocks):
            self.broken = self.brk if i == 0 else None
            self.weight_names.append({})
            x = self._block(x, i, p)
        if m.final_norm is not None:
            with g.at(r.path("final")):
                x = self._norm(x, m.final_norm)
        g.rename_output(x, "last_hidden_state")
        g.output("last_hidden_state", ["batch", r.n_tokens, r.d_model])
        if self.brk == "not_qk_product":
            self._classifier_head("last_hidden_state")
        return g.build()

    # -- model level ---------------------------------------------------------------------------

    def _norm(self, x: str, norm: Norm) -> str:
        if self.r.norm_kind == "rmsnorm":
            return rms_norm(self.g, x, norm.gamma, eps=self.r.eps)
        return layer_norm(self.g, x, norm.gamma, norm.beta, fused=self.r.fused_ln, eps=self.r.eps)

    def _embed(self) -> str:
        g, r, m = self.g, self.r, self.m
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
            return self._norm(x, m.embed_norm)

    def _mask(self) -> Mask | None:
        g, r = self.g, self.r
        if r.mask == "none":
            return None
        if r.mask.startswith("causal"):
            return causal_mask(g, r.n_tokens, "where" if r.mask == "causal_where" else "add")
        ids = g.input("attention_mask", self.m.feeds["attention_mask"], ["batch", r.n_tokens])
        if r.mask == "padding_legacy":
            return padding_bias_legacy(g, ids)
        if r.mask == "padding_where_bias":
            return padding_bias_where(g, ids)
        return Mask("where", padding_bool(g, ids))

    def _shared(self) -> _Shared:
        g, r = self.g, self.r
        tables = None
        if r.rope:
            with g.at("model/rotary_emb"):
                angles = g.const(rope_angles(r.n_tokens, r.d_head))
                tables = (g.op("Cos", angles), g.op("Sin", angles))
        memory = None
        if self.brk == "kv_from_other_input":
            dims = ["batch", r.n_tokens, r.d_model]
            memory = g.input("encoder_hidden_states", self.m.memory, dims)
        return _Shared(self._mask(), tables, memory)

    def _classifier_head(self, x: str) -> None:
        """Softmax(x_cls W + b): a Softmax whose input is not a query-key product."""
        g, (W, b) = self.g, self.m.head
        with g.at(self.r.path("head")):
            cls = g.op("Gather", x, g.const(0, np.int64), axis=1)
            logits = g.op("Add", g.op("MatMul", cls, g.weight(W)), g.weight(b, leaf="bias"))
            g.rename_output(g.op("Softmax", logits, axis=-1), "probabilities")
        g.output("probabilities", ["batch", N_CLASSES])

    # -- one block -----------------------------------------------------------------------------

    def _block(self, x: str, i: int, p: BlockParams) -> str:
        """Post-LN ``N2(h + mlp(h)), h = N1(x + attn(x))`` or pre-LN ``h + ls2 mlp(N2(h)),
        h = x + ls1 attn(N1(x))``."""
        g, r = self.g, self.r
        if r.norm == "post":
            attended = self._attention(x, i, p)
            with g.at(r.path("norm1", i)):
                h = self._norm(g.op("Add", attended, x), p.norm1)
            update = self._mlp(h, i, p)
            with g.at(r.path("norm2", i)):
                return self._norm(g.op("Add", update, h), p.norm2)
        with g.at(r.path("norm1", i)):
            normed = self._norm(x, p.norm1)
        attended = self._scaled(self._attention(normed, i, p), p.ls1, "ls1", i)
        with g.at(r.path("layer", i)):
            h = g.op("Add", x, attended)
        with g.at(r.path("norm2", i)):
            normed = self._norm(h, p.norm2)
        update = self._scaled(self._mlp(normed, i, p), p.ls2, "ls2", i)
        with g.at(r.path("layer", i)):
            return g.op("Add", h, update)

    def _scaled(self, x: str, scale: np.ndarray | None, role: str, i: int) -> str:
        """LayerScale: ``x * lambda`` when the recipe has it."""
        if scale is None:
            return x
        with self.g.at(self.r.path(role, i)):
            return self.g.op("Mul", x, self.g.weight(scale, leaf="lambda1"))

    def _mlp(self, x: str, i: int, p: BlockParams) -> str:
        g, r = self.g, self.r
        with g.at(r.path("up", i)):
            up = linear(g, x, p.W_up, p.b_up, self.form)
            if p.W_gate is None:
                hidden = gelu(g, up)
        if p.W_gate is not None:
            with g.at(r.path("gate", i)):
                hidden = g.op("Mul", silu(g, linear(g, x, p.W_gate, None, self.form)), up)
        with g.at(r.path("down", i)):
            return linear(g, hidden, p.W_down, p.b_down, self.form)

    # -- attention -----------------------------------------------------------------------------

    def _attention(self, x: str, i: int, p: BlockParams) -> str:
        """The attention sub-block up to and including the output projection, ``(B, T, d)``."""
        g, r, shared = self.g, self.r, self.shared
        q, k, v = self._project(x, i, p)
        with g.at(r.path("attn", i)):
            q = self._heads(q, r.n_heads, (0, 2, 1, 3))
            if shared.rope:
                q = rope(g, q, *shared.rope, r.d_head)
            if r.batched_3d:
                context = self._attend_batched_3d(q, self._keys(k), self._values(v))
            else:
                scores = apply_mask(g, self._scores(q, self._keys(k)), shared.mask)
                axis = 1 if self.broken == "softmax_axis" else -1
                probs = attention_probs(g, scores, axis=axis, nan_guard=r.nan_guard)
                context = self._attend(probs, self._values(v))
            shape_form = "infer" if self.broken == "head_reshape_mismatch" else r.shape_form
            if r.tokens_first_view:  # (B, H, T, dh) -> (T, B, H·dh)
                tokens_first = g.op("Transpose", context, perm=[2, 0, 1, 3])
                merged = g.op("Reshape", tokens_first, g.ints(0, 0, r.n_heads * r.d_head))
            else:
                merged = merge_heads(g, context, r.n_heads * r.d_head, shape_form)
        if self.broken == "no_output_projection":
            return merged
        with g.at(r.path("o", i)):
            out = linear(g, merged, p.W_O, p.b_O, self.form, weight=self._stored(p.W_O, "o"))
        return g.op("Transpose", out, perm=[1, 0, 2]) if r.tokens_first_view else out

    def _attend_batched_3d(self, q: str, k_t: str, v: str) -> str:
        """``(B, H, T, dh)`` context from products of ``(B·H, T, ·)`` tensors (``batched_3d``)."""
        g, r = self.g, self.r
        scores = self._scores(merged_batch_heads(g, q), merged_batch_heads(g, k_t))
        scores = apply_mask(g, split_batch_heads(g, scores, q), self.shared.mask)
        floored = g.op("Max", scores, g.const(FLOAT32_MIN))
        probs = attention_probs(g, merged_batch_heads(g, floored), nan_guard=r.nan_guard)
        return split_batch_heads(g, self._attend(probs, merged_batch_heads(g, v)), q)

    def _stored(self, W: np.ndarray, role: str) -> str | None:
        """Store projection ``role``'s weight and record its name (None: Gemm stores its own)."""
        if role == "q" and self.broken == "q_weight_not_constant":
            stored = self.g.input("query_weight", W, list(W.shape))
        elif role == "q" and self.broken == "int8_scale_not_constant":
            stored = emit_weight(self.g, W, "int8", scale_input="query_weight_scale")
        elif self.r.linear == "matmul":
            stored = emit_weight(self.g, W, self.r.encoding)
        else:
            return None
        self.weight_names[-1][role] = stored
        return stored

    def _project(self, x: str, i: int, p: BlockParams) -> list[str | None]:
        """Q, K, V ``(B, T, width)``; V is None when the near miss replaces it by a constant."""
        if self.r.qkv != "separate":
            return self._project_fused(x, i, p)
        if self.r.tokens_first_view:  # nn.MultiheadAttention's (T, B, d) view of the stream
            x = self.g.op("Transpose", x, perm=[1, 0, 2])
        kv_input = self.shared.memory or x
        outputs: list[str | None] = []
        for role, W, b, source in (
            ("q", p.W_Q, p.b_Q, x),
            ("k", p.W_K, p.b_K, kv_input),
            ("v", p.W_V, p.b_V, kv_input),
        ):
            if role == "v" and self.broken == "value_not_projected":
                outputs.append(None)
                continue
            with self.g.at(self.r.path(role, i)):
                stored = self._stored(W, role)
                outputs.append(linear(self.g, source, W, b, self.form, weight=stored))
        return outputs

    def _project_fused(self, x: str, i: int, p: BlockParams) -> list[str]:
        g, r = self.g, self.r
        W = np.concatenate([p.W_Q, p.W_K, p.W_V], axis=1)
        b = np.concatenate([p.b_Q, p.b_K, p.b_V]) if r.biases else None
        with g.at(r.path("qkv", i)):
            qkv = linear(g, x, W, b, self.form)
        widths, how = [p.W_Q.shape[1], p.W_K.shape[1], p.W_V.shape[1]], r.qkv
        if self.broken == "qkv_split_axis":
            widths, how = [r.n_tokens // 3] * 3, "split_tokens"
        with g.at(r.path("attn", i)):
            return split_fused(g, qkv, widths, how, (r.n_heads, r.d_head))

    def _heads(self, t: str, n_heads: int, perm: tuple[int, ...]) -> str:
        """Head split of one projection; ``gather`` projections are already ``(B, T, H, dh)``."""
        r = self.r
        if r.qkv == "gather":
            return self.g.op("Transpose", t, perm=list(perm))
        if r.tokens_first_view:  # the split is (T, B, H, dh): swap the roles of axes 0 and 1
            perm = tuple((1, 0, 2, 3)[axis] for axis in perm)
        if self.broken == "head_reshape_mismatch":
            return split_heads(self.g, t, n_heads, r.d_head // 2, "infer", perm)
        return split_heads(self.g, t, n_heads, r.d_head, r.shape_form, perm)

    def _keys(self, k: str) -> str:
        """``(B, H, dh, T)`` keys from the K projection: head split, RoPE, GQA, transpose."""
        g, r = self.g, self.r
        if self.broken == "k_not_transposed":
            return self._heads(k, r.kv_heads, (0, 2, 1, 3))
        if r.k_perm == "direct":
            return self._heads(k, r.kv_heads, (0, 2, 3, 1))
        k = self._heads(k, r.kv_heads, (0, 2, 1, 3))
        if self.shared.rope:
            k = rope(g, k, *self.shared.rope, r.d_head)
        return g.op("Transpose", self._grouped(k), perm=[0, 1, 3, 2])

    def _values(self, v: str | None) -> str:
        if v is None:
            return self.g.weight(self.m.value_table)
        return self._grouped(self._heads(v, self.r.kv_heads, (0, 2, 1, 3)))

    def _grouped(self, t: str) -> str:
        """Expand ``(B, Hkv, T, dh)`` to all query heads when there are fewer kv heads."""
        r = self.r
        if r.kv_heads == r.n_heads:
            return t
        return expand_kv(self.g, t, r.n_heads, r.kv_heads, r.d_head)

    def _scores(self, q: str, k_t: str) -> str:
        g = self.g
        if self.broken != "score_scale_not_constant":
            return scaled_scores(g, q, k_t, self.r.d_head, self.r.scale)
        data_scale = g.op("Reciprocal", g.op("ReduceMax", g.op("Abs", q), keepdims=0))
        return g.op("Mul", g.op("MatMul", q, k_t), data_scale)

    def _attend(self, probs: str, v: str) -> str:
        g = self.g
        if self.broken == "value_matmul_missing":
            return g.op("Mul", g.op("ReduceSum", probs, g.ints(-1), keepdims=1), v)
        return g.op("MatMul", probs, v)


# -- expected values ----------------------------------------------------------------------------


def _encodings(r: Recipe) -> tuple[str, str]:
    """How matrices and biases are stored (Gemm variants store float32; int8 biases stay float)."""
    matrices = r.encoding if r.linear == "matmul" else "float32"
    return matrices, "float32" if matrices == "int8" else matrices


def _expected(i: int, p: BlockParams, r: Recipe) -> ExpectedBlock:
    enc, bias_enc = _encodings(r)
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

    ``recipe`` gives the norm kind and epsilon, the mask kind (``Recipe.mask``: padding keys from
    the ``attention_mask`` feed, causal, or none) and the activation; ``rope_angles`` are the
    ``(T, dh)`` rotary angles or None; ``output`` names the graph output holding the last hidden
    state ``(B, T, d)``. Embedding, MLP and final-norm parameters are the float64 values the graph
    computes with.
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
    enc, bias_enc = _encodings(r)
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
    """A built variant with its reference data.

    ``weight_names[i]`` maps ``q``/``k``/``v``/``o`` to the tensor block ``i``'s projection MatMul
    reads as its weight (the initializer itself for float32 weights; empty for Gemm variants).
    """

    built: Built
    reference: Reference
    weight_names: list[dict[str, str]] = field(default_factory=list)


def _assemble(r: Recipe, seed: int, brk: str | None = None) -> Assembly:
    m = draw_model(r, seed)
    assembler = _Assembler(r, m, brk)
    model = assembler.build()
    blocks = [_expected(i, p, r) for i, p in enumerate(m.blocks)]
    built = Built(model=model, blocks=blocks, inputs=dict(assembler.g.feeds))
    return Assembly(built, _reference(r, m), assembler.weight_names)


def _dequantised(model: onnx.ModelProto, name: str) -> F64:
    """``(q - zero_point) * scale`` of a ``quantize_dynamic`` weight, exact in float64.

    The graph never forms this product in float32 (``MatMulInteger`` sums integers, then one
    ``Mul`` applies ``x_scale * w_scale``), and an 8-bit integer times a float32 scale is exact
    in float64, so the exact value is the only unambiguous one.
    """
    tensors = {t.name: t for t in model.graph.initializer}
    q = numpy_helper.to_array(tensors[f"{name}_quantized"]).astype(np.int64)
    zero = numpy_helper.to_array(tensors[f"{name}_zero_point"]).astype(np.int64)
    scale = numpy_helper.to_array(tensors[f"{name}_scale"]).astype(np.float64)
    return (q - zero).astype(np.float64) * scale


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


def assemble_recipe(recipe: Recipe, seed: int) -> Assembly:
    """Build the model ``recipe`` describes (a variant's recipe changed with ``replace``)."""
    return _assemble(recipe, seed)


def poisoned(name: str, seed: int, tensor: str, value: float, *, count: int = 1) -> onnx.ModelProto:
    """Variant ``name`` with ``count`` entries of one float32 initializer set to ``value``.

    ``tensor`` is an initializer name, or ``"<block>.<role>"`` (role ``q``/``k``/``v``/``o``) for a
    projection weight (float32 recipes: the initializer itself), e.g. ``"0.q"``; ``count=-1``
    sets every entry. A NaN γ, a W_Q of inf or a W_V near float32's maximum, for the hostile tests.
    """
    assembly = assemble(name, seed)
    model = assembly.built.model
    block, _, role = tensor.partition(".")
    if block.isdigit() and role in ("q", "k", "v", "o"):
        tensor = assembly.weight_names[int(block)][role]
    for index, initializer in enumerate(model.graph.initializer):
        if initializer.name == tensor:
            array = numpy_helper.to_array(initializer).astype(np.float32)
            flat = array.reshape(-1)
            flat[: flat.size if count < 0 else count] = value
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(array, tensor))
            return model
    raise KeyError(f"{name} has no initializer {tensor!r}")


#: tag -> (variant it breaks, description). Block 0 is the broken one; block 1 stays intact.
NEAR_MISS_SPECS: dict[str, tuple[str, str]] = {
    "value_matmul_missing": (
        "bert_legacy",
        "block 0: the Softmax output feeds a ReduceSum over keys that is multiplied elementwise "
        "with V; no MatMul(probabilities, V) exists (its probabilities are reduced away: not "
        "attention, so the model is audited without it)",
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
        "instead of a projection of the tokens; there is no V projection (a product with a "
        "constant: not attention)",
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
