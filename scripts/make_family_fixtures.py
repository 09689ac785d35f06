"""Regenerate ``tests/fixtures/families/``: tiny random Transformers of many families, exported to ONNX
the ways users export them, each with its truth.

Development only: this script needs torch, transformers, onnx, onnxscript and onnxruntime, which the
project never installs (docs/fixtures.md gives the commands for a separate environment). Nothing is
downloaded: every model is built from a config with seeded random weights (2 layers, d_model 32,
4 heads of 8, vocabulary 128, 32x32 images in 8x8 patches, 8 mel bins).

Per family it writes, under ``<out>/<family>/`` (each ONNX file finally compressed to ``.onnx.xz``):

* ``legacy_eager.onnx`` — ``torch.onnx.export(dynamo=False)``, opset 17, dynamic batch (and sequence
  for text) axes, eager attention;
* ``legacy_opset14.onnx`` — the same at opset 14 for a few families (decomposed LayerNorm);
* ``legacy_sdpa.onnx`` — the same with ``attn_implementation="sdpa"`` where the family has it;
* ``dynamo_eager.onnx`` — ``torch.onnx.export(dynamo=True)``, opset 18 (dynamic axes where the
  exporter accepts them, else the fixed sizes of the sample input);
* ``optimum.onnx`` — optimum's exporter (``main_export``, task feature-extraction, opset 17);
* ``with_past.onnx`` — optimum's exporter with task ``text-generation-with-past`` (the decoder as
  shipped for generation: key/value cache inputs ``past_key_values.*``, ``present.*`` outputs,
  logits), for a few decoders; its truth is the family's, whose feeds then include the empty
  caches (the model audited at past length 0 is the model without a cache);
* ``optimized_with_past.onnx`` — onnxruntime's transformer optimizer (as for ``optimized.onnx``)
  of ``with_past.onnx``, for GPT-2 and Llama (onnxruntime 1.32 fuses no attention of these graphs:
  only the norms, GELU and, at opt level 0, the rotary embedding), and ``fp16_with_past.onnx``, its
  float16 conversion, for Llama, with ``truth_fp16_with_past.npz`` (the weights rounded to float16,
  the empty caches among the feeds);
* ``merged.onnx`` — the decoder without a cache (``present.*`` outputs, no past inputs) and the
  ``with_past`` one merged by optimum's ``merge_decoders`` into one graph with an ``If`` on
  ``use_cache_branch`` (the ``decoder_model_merged.onnx`` of older optimum exports), for GPT-2;
* ``genai_fp32.onnx``, ``genai_int4.onnx`` — onnxruntime-genai's model builder (CPU, fp32 and
  int4, without the LM head) for Llama, Qwen2, Mistral and Phi-3, each made from the family's own
  ``*ForCausalLM`` at d_model 64 (the operator's CPU kernel needs 16-wide heads), with
  ``truth_genai.npz`` and ``truth_genai_int4.npz`` (each weight as the ``MatMulNBits`` multiply);
* ``optimized.onnx`` — ``onnxruntime.transformers.optimizer.optimize_model`` of ``legacy_eager``
  (of ``optimum.onnx`` where the plain legacy export fails);
* ``int8.onnx`` — ``onnxruntime.quantization.quantize_dynamic`` (int8 weights) of the same;
* ``truth.npz`` — the float model's truth; ``truth_int8.npz`` — the same model with every weight that
  ``int8.onnx`` quantised replaced by its dequantised value;
* ``nbits.onnx`` — onnxruntime's 4-bit ``MatMulNBits`` block quantisation of the same, for a few
  families, with ``truth_nbits.npz`` made the same way (each weight as onnxruntime multiplies by it);
* ``fp16.onnx`` — onnxruntime's float16 conversion of the same, for the same families, with
  ``truth_fp16.npz`` (the weights rounded to float16).

A truth file holds, per attention layer ``l``: ``W_Q[l]`` (d_model, H·d_head), ``W_K[l]`` and
``W_V[l]`` (d_model, H_kv·d_head), ``W_O[l]`` (H·d_head, d_model) in the project's row-vector
convention (``y = x @ W``, head h in columns ``h·d_head:(h+1)·d_head``; W_Q and W_K before any rotary
embedding and without the 1/sqrt(d_head) score scale); ``n_heads``, ``n_kv_heads``, ``d_head``;
``hidden`` (n_layers + 1, batch, tokens, d_model): the residual stream entering block 0 (captured by
a forward pre-hook) and each block's output (forward hooks, before any final norm); and the input
feeds as ``feed_<graph input name>``. ``manifest.json`` lists every fixture with its family,
exporter, opset, variant, file, sha256, truth file and architectural features.

Usage::

    python scripts/make_family_fixtures.py [--out tests/fixtures/families] [--only bert,gpt2]
    python scripts/make_family_fixtures.py --only gpt2,llama --with-past-only
    python scripts/make_family_fixtures.py --only llama,qwen2,mistral,phi3 --genai-only
    python scripts/make_family_fixtures.py --static-only
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import io
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch  # noqa: TID251 (development-only script)
import transformers as tf
from onnx import numpy_helper
from torch import nn  # noqa: TID251

ROOT = Path(__file__).resolve().parents[1]
SEED = 0
D_MODEL, N_HEADS, N_KV, D_FF, VOCAB, N_LAYERS = 32, 4, 2, 64, 128, 2
BATCH, TOKENS = 2, 8
IMAGE, PATCH, MELS, AUDIO_POSITIONS = 32, 8, 8, 16
#: Tokens of the encoder output a decoder's cross-attention reads (``encoder_hidden_states``):
#: fewer than the decoder's, so the cross-attention's (query, key) matrix is not square.
ENCODER_TOKENS = 6
#: Samples of a raw waveform: HuBERT's convolutions (kernel 10 stride 5, kernel 3 stride 2) leave
#: 15 frames.
WAVE = 160
LEGACY_OPSET, DYNAMO_OPSET = 17, 18
#: 4-bit ``MatMulNBits`` and float16 variants: an encoder, a fused-QKV decoder, a GQA rotary
#: decoder, a ViT.
NBITS_FAMILIES = frozenset({"bert", "gpt2", "llama", "vit"})
#: Legacy exports at opset 14 as well (no LayerNormalization op: the norms are decomposed), for
#: encoders whose legacy export works: text, vision, audio, and T5's RMSNorm.
OPSET14_FAMILIES = frozenset({"bert", "vit", "whisper_encoder", "t5_encoder", "gpt_neo"})
OLD_LEGACY_OPSET = 14
#: Static int8 quantisation (``quantize_static``, QDQ and QOperator forms, calibrated on the
#: sample feeds): text encoders, a ViT, an audio encoder, T5's RMSNorm and a rotary GQA decoder.
STATIC_FAMILIES = frozenset({"bert", "distilbert", "vit", "whisper_encoder", "t5_encoder", "llama"})
#: Families quantised statically only at their products (``op_types_to_quantize``), as decoders
#: are deployed: the quantiser's default also quantises T5's relative-position bucket arithmetic
#: (its Gather then reads out of range) and Llama's additive causal mask (the output then differs
#: from the float model's by 44 % in QDQ form and 90 % in QOperator form, against 1.1 % with
#: the products alone); every other family takes the quantiser's default op types.
STATIC_PRODUCTS_ONLY = frozenset({"t5_encoder", "llama"})
#: Codes per block along the input axis (d_model 32: two blocks per weight column).
NBITS_BLOCK = 16
#: Decoders also exported as shipped for generation, with key/value cache inputs (``with_past``):
#: GPT-2 (fused Conv1D QKV, no GQA), Llama (separate projections, rotary, GQA), Phi-3 (fused QKV
#: sliced, rotary, GQA). Qwen2 and Mistral read the same way (checked, not kept: each file is about
#: 95 kB compressed and the corpus has a 20 MiB limit).
WITH_PAST_FAMILIES = frozenset({"gpt2", "llama", "phi3"})
WITH_PAST_TASK = "text-generation-with-past"
#: ``with_past`` files also run through onnxruntime's optimizer (``optimized_with_past``; about
#: 95 kB compressed each), and of those also converted to float16 (``fp16_with_past``, 55 kB).
#: Phi-3's reads as Llama's does; at opt level 0 (or for the GPU) the optimizer also fuses the
#: rotary embedding, with cos/sin caches of 131072 positions (2.9 MB compressed: not kept).
OPTIMIZED_WITH_PAST_FAMILIES = frozenset({"gpt2", "llama"})
FP16_WITH_PAST_FAMILIES = frozenset({"llama"})
#: Decoders also built by onnxruntime-genai's model builder (``genai_fp32``, ``genai_int4``:
#: ``GroupQueryAttention`` with its KV cache and rotary caches, ``SkipSimplifiedLayerNormalization``,
#: 4-bit ``MatMulNBits`` for int4), each from its own ``*ForCausalLM`` of d_model
#: :data:`GENAI_D_MODEL` (onnxruntime's CPU kernel needs a head size that is a multiple of 16),
#: with the config changes given here (Mistral: a sliding window the operator's
#: ``local_window_size`` carries).
GENAI_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("Llama", {}),
    "qwen2": ("Qwen2", {}),
    "mistral": ("Mistral", {"sliding_window": 4}),
    "phi3": ("Phi3", {"original_max_position_embeddings": 64, "sliding_window": None}),
}
GENAI_D_MODEL = 64
GENAI_EXPORTER = "onnxruntime-genai model builder"
#: Decoders also exported merged (``merged``: optimum's older ``decoder_model_merged.onnx``, an
#: ``If`` on ``use_cache_branch`` between the decoder without a cache and the one with it).
MERGED_FAMILIES = frozenset({"gpt2"})

Weights = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Family:
    """One Transformer family: how to build it, where its blocks are and how to read its weights.

    Attributes
    ----------
    name : str
        Fixture folder name.
    make : callable
        ``attn_implementation -> nn.Module`` (the base model or its encoder).
    blocks : str
        Dotted path of the ``nn.ModuleList`` of blocks.
    proj : tuple of str
        ``(kind, *paths)``: ``("separate", q, k, v, o)``, ``("mha", attention)`` (PyTorch's
        ``nn.MultiheadAttention``: ``in_proj_weight`` and ``out_proj``), ``("gpt2", qkv, o)`` (Conv1D [q|k|v]),
        ``("headwise", qkv, o)`` (per head [q k v]) or ``("concat", qkv, o)`` ([q | k | v] with
        the family's kv head count).
    inputs : str
        ``"text"``, ``"image"``, ``"audio"`` (mel features) or ``"waveform"`` (raw samples).
    features : dict
        Written to the manifest: norm, rotary, parallel, causal, score_bias, gqa.
    n_kv : int
        Key/value heads.
    sdpa : bool
        Whether ``attn_implementation="sdpa"`` exists for the family.
    optimizer : str or None
        ``model_type`` for onnxruntime's transformer optimizer (None: not attempted).
    repeat : int
        How many times each block module runs (ALBERT shares one layer: 2).
    optimum : bool
        Whether to export with optimum's ``main_export`` (not for an encoder taken out of an
        encoder-decoder model).
    legacy_only : bool
        Whether only ``legacy_eager.onnx`` (and the truth) is made: for a family kept for one
        structure (the corpus has a size limit).
    d_model : int
        The width of the residual stream (:data:`GENAI_D_MODEL` for the genai routes' models).
    variants : frozenset of str or None
        The only variants made besides ``legacy_eager`` (None: every one that applies), for a
        family kept for one route (the corpus size limit).
    build : callable or None
        ``(corpus, family) -> None`` for a family that is no torch model (Keras): it builds,
        exports and records its own fixtures instead of :func:`build_family`.
    channels_first : bool
        The blocks carry the stream as (batch, features, tokens) (SqueezeBERT): the truth's
        hidden states are transposed to the project's (batch, tokens, features).
    hooked : (str, str)
        The submodules of a block whose input and output are the block's, where the block's own
        hooks do not fire (SqueezeBERT's encoder calls ``layer.forward`` directly); "": the block.
    encoder_states : bool
        The model is a decoder stack with cross-attention: it also takes ``encoder_hidden_states``
        (batch, :data:`ENCODER_TOKENS`, d_model), random, and ``encoder_attention_mask`` (unless
        ``encoder_mask`` is False: Whisper's decoder takes none). Its
        blocks are the decoder layers (self-attention, cross-attention, MLP); the truth's weights
        are the self-attention's, the cross-attention being outside the theory.
    pooled : bool
        The model's output is one vector per input (batch, d_model), not a sequence.
    """

    name: str
    make: Callable[[str], nn.Module]
    blocks: str
    proj: tuple[str, ...]
    inputs: str
    features: dict[str, Any]
    n_kv: int = N_HEADS
    sdpa: bool = True
    optimizer: str | None = "bert"
    repeat: int = 1
    optimum: bool = True
    legacy_only: bool = False
    d_model: int = D_MODEL
    variants: frozenset[str] | None = None
    build: Callable[[Corpus, Family], None] | None = None
    channels_first: bool = False
    hooked: tuple[str, str] = ("", "")
    encoder_states: bool = False
    encoder_mask: bool = True
    pooled: bool = False

    def wants(self, variant: str) -> bool:
        """Whether ``variant`` is made for this family."""
        return not self.legacy_only and (self.variants is None or variant in self.variants)


def _features(
    norm: str,
    *,
    rotary: str = "none",
    parallel: bool = False,
    causal: bool = False,
    score_bias: str = "none",
    gqa: bool = False,
) -> dict[str, Any]:
    return {
        "norm": norm,
        "rotary": rotary,
        "parallel": parallel,
        "causal": causal,
        "score_bias": score_bias,
        "gqa": gqa,
    }


def _text(**extra: Any) -> dict[str, Any]:
    """Common text config keywords (BERT naming)."""
    base = {
        "vocab_size": VOCAB,
        "hidden_size": D_MODEL,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS,
        "intermediate_size": D_FF,
        "max_position_embeddings": 64,
    }
    return base | extra


def _decoder(**extra: Any) -> dict[str, Any]:
    """Common decoder config keywords (Llama naming, GQA 4 → 2)."""
    return _text(num_key_value_heads=N_KV, pad_token_id=0, bos_token_id=1, eos_token_id=2) | extra


def _vision(**extra: Any) -> dict[str, Any]:
    base = {
        "hidden_size": D_MODEL,
        "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS,
        "intermediate_size": D_FF,
        "image_size": IMAGE,
        "patch_size": PATCH,
        "num_channels": 3,
    }
    return base | extra


def _build(model_cls: Any, config: Any, attn: str, **kwargs: Any) -> nn.Module:
    config._attn_implementation = attn
    torch.manual_seed(SEED)
    return model_cls(config, **kwargs).eval()


def _hf(model: str, cfg: str, config: dict[str, Any], **kwargs: Any) -> Callable[[str], nn.Module]:
    """A ``make`` function: ``transformers.<model>(transformers.<cfg>(**config), **kwargs)``."""

    def make(attn: str) -> nn.Module:
        return _build(getattr(tf, model), getattr(tf, cfg)(**config), attn, **kwargs)

    return make


def _encoder_of(model: str, cfg: str, config: dict[str, Any]) -> Callable[[str], nn.Module]:
    """A ``make`` function returning the encoder of an encoder-decoder model."""

    def make(attn: str) -> nn.Module:
        whole = _build(getattr(tf, model), getattr(tf, cfg)(**config), attn)
        return whole.get_encoder().eval()

    return make


def _decoder_of(model: str, cfg: str, config: dict[str, Any]) -> Callable[[str], nn.Module]:
    """A ``make`` function returning the decoder stack of an encoder-decoder model (its own token
    embedding, self- and cross-attention per layer)."""

    def make(attn: str) -> nn.Module:
        whole = _build(getattr(tf, model), getattr(tf, cfg)(**config), attn)
        return whole.get_decoder().eval()

    return make


def _stablelm(config: dict[str, Any]) -> Callable[[str], nn.Module]:
    """A ``make`` function for StableLM: transformers 4.57's ``_init_weights`` zeroes every
    LayerNorm's bias, and the per-head Q/K LayerNorms of ``qk_layernorm`` have none; here those
    get only the weight 1 that ``_init_weights`` gives every LayerNorm."""

    def make(attn: str) -> nn.Module:
        base = tf.StableLmPreTrainedModel
        original = base._init_weights

        def init(self: Any, module: nn.Module) -> None:
            if isinstance(module, nn.LayerNorm) and module.bias is None:
                module.weight.data.fill_(1.0)
                return
            original(self, module)

        base._init_weights = init
        try:
            return _build(tf.StableLmModel, tf.StableLmConfig(**config), attn)
        finally:
            base._init_weights = original

    return make


_BERT_PROJ = (
    "separate",
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
)
_VIT_PROJ = (
    "separate",
    "attention.attention.query",
    "attention.attention.key",
    "attention.attention.value",
    "attention.output.dense",
)
_SELF_ATTN = ("separate", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_T5_PROJ = (
    "separate",
    "layer.0.SelfAttention.q",
    "layer.0.SelfAttention.k",
    "layer.0.SelfAttention.v",
    "layer.0.SelfAttention.o",
)
_POST, _PRE = _features("post"), _features("pre")
_ROPE_GQA = _features("pre", rotary="full", causal=True, gqa=True)


def _llama_like(name: str, model: str, config: dict[str, Any]) -> Family:
    """A decoder laid out as Llama is (``layers[i].self_attn.{q,k,v,o}_proj``, rotary, GQA 4 → 2),
    built from transformers' ``<model>Model`` and ``<model>Config``."""
    return Family(
        name,
        _hf(f"{model}Model", f"{model}Config", config),
        "layers",
        (*_SELF_ATTN, "self_attn.o_proj"),
        "text",
        _ROPE_GQA,
        n_kv=N_KV,
        optimizer="gpt2",
    )


def _vit_like(name: str, model: str, config: dict[str, Any], **kwargs: Any) -> Family:
    """A pre-LN vision encoder laid out as ViT is (``encoder.layer[i].attention.attention.query``
    ...), built from transformers' ``<model>Model`` and ``<model>Config``."""
    return Family(
        name,
        _hf(f"{model}Model", f"{model}Config", config, **kwargs),
        "encoder.layer",
        _VIT_PROJ,
        "image",
        _PRE,
        optimizer="vit",
    )


_BART = {
    "vocab_size": VOCAB,
    "d_model": D_MODEL,
    "encoder_layers": N_LAYERS,
    "decoder_layers": 1,
    "encoder_attention_heads": N_HEADS,
    "decoder_attention_heads": N_HEADS,
    "encoder_ffn_dim": D_FF,
    "decoder_ffn_dim": D_FF,
    "max_position_embeddings": 64,
}


_T5 = {
    "vocab_size": VOCAB,
    "d_model": D_MODEL,
    "d_kv": 8,
    "d_ff": D_FF,
    "num_layers": N_LAYERS,
    "num_decoder_layers": N_LAYERS,
    "num_heads": N_HEADS,
    "relative_attention_num_buckets": 8,
    "decoder_start_token_id": 0,
}
_WHISPER = _BART | {
    "num_mel_bins": MELS,
    "max_source_positions": AUDIO_POSITIONS,
    "max_target_positions": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
    "begin_suppress_tokens": None,
    "suppress_tokens": None,
}
_MARIAN = _BART | {
    "encoder_layers": 1,
    "decoder_layers": N_LAYERS,
    "pad_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 0,
}


class TorchEncoder(nn.Module):
    """PyTorch's own ``nn.TransformerEncoder`` (no Hugging Face code) on a token embedding:
    ``nn.MultiheadAttention`` projects a (tokens, batch) view of the stream with one fused
    ``in_proj_weight``. Without ``batch_first`` the whole stream is (tokens, batch, features): the
    embedding is transposed into it and the output out of it. Every parameter is drawn anew (the
    encoder deep-copies one layer)."""

    def __init__(self, norm_first: bool, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(
            D_MODEL, N_HEADS, D_FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first
        )
        self.encoder = nn.TransformerEncoder(layer, N_LAYERS, enable_nested_tensor=False)
        torch.manual_seed(SEED)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.normal_(0.0, 0.3)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor]:
        padding = attention_mask == 0
        stream = self.embed(input_ids)
        if self.batch_first:
            return (self.encoder(stream, src_key_padding_mask=padding),)
        hidden = self.encoder(stream.transpose(0, 1), src_key_padding_mask=padding)
        return (hidden.transpose(0, 1),)


def _torch_encoder(norm_first: bool, batch_first: bool = True) -> Callable[[str], nn.Module]:
    return lambda _attn: TorchEncoder(norm_first, batch_first)


class PooledEncoder(nn.Module):
    """:class:`TorchEncoder` (post-LN, batch-first), then attention pooling: per input the weights
    ``softmax(x w + b)`` over its real tokens (``w`` a learned vector), the output their weighted
    sum of the encoder's states, one (d_model,) vector per input."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = TorchEncoder(norm_first=False)
        torch.manual_seed(SEED + 1)
        self.pool = nn.Linear(D_MODEL, 1)
        self.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor]:
        (hidden,) = self.encoder(input_ids, attention_mask)
        scores = self.pool(hidden).squeeze(-1).masked_fill(attention_mask == 0, -1e4)
        weights = torch.softmax(scores, dim=-1)
        return ((weights.unsqueeze(-1) * hidden).sum(dim=1),)


class TimmFeatures(nn.Module):
    """A timm vision model's ``forward_features`` on ``pixel_values`` (timm's models take ``x``);
    timm is imported only when such a family is built."""

    def __init__(self, name: str, **config: Any) -> None:
        super().__init__()
        import timm

        torch.manual_seed(SEED)
        self.model = timm.create_model(
            name, pretrained=False, num_classes=0, img_size=IMAGE, patch_size=PATCH, **config
        )
        self.eval()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.forward_features(pixel_values)


def _timm(name: str, **config: Any) -> Callable[[str], nn.Module]:
    return lambda _attn: TimmFeatures(name, **config)


class DetrEncoder(nn.Module):
    """DETR's encoder as ``DetrModel`` runs it on an image, without the decoder (its
    cross-attention is outside the theory): transformers' ResNet backbone (random, 2 stages), the
    1×1 input projection, and the encoder, whose every attention adds the sine position
    embedding of the (all-ones) pixel mask to the Q and K inputs, not to V's."""

    def __init__(self, attn: str) -> None:
        super().__init__()
        backbone = tf.ResNetConfig(
            num_channels=3,
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            out_features=["stage2"],
        )
        config = tf.DetrConfig(
            use_timm_backbone=False,
            use_pretrained_backbone=False,
            backbone=None,
            backbone_config=backbone,
            d_model=D_MODEL,
            encoder_layers=N_LAYERS,
            decoder_layers=1,
            encoder_attention_heads=N_HEADS,
            decoder_attention_heads=N_HEADS,
            encoder_ffn_dim=D_FF,
            decoder_ffn_dim=D_FF,
            num_queries=4,
        )
        whole = _build(tf.DetrModel, config, attn)
        self.backbone, self.input_projection = whole.backbone, whole.input_projection
        self.encoder = whole.encoder
        self.eval()

    def forward(self, pixel_values: torch.Tensor) -> Any:
        batch, _, height, width = pixel_values.shape
        mask = torch.ones((batch, height, width), dtype=torch.long)
        features, positions = self.backbone(pixel_values, mask)
        feature_map, small_mask = features[-1]
        tokens = self.input_projection(feature_map).flatten(2).permute(0, 2, 1)
        return self.encoder(
            inputs_embeds=tokens,
            attention_mask=small_mask.flatten(1),
            object_queries=positions[-1].flatten(2).permute(0, 2, 1),
        )


FAMILIES: tuple[Family, ...] = (
    Family(
        "bert",
        _hf("BertModel", "BertConfig", _text(), add_pooling_layer=False),
        "encoder.layer",
        _BERT_PROJ,
        "text",
        _POST,
    ),
    Family(
        "gpt2",
        _hf(
            "GPT2Model",
            "GPT2Config",
            {
                "vocab_size": VOCAB,
                "n_embd": D_MODEL,
                "n_layer": N_LAYERS,
                "n_head": N_HEADS,
                "n_inner": D_FF,
                "n_positions": 64,
            },
        ),
        "h",
        ("gpt2", "attn.c_attn", "attn.c_proj"),
        "text",
        _features("pre", causal=True),
        optimizer="gpt2",
    ),
    _llama_like("llama", "Llama", _decoder()),
    _vit_like("vit", "ViT", _vision(), add_pooling_layer=False),
    Family(
        "distilbert",
        _hf(
            "DistilBertModel",
            "DistilBertConfig",
            {
                "vocab_size": VOCAB,
                "dim": D_MODEL,
                "n_layers": N_LAYERS,
                "n_heads": N_HEADS,
                "hidden_dim": D_FF,
                "max_position_embeddings": 64,
            },
        ),
        "transformer.layer",
        ("separate", "attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"),
        "text",
        _POST,
    ),
    Family(
        "opt",
        _hf(
            "OPTModel",
            "OPTConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": D_MODEL,
                "num_hidden_layers": N_LAYERS,
                "ffn_dim": D_FF,
                "num_attention_heads": N_HEADS,
                "max_position_embeddings": 64,
                "word_embed_proj_dim": D_MODEL,
                "pad_token_id": 1,
            },
        ),
        "decoder.layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "text",
        _features("pre", causal=True),
        optimizer="gpt2",
    ),
    _llama_like("qwen2", "Qwen2", _decoder()),
    _llama_like("gemma", "Gemma", _decoder(head_dim=D_MODEL // N_HEADS)),
    Family(
        "phi3",
        _hf(
            "Phi3Model",
            "Phi3Config",
            _decoder(original_max_position_embeddings=64, sliding_window=None),
        ),
        "layers",
        ("concat", "self_attn.qkv_proj", "self_attn.o_proj"),
        "text",
        _ROPE_GQA,
        n_kv=N_KV,
        optimizer="gpt2",
    ),
    _vit_like("dinov2", "Dinov2", _vision(mlp_ratio=2, layerscale_value=0.5)),
    Family(
        "clip_vision",
        _hf("CLIPVisionModel", "CLIPVisionConfig", _vision()),
        "vision_model.encoder.layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "image",
        _PRE,
        optimizer="clip",
    ),
    Family(
        "t5_encoder",
        _hf(
            "T5EncoderModel",
            "T5Config",
            {
                "vocab_size": VOCAB,
                "d_model": D_MODEL,
                "d_kv": 8,
                "d_ff": D_FF,
                "num_layers": N_LAYERS,
                "num_heads": N_HEADS,
                "relative_attention_num_buckets": 8,
            },
        ),
        "encoder.block",
        _T5_PROJ,
        "text",
        _features("pre", score_bias="relative"),
        sdpa=False,
        optimizer="t5",
        optimum=False,
    ),
    Family(
        "bart_encoder",
        _encoder_of("BartModel", "BartConfig", _BART),
        "layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "text",
        _POST,
        optimizer="bart",
        optimum=False,
    ),
    Family(
        "whisper_encoder",
        _encoder_of(
            "WhisperModel",
            "WhisperConfig",
            _WHISPER,
        ),
        "layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "audio",
        _PRE,
        optimum=False,
    ),
    Family(
        "roberta",
        _hf(
            "RobertaModel",
            "RobertaConfig",
            _text(max_position_embeddings=66, pad_token_id=1),
            add_pooling_layer=False,
        ),
        "encoder.layer",
        _BERT_PROJ,
        "text",
        _POST,
    ),
    Family(
        "albert",
        _hf("AlbertModel", "AlbertConfig", _text(embedding_size=16), add_pooling_layer=False),
        "encoder.albert_layer_groups.0.albert_layers",
        ("separate", "attention.query", "attention.key", "attention.value", "attention.dense"),
        "text",
        _POST,
        repeat=N_LAYERS,
    ),
    Family(
        "electra",
        _hf("ElectraModel", "ElectraConfig", _text(embedding_size=D_MODEL)),
        "encoder.layer",
        _BERT_PROJ,
        "text",
        _POST,
        sdpa=False,  # transformers 4.57's ElectraModel has eager attention only
    ),
    Family(
        "mpnet",
        _hf(
            "MPNetModel",
            "MPNetConfig",
            # MPNet's compute_position_bias hard-codes 32 buckets: the table must have them.
            _text(max_position_embeddings=66, relative_attention_num_buckets=32),
            add_pooling_layer=False,
        ),
        "encoder.layer",
        (
            "separate",
            "attention.attn.q",
            "attention.attn.k",
            "attention.attn.v",
            "attention.attn.o",
        ),
        "text",
        _features("post", score_bias="relative"),
        sdpa=False,
    ),
    Family(
        "deberta_v2",
        _hf(
            "DebertaV2Model",
            "DebertaV2Config",
            _text(
                relative_attention=True,
                pos_att_type=["p2c", "c2p"],
                position_buckets=8,
                position_biased_input=False,
            ),
        ),
        "encoder.layer",
        (
            "separate",
            "attention.self.query_proj",
            "attention.self.key_proj",
            "attention.self.value_proj",
            "attention.output.dense",
        ),
        "text",
        _features("post", score_bias="disentangled"),
        sdpa=False,
    ),
    Family(
        "gpt_neo",
        _hf(
            "GPTNeoModel",
            "GPTNeoConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": D_MODEL,
                "num_layers": N_LAYERS,
                "num_heads": N_HEADS,
                "attention_types": [[["global", "local"], 1]],
                "window_size": 4,
                "intermediate_size": D_FF,
                "max_position_embeddings": 64,
            },
        ),
        "h",
        (
            "separate",
            "attn.attention.q_proj",
            "attn.attention.k_proj",
            "attn.attention.v_proj",
            "attn.attention.out_proj",
        ),
        "text",
        _features("pre", causal=True),
        sdpa=False,
        optimizer="gpt2",
    ),
    Family(
        "gptj",
        _hf(
            "GPTJModel",
            "GPTJConfig",
            {
                "vocab_size": VOCAB,
                "n_embd": D_MODEL,
                "n_layer": N_LAYERS,
                "n_head": N_HEADS,
                "rotary_dim": 4,
                "n_inner": D_FF,
                "n_positions": 64,
            },
        ),
        "h",
        ("separate", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj"),
        "text",
        _features("pre", rotary="partial", parallel=True, causal=True),
        sdpa=False,
        optimizer="gpt2",
    ),
    Family(
        "gpt_neox",
        _hf("GPTNeoXModel", "GPTNeoXConfig", _text(rotary_pct=0.5, use_parallel_residual=True)),
        "layers",
        ("headwise", "attention.query_key_value", "attention.dense"),
        "text",
        _features("pre", rotary="partial", parallel=True, causal=True),
        optimizer="gpt2",
    ),
    Family(
        "bloom",
        _hf(
            "BloomModel",
            "BloomConfig",
            {"vocab_size": VOCAB, "hidden_size": D_MODEL, "n_layer": N_LAYERS, "n_head": N_HEADS},
        ),
        "h",
        ("headwise", "self_attention.query_key_value", "self_attention.dense"),
        "text",
        _features("pre", causal=True, score_bias="alibi"),
        sdpa=False,
        optimizer="gpt2",
    ),
    Family(
        "falcon",
        _hf(
            "FalconModel",
            "FalconConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": D_MODEL,
                "num_hidden_layers": N_LAYERS,
                "num_attention_heads": N_HEADS,
                "multi_query": True,
                "parallel_attn": True,
                "new_decoder_architecture": False,
                "alibi": False,
                "bias": False,
            },
        ),
        "h",
        ("concat", "self_attention.query_key_value", "self_attention.dense"),
        "text",
        _features("pre", rotary="full", parallel=True, causal=True, gqa=True),
        n_kv=1,
        optimizer="gpt2",
    ),
    _llama_like("mistral", "Mistral", _decoder(sliding_window=None)),
    Family(
        "phi",
        _hf("PhiModel", "PhiConfig", _text(partial_rotary_factor=0.5)),
        "layers",
        (*_SELF_ATTN, "self_attn.dense"),
        "text",
        _features("pre", rotary="partial", parallel=True, causal=True),
        optimizer="gpt2",
    ),
    _vit_like("deit", "DeiT", _vision(), add_pooling_layer=False),
    Family(
        "beit",
        _hf(
            "BeitModel",
            "BeitConfig",
            _vision(use_relative_position_bias=True, layer_scale_init_value=0.5),
            add_pooling_layer=False,
        ),
        "encoder.layer",
        _VIT_PROJ,
        "image",
        _features("pre", score_bias="relative"),
        optimizer="vit",
    ),
    Family(
        "clip_text",
        _hf(
            "CLIPTextModel",
            "CLIPTextConfig",
            {
                "vocab_size": VOCAB,
                "hidden_size": D_MODEL,
                "intermediate_size": D_FF,
                "num_hidden_layers": N_LAYERS,
                "num_attention_heads": N_HEADS,
                "max_position_embeddings": 16,
                "eos_token_id": 2,
            },
        ),
        "text_model.encoder.layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "text",
        _features("pre", causal=True),
        optimizer="clip",
    ),
    Family(
        "siglip_vision",
        _hf("SiglipVisionModel", "SiglipVisionConfig", _vision(vision_use_head=False)),
        "vision_model.encoder.layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "image",
        _PRE,
        optimizer="clip",
    ),
    # Held out while the importer was written, added once it read them (docs/fixtures.md).
    # ModernBERT: fused [q | k | v], rotary, local (sliding-window) attention in every other layer,
    # and a first layer whose attention reads the stream unnormalised (its attention norm is an
    # Identity) while its MLP is pre-LN: not a post-LN block.
    Family(
        "modernbert",
        _hf(
            "ModernBertModel",
            "ModernBertConfig",
            _text(
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                cls_token_id=1,
                sep_token_id=2,
                local_attention=4,
                global_attn_every_n_layers=2,
            ),
        ),
        "layers",
        ("concat", "attn.Wqkv", "attn.Wo"),
        "text",
        _features("pre", rotary="full"),
    ),
    # RoFormer: interleaved rotary in a post-LN BERT encoder.
    Family(
        "roformer",
        _hf("RoFormerModel", "RoFormerConfig", _text()),
        "encoder.layer",
        _BERT_PROJ,
        "text",
        _features("post", rotary="full"),
        sdpa=False,
    ),
    # Qwen3: a per-head RMSNorm on Q and K before the rotary embedding (QK-norm).
    _llama_like("qwen3", "Qwen3", _decoder(head_dim=D_MODEL // N_HEADS)),
    # OLMo-2: RMSNorm over the whole Q and K projections, and norms on the branch outputs before
    # the residual sums instead of before the branches.
    Family(
        "olmo2",
        _hf("Olmo2Model", "Olmo2Config", _decoder()),
        "layers",
        (*_SELF_ATTN, "self_attn.o_proj"),
        "text",
        _features("post", rotary="full", causal=True, gqa=True),
        n_kv=N_KV,
        optimizer="gpt2",
    ),
    # Gemma-2: scores soft-capped by a Tanh, sliding-window attention in every other layer, and
    # norms both before and after each branch.
    _llama_like("gemma2", "Gemma2", _decoder(head_dim=D_MODEL // N_HEADS, sliding_window=4)),
    # Qwen2-MoE: a mixture-of-experts MLP (a router, the top 2 of 4 experts, a gated shared
    # expert) between the attention blocks. Only the legacy export is kept (size).
    Family(
        "qwen2_moe",
        _hf(
            "Qwen2MoeModel",
            "Qwen2MoeConfig",
            _decoder(
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=D_FF,
                tie_word_embeddings=True,
            ),
        ),
        "layers",
        (*_SELF_ATTN, "self_attn.o_proj"),
        "text",
        _ROPE_GQA,
        n_kv=N_KV,
        optimizer="gpt2",
        legacy_only=True,
    ),
    # YOLOS: a ViT that adds position embeddings to the stream between blocks, and 4 detection
    # tokens after the patches.
    _vit_like(
        "yolos",
        "Yolos",
        _vision(image_size=[IMAGE, IMAGE], num_detection_tokens=4),
        add_pooling_layer=False,
    ),
    # ESM: a pre-LN rotary encoder; onnxruntime's optimizer moves its head Transpose past the
    # rotate-half Concat.
    Family(
        "esm",
        _hf(
            "EsmModel",
            "EsmConfig",
            _text(pad_token_id=1, mask_token_id=2, position_embedding_type="rotary"),
            add_pooling_layer=False,
        ),
        "encoder.layer",
        _BERT_PROJ,
        "text",
        _features("pre", rotary="full"),
    ),
    # HuBERT: a convolutional front end on the raw waveform, then a post-LN encoder.
    Family(
        "hubert",
        _hf(
            "HubertModel",
            "HubertConfig",
            {
                "hidden_size": D_MODEL,
                "num_hidden_layers": N_LAYERS,
                "num_attention_heads": N_HEADS,
                "intermediate_size": D_FF,
                "conv_dim": (32, 32),
                "conv_stride": (5, 2),
                "conv_kernel": (10, 3),
                "num_conv_pos_embeddings": 16,
                "num_conv_pos_embedding_groups": 4,
            },
        ),
        "encoder.layers",
        (
            "separate",
            "attention.q_proj",
            "attention.k_proj",
            "attention.v_proj",
            "attention.out_proj",
        ),
        "waveform",
        _POST,
    ),
    # Granite: Llama with an attention multiplier (the score scale), a residual multiplier and an
    # embedding multiplier.
    _llama_like(
        "granite",
        "Granite",
        _decoder(attention_multiplier=0.2, residual_multiplier=0.5, embedding_multiplier=2.0),
    ),
    # PyTorch's own nn.TransformerEncoder, post- and pre-LN with batch_first, and post-LN with
    # its default time-major stream: not a Hugging Face model, so no optimum export.
    *(
        Family(
            name,
            _torch_encoder(norm == "pre", batch_first),
            "encoder.layers",
            ("mha", "self_attn"),
            "text",
            _features(norm),
            sdpa=False,
            optimum=False,
        )
        for name, norm, batch_first in (
            ("torch_encoder", "post", True),
            ("torch_encoder_prenorm", "pre", True),
            ("torch_encoder_time_major", "post", False),
        )
    ),
    # OLMo (v1): non-parametric LayerNorm, and Q, K and V clipped to ±clip_qkv (the values'
    # clip is a departure from the linear update).
    _llama_like("olmo", "Olmo", _decoder(clip_qkv=4.0)),
    # StableLM with qk_layernorm: one LayerNorm per head on Q and on K (the heads split apart,
    # normalised each by its own γ and joined again by a Concat), then partial rotary on a
    # quarter of each head. Kept for that route: the legacy and dynamo exports.
    Family(
        "stablelm",
        _stablelm(_decoder(qk_layernorm=True)),
        "layers",
        (*_SELF_ATTN, "self_attn.o_proj"),
        "text",
        _features("pre", rotary="partial", causal=True, gqa=True),
        n_kv=N_KV,
        optimizer=None,
        variants=frozenset({"dynamo_eager"}),
    ),
    # DETR's encoder: position embeddings added to the Q and K inputs only (V reads the stream),
    # post-LN. Not a transformers model of its own (no optimum export); legacy and dynamo kept.
    Family(
        "detr_encoder",
        DetrEncoder,
        "encoder.layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "image",
        _POST,
        sdpa=False,
        optimizer=None,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
    ),
    # timm's ConViT: gated positional self-attention (A is the gated mix of the content softmax
    # and a positional one, renormalised) in both blocks; ConViT concatenates its class token
    # after the last of them (``local_up_to_layer``), here after the stream the blocks carry.
    Family(
        "convit",
        _timm(
            "convit_tiny",
            embed_dim=D_MODEL // N_HEADS,  # ConViT's width is embed_dim per head
            depth=N_LAYERS,
            num_heads=N_HEADS,
            mlp_ratio=D_FF / D_MODEL,
            local_up_to_layer=N_LAYERS,
        ),
        "model.blocks",
        ("timm", "attn"),
        "image",
        _PRE,
        sdpa=False,
        optimizer=None,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
    ),
    # Keras 3 (torch backend): a post-LN encoder of keras.layers.MultiHeadAttention, whose
    # projections are EinsumDense (Einsum + bias Add), exported by Keras' own model.export.
    Family(
        "keras_mha",
        lambda _attn: nn.Identity(),
        "",
        ("keras",),
        "text",
        _POST,
        sdpa=False,
        optimizer=None,
        optimum=False,
        build=lambda corpus, family: build_keras(corpus, family),
    ),
    # SqueezeBERT: the stream (batch, features, tokens) between the blocks, every projection a
    # pointwise grouped Conv1d (4 groups for Q, K and V), post-LN norms over the features
    # (permuted to the last axis and back).
    Family(
        "squeezebert",
        _hf("SqueezeBertModel", "SqueezeBertConfig", _text(embedding_size=D_MODEL)),
        "encoder.layers",
        (
            "conv",
            "attention.query",
            "attention.key",
            "attention.value",
            "post_attention.conv1d",
        ),
        "text",
        _POST,
        sdpa=False,
        optimizer=None,
        variants=frozenset({"dynamo_eager"}),
        channels_first=True,
        hooked=("attention", "output"),
    ),
    # timm's EVA-02: rotary embeddings on the patch tokens only (the class token's Q and K are
    # sliced off, the rotated patches concatenated back after it), SwiGLU MLP.
    Family(
        "eva",
        _timm(
            "eva02_tiny_patch14_224",
            embed_dim=D_MODEL,
            depth=N_LAYERS,
            num_heads=N_HEADS,
            mlp_ratio=D_FF / D_MODEL,
            ref_feat_shape=(IMAGE // PATCH, IMAGE // PATCH),
        ),
        "model.blocks",
        ("timm", "attn"),
        "image",
        _features("pre", rotary="full"),
        sdpa=False,
        optimizer=None,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
    ),
    # wav2vec2-conformer with rotary positions: the rotary embedding is applied to the block's
    # normalised stream before the Q and K projections (V projects it unrotated); each layer is
    # a macaron block (half FFN, attention, convolution module, half FFN, final LayerNorm): its
    # layers are the whole layers' input and outputs, as every other family's (the layer hooks).
    Family(
        "w2v2_conformer",
        _hf(
            "Wav2Vec2ConformerModel",
            "Wav2Vec2ConformerConfig",
            {
                "hidden_size": D_MODEL,
                "num_hidden_layers": N_LAYERS,
                "num_attention_heads": N_HEADS,
                "intermediate_size": D_FF,
                "conv_dim": (32, 32),
                "conv_stride": (5, 2),
                "conv_kernel": (10, 3),
                "num_conv_pos_embeddings": 16,
                "num_conv_pos_embedding_groups": 4,
                "position_embeddings_type": "rotary",
                "conv_depthwise_kernel_size": 3,
            },
        ),
        "encoder.layers",
        (
            "separate",
            "self_attn.linear_q",
            "self_attn.linear_k",
            "self_attn.linear_v",
            "self_attn.linear_out",
        ),
        "waveform",
        _features("pre", rotary="full"),
        sdpa=False,
        optimizer=None,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
    ),
    # XGLM: scores as batched (B·H, T, T) products, viewed as (B, H, T, T) for the mask and a
    # floor at finfo.min, then back for the Softmax; sinusoidal positions.
    Family(
        "xglm",
        _hf(
            "XGLMModel",
            "XGLMConfig",
            {
                "vocab_size": VOCAB,
                "d_model": D_MODEL,
                "num_layers": N_LAYERS,
                "attention_heads": N_HEADS,
                "ffn_dim": D_FF,
                "max_position_embeddings": 64,
            },
        ),
        "layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "text",
        _features("pre", causal=True),
        sdpa=False,
        optimizer="gpt2",
    ),
    # Decoder stacks with cross-attention, taking the encoder's output as the graph input
    # ``encoder_hidden_states``: each layer's causal self-attention is read, its cross-attention
    # skipped by design (outside the theory). T5's is pre-LN without biases, with the relative
    # position bias on the self-attention; Marian's post-LN with sinusoidal positions.
    Family(
        "t5_decoder",
        _decoder_of("T5Model", "T5Config", _T5),
        "block",
        _T5_PROJ,
        "text",
        _features("pre", causal=True, score_bias="relative") | {"cross_attention": True},
        sdpa=False,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
        encoder_states=True,
    ),
    Family(  # Whisper's decoder: pre-LN, learned positions, no encoder mask among its inputs
        "whisper_decoder",
        _decoder_of("WhisperModel", "WhisperConfig", _WHISPER | {"decoder_layers": N_LAYERS}),
        "layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "text",
        _features("pre", causal=True) | {"cross_attention": True},
        sdpa=False,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
        encoder_states=True,
        encoder_mask=False,
    ),
    Family(
        "marian_decoder",
        _decoder_of("MarianModel", "MarianConfig", _MARIAN),
        "layers",
        (*_SELF_ATTN, "self_attn.out_proj"),
        "text",
        _features("post", causal=True) | {"cross_attention": True},
        sdpa=False,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
        encoder_states=True,
    ),
    # PyTorch's post-LN encoder followed by attention pooling: weights softmax(x w + b) over the
    # tokens, the pooled vector their weighted sum. That Softmax's scores are a product with a
    # constant (no attention): counted neither as a block nor as a declined one.
    Family(
        "torch_encoder_pooled",
        lambda _attn: PooledEncoder(),
        "encoder.encoder.layers",
        ("mha", "self_attn"),
        "text",
        _features("post"),
        sdpa=False,
        optimum=False,
        variants=frozenset({"dynamo_eager"}),
        pooled=True,
    ),
)


# --------------------------------------------------------------------------------------------------
# Truth: weights and hidden states from torch.


def _module(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path)


def _row_weight(module: nn.Module) -> np.ndarray:
    """``W`` with ``y = x @ W``: nn.Linear stores (out, in); GPT-2's Conv1D stores (in, out)."""
    weight = module.weight.detach().double().numpy()
    return weight if type(module).__name__ == "Conv1D" else weight.T


def _conv_weight(module: nn.Module) -> np.ndarray:
    """``W`` (in, out) of a pointwise ``nn.Conv1d``: the block-diagonal matrix of its groups."""
    kernels = module.weight.detach().double().numpy()[:, :, 0]
    groups = module.groups
    per_in, per_out = kernels.shape[1], kernels.shape[0] // groups
    dense = np.zeros((per_in * groups, kernels.shape[0]))
    for g in range(groups):
        dense[g * per_in : (g + 1) * per_in, g * per_out : (g + 1) * per_out] = kernels[
            g * per_out : (g + 1) * per_out
        ].T
    return dense


def _split_fused(
    kind: str, fused: np.ndarray, n_heads: int, n_kv: int, d_model: int
) -> list[np.ndarray]:
    """Canonical (head-major) W_Q, W_K, W_V from a fused (d_model, ·) weight."""
    d_head = d_model // n_heads
    if kind == "headwise":
        per_head = fused.reshape(fused.shape[0], n_heads, 3, d_head)
        return [per_head[:, :, i].reshape(fused.shape[0], -1) for i in range(3)]
    q_width, kv_width = n_heads * d_head, n_kv * d_head
    bounds = [0, q_width, q_width + kv_width, q_width + 2 * kv_width]
    return [fused[:, bounds[i] : bounds[i + 1]] for i in range(3)]


def block_weights(family: Family, block: nn.Module) -> Weights:
    """``(W_Q, W_K, W_V, W_O)`` of one block in the project's convention."""
    kind, *paths = family.proj
    skip = ("mha", "timm", "conv")
    mats = [] if kind in skip else [_row_weight(_module(block, path)) for path in paths]
    if kind == "mha":  # nn.MultiheadAttention: in_proj_weight is [W_q; W_k; W_v], each (out, in)
        attention = _module(block, paths[0])
        fused = attention.in_proj_weight.detach().double().numpy()
        q, k, v = (w.T for w in fused.reshape(3, D_MODEL, D_MODEL))
        return q, k, v, _row_weight(attention.out_proj)
    if kind == "separate":
        return mats[0], mats[1], mats[2], mats[3]
    if kind == "conv":  # Conv1d(kernel_size=1, groups=g) weights (out, in / g, 1)
        return tuple(_conv_weight(_module(block, path)) for path in paths)  # type: ignore[return-value]
    if kind == "timm":  # timm: fused [q | k | v] (qkv), or [q | k] (qk) and v (ConViT's GPSA)
        attention = _module(block, paths[0])
        if hasattr(attention, "q_proj") and attention.q_proj is not None:  # EVA unfused
            names = ("q_proj", "k_proj", "v_proj", "proj")
            return tuple(_row_weight(getattr(attention, name)) for name in names)  # type: ignore[return-value]
        if hasattr(attention, "qk"):
            qk = _row_weight(attention.qk)
            v = _row_weight(attention.v)
            return qk[:, : family.d_model], qk[:, family.d_model :], v, _row_weight(attention.proj)
        q, k, v = _split_fused(
            "concat", _row_weight(attention.qkv), N_HEADS, N_HEADS, family.d_model
        )
        return q, k, v, _row_weight(attention.proj)
    q, k, v = _split_fused(kind, mats[0], N_HEADS, family.n_kv, family.d_model)
    return q, k, v, mats[1]


def _first(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else value[0]


@contextlib.contextmanager
def _boundaries(
    starts: list[nn.Module], ends: list[nn.Module]
) -> Iterator[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Record the input hidden states of each call of ``starts`` and the output of each call of
    ``ends`` (in call order): each block's, or of the submodules that begin and end it."""
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def before(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        inputs.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    def after(_module: nn.Module, _args: tuple, output: Any) -> None:
        outputs.append(_first(output).detach().clone())

    handles = [b.register_forward_pre_hook(before, with_kwargs=True) for b in starts]
    handles += [b.register_forward_hook(after) for b in ends]
    try:
        yield inputs, outputs
    finally:
        for handle in handles:
            handle.remove()


def truth(family: Family, model: nn.Module, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights per attention layer, head sizes, hidden states and feeds of one model."""
    model.eval()
    blocks = _module(model, family.blocks)
    first, last = family.hooked
    starts = [_module(b, first) if first else b for b in blocks]
    ends = [_module(b, last) if last else b for b in blocks]
    with torch.no_grad(), _boundaries(starts, ends) as (inputs, outputs):
        _call(model, family, feeds)
    weights = [block_weights(family, b) for b in blocks for _ in range(family.repeat)]
    hidden = [inputs[0], *outputs]
    if family.channels_first:
        hidden = [h.transpose(1, 2) for h in hidden]
    out = {
        key: np.stack([w[i] for w in weights]).astype(np.float32)
        for i, key in enumerate(("W_Q", "W_K", "W_V", "W_O"))
    }
    out |= {
        "n_heads": np.array(N_HEADS),
        "n_kv_heads": np.array(family.n_kv),
        "d_head": np.array(family.d_model // N_HEADS),
        "hidden": np.stack([h.numpy() for h in hidden]).astype(np.float32),
    }
    return out | {f"feed_{name}": value for name, value in (_extra_feeds(family) | feeds).items()}


def _extra_feeds(family: Family) -> dict[str, np.ndarray]:
    """Inputs some exports add (optimum's ``position_ids``, ``token_type_ids``, and the key/value
    caches of a ``with_past`` export, empty) with the values the model uses when they are not
    given; the tests feed only the graph's own inputs."""
    if family.inputs != "text":
        return {}
    positions = np.broadcast_to(np.arange(TOKENS, dtype=np.int64), (BATCH, TOKENS)).copy()
    extra = {"position_ids": positions, "token_type_ids": np.zeros((BATCH, TOKENS), np.int64)}
    if family.name in WITH_PAST_FAMILIES:
        extra |= empty_caches(family)
    return extra


def empty_caches(family: Family) -> dict[str, np.ndarray]:
    """The key/value cache feeds of optimum's and the genai builder's exports at past length 0:
    ``past_key_values.<layer>.key/value`` of shape (batch, kv heads, 0, d_head)."""
    empty = np.zeros((BATCH, family.n_kv, 0, family.d_model // N_HEADS), np.float32)
    return {
        f"past_key_values.{layer}.{kind}": empty
        for layer in range(N_LAYERS)
        for kind in ("key", "value")
    }


# --------------------------------------------------------------------------------------------------
# Inputs and export.


def sample_feeds(family: Family) -> dict[str, np.ndarray]:
    """The fixed seeded input of a family."""
    rng = np.random.default_rng(SEED)
    if family.inputs == "image":
        return {"pixel_values": rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32)}
    if family.inputs == "audio":
        frames = 2 * AUDIO_POSITIONS
        return {"input_features": rng.standard_normal((BATCH, MELS, frames)).astype(np.float32)}
    if family.inputs == "waveform":
        return {"input_values": rng.standard_normal((BATCH, WAVE)).astype(np.float32)}
    ids = rng.integers(3, VOCAB, size=(BATCH, TOKENS), dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones((BATCH, TOKENS), dtype=np.int64)}
    if family.encoder_states:
        states = rng.standard_normal((BATCH, ENCODER_TOKENS, family.d_model)).astype(np.float32)
        feeds["encoder_hidden_states"] = states
        if family.encoder_mask:
            feeds["encoder_attention_mask"] = np.ones((BATCH, ENCODER_TOKENS), dtype=np.int64)
    return feeds


def _call(model: nn.Module, family: Family, feeds: dict[str, np.ndarray]) -> Any:
    kwargs: dict[str, Any] = {name: torch.from_numpy(value) for name, value in feeds.items()}
    if family.features["causal"] and family.name != "clip_text":
        kwargs["use_cache"] = False
    return model(**kwargs)


class Wrapper(nn.Module):
    """``(feeds in the manifest's order) -> last_hidden_state`` for the exporters."""

    def __init__(self, model: nn.Module, family: Family, names: list[str]) -> None:
        super().__init__()
        self.model, self.family, self.names = model, family, names
        # The legacy exporter restores the wrapper's training flag after exporting, recursively:
        # a wrapper left in training mode would switch the model's dropout on for what follows.
        self.eval()

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.names, args, strict=True))
        out = self.model(**kwargs, **self._extra())
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def _extra(self) -> dict[str, Any]:
        if self.family.features["causal"] and self.family.name != "clip_text":
            return {"use_cache": False}
        return {}


def _dynamic_axes(family: Family, names: list[str]) -> dict[str, dict[int, str]]:
    axes = {0: "batch"} if family.inputs != "text" else {0: "batch", 1: "sequence"}
    encoder = {0: "batch", 1: "encoder_sequence"}
    output = {0: "batch"} if family.pooled else {0: "batch", 1: "sequence"}
    return {name: encoder if name.startswith("encoder_") else axes for name in names} | {
        "last_hidden_state": output
    }


def export_legacy(
    model: nn.Module,
    family: Family,
    feeds: dict[str, np.ndarray],
    path: Path,
    opset: int = LEGACY_OPSET,
) -> None:
    """TorchScript exporter, opset 17 (or ``opset``), dynamic batch (and sequence) axes."""
    names = list(feeds)
    args = tuple(torch.from_numpy(feeds[name]) for name in names)
    torch.onnx.export(
        Wrapper(model, family, names),
        args,
        str(path),
        dynamo=False,
        opset_version=opset,
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes=_dynamic_axes(family, names),
        do_constant_folding=True,
    )


def _dynamo_shapes(family: Family, names: list[str]) -> tuple[dict[int, Any], ...]:
    batch = torch.export.Dim("batch", min=1, max=64)
    if family.inputs != "text":
        return tuple({0: batch} for _ in names)
    sequence = torch.export.Dim("sequence", min=2, max=16)
    encoder = torch.export.Dim("encoder_sequence", min=2, max=16)
    return tuple(
        {0: batch, 1: encoder if name.startswith("encoder_") else sequence} for name in names
    )


def export_dynamo(
    model: nn.Module, family: Family, feeds: dict[str, np.ndarray], path: Path
) -> bool:
    """torch.export-based exporter, opset 18; returns whether the axes stayed dynamic."""
    names = list(feeds)
    args = tuple(torch.from_numpy(feeds[name]) for name in names)
    wrapper = Wrapper(model, family, names)
    for shapes in (_dynamo_shapes(family, names), None):
        try:
            program = torch.onnx.export(
                wrapper,
                args,
                dynamo=True,
                opset_version=DYNAMO_OPSET,
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_shapes=({"args": shapes} if shapes is not None else None),
                external_data=False,
                verbose=False,
            )
        except Exception as err:
            if shapes is None:
                raise
            _log(f"  dynamo dynamic export failed ({_first_line(err)}); trying static")
            continue
        program.save(str(path), external_data=False)
        _strip_debug_metadata(path)
        return shapes is not None
    return False


def export_optimum(model: nn.Module, path: Path) -> None:
    """optimum's ``main_export`` (TorchScript exporter with its model patches), opset 17, task
    ``feature-extraction``, from the model saved to a temporary folder (nothing downloaded)."""
    import shutil
    import tempfile

    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(f"{tmp}/model")
        main_export(
            f"{tmp}/model",
            output=f"{tmp}/onnx",
            task="feature-extraction",
            opset=LEGACY_OPSET,
            do_validation=False,
            no_post_process=True,
            library_name="transformers",
        )
        shutil.copyfile(f"{tmp}/onnx/model.onnx", path)


def export_with_past(model: nn.Module, path: Path) -> None:
    """optimum's ``main_export`` with task ``text-generation-with-past``, opset 17: the decoder as
    shipped for generation (``past_key_values.*`` inputs concatenated with the new keys and
    values, ``present.*`` outputs, logits), not merged (``no_post_process``: one graph, no ``If``).

    The task loads the model's ``*ForCausalLM`` from the saved base model, its LM head tied to
    the token embedding (:func:`_save_tied`; the logits are not part of the truth).
    """
    import shutil
    import tempfile

    from optimum.exporters.onnx import main_export

    with tempfile.TemporaryDirectory() as tmp:
        main_export(
            _save_tied(model, Path(tmp)),
            output=f"{tmp}/onnx",
            task=WITH_PAST_TASK,
            opset=LEGACY_OPSET,
            do_validation=False,
            no_post_process=True,
            library_name="transformers",
        )
        shutil.copyfile(f"{tmp}/onnx/model.onnx", path)


def export_merged(model: nn.Module, path: Path) -> None:
    """optimum's older ``decoder_model_merged.onnx``: the decoder without a cache input (but with
    ``present.*`` outputs: optimum's ONNX config with ``use_past_in_inputs=False``) and the
    ``with_past`` decoder, exported as :func:`export_with_past` does, joined by
    ``optimum.onnx.merge_decoders`` (shared weights, an ``If`` on ``use_cache_branch``)."""
    import tempfile

    from optimum.exporters.onnx import main_export
    from optimum.exporters.tasks import TasksManager
    from optimum.onnx import merge_decoders

    with tempfile.TemporaryDirectory() as tmp:
        saved = _save_tied(model, Path(tmp))
        config = tf.AutoConfig.from_pretrained(saved)
        constructor = TasksManager.get_exporter_config_constructor(
            "onnx", task=WITH_PAST_TASK, model_type=config.model_type, library_name="transformers"
        )
        no_cache = constructor(
            config, task="text-generation", use_past=True, use_past_in_inputs=False
        )
        for folder, custom in (("no_cache", {"model": no_cache}), ("with_cache", None)):
            main_export(
                saved,
                output=f"{tmp}/{folder}",
                task=WITH_PAST_TASK,
                opset=LEGACY_OPSET,
                do_validation=False,
                no_post_process=True,
                library_name="transformers",
                custom_onnx_configs=custom,
            )
        merge_decoders(
            f"{tmp}/no_cache/model.onnx", f"{tmp}/with_cache/model.onnx", save_path=str(path)
        )


def genai_model(family: Family) -> tuple[Family, nn.Module]:
    """The family at d_model :data:`GENAI_D_MODEL` (4 heads of 16, 2 key/value heads) and its
    seeded ``*ForCausalLM``, the LM head tied to the token embedding (the builder leaves it out)."""
    prefix, extra = GENAI_FAMILIES[family.name]
    config = _decoder(hidden_size=GENAI_D_MODEL, tie_word_embeddings=True) | extra
    model = _build(
        getattr(tf, f"{prefix}ForCausalLM"), getattr(tf, f"{prefix}Config")(**config), "eager"
    )
    return dataclasses.replace(family, d_model=GENAI_D_MODEL), model


def export_genai(model: nn.Module, precision: str, path: Path) -> None:
    """onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder``, CPU,
    ``-p fp32`` or ``-p int4``, ``exclude_lm_head``: the graph ends at the final norm) on the model
    saved to a temporary folder with a word-level tokenizer of its vocabulary (the builder copies
    the tokenizer; nothing is downloaded); written as one file, the weights inline."""
    import subprocess
    import tempfile

    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(f"{tmp}/model")
        vocab = {f"t{i}": i for i in range(VOCAB)}
        tokenizer = Tokenizer(WordLevel(vocab, unk_token="t0"))
        tf.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(f"{tmp}/model")
        command = [
            *(sys.executable, "-m", "onnxruntime_genai.models.builder"),
            *("-i", f"{tmp}/model", "-o", f"{tmp}/onnx", "-c", f"{tmp}/cache"),
            *("-p", precision, "-e", "cpu", "--extra_options", "exclude_lm_head=true"),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"model builder: {done.stderr.strip().splitlines()[-1]}")
        onnx.save(onnx.load(f"{tmp}/onnx/model.onnx"), str(path))


def dequantised_by_columns(
    model: nn.Module, float_path: Path, values: dict[str, np.ndarray]
) -> nn.Module:
    """A copy of ``model`` whose linear weights hold what the quantised export multiplies by.

    ``values`` maps a float initializer of ``float_path`` (the builder's ``fp32`` file) to its
    dequantised (K, N) value. Each column of a torch weight in the row-vector convention (one
    output unit) is found among the columns of those initializers: the builder packs Q, K and V
    into one ``MatMul`` and splits Phi-3's fused gate/up projection into two.
    """
    import copy

    dequantised: dict[bytes, np.ndarray] = {}
    for tensor in onnx.load(str(float_path)).graph.initializer:
        stored = numpy_helper.to_array(tensor)
        if tensor.name in values and stored.ndim == 2:
            for column in range(stored.shape[1]):
                key = np.ascontiguousarray(stored[:, column]).tobytes()
                dequantised[key] = values[tensor.name][:, column]
    replaced = copy.deepcopy(model)
    for param in replaced.parameters():
        if param.ndim != 2:
            continue
        rows = param.detach().numpy()  # (out, in): row j is column j of the row-vector weight
        found = [dequantised.get(np.ascontiguousarray(row).tobytes()) for row in rows]
        if all(column is None for column in found):
            continue
        if any(column is None for column in found):
            raise RuntimeError(f"a weight of shape {tuple(rows.shape)} is only partly quantised")
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.stack(found).astype(np.float32)))
    return replaced


def _save_tied(model: nn.Module, folder: Path) -> str:
    """Save ``model`` under ``folder/model`` with its LM head tied to the token embedding (the
    generation tasks load ``*ForCausalLM``: nothing is drawn at random, no second vocabulary
    matrix is stored); returns the folder."""
    model.save_pretrained(folder / "model")
    config_path = folder / "model" / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config_path.write_text(json.dumps(config | {"tie_word_embeddings": True}), encoding="utf-8")
    return str(folder / "model")


def _strip_debug_metadata(path: Path) -> None:
    """Drop the dynamo exporter's per-node debug metadata (FX node text, module stack): it has no
    meaning for the graph, triples the file size and spells out local source paths."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(model, str(path))


def optimize(family: Family, source: Path, path: Path) -> None:
    """onnxruntime's transformer optimizer on the legacy export."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(source),
        model_type=family.optimizer or "bert",
        num_heads=N_HEADS,
        hidden_size=D_MODEL,
        opt_level=1,
        use_gpu=False,
    )
    optimized.save_model_to_file(str(path))


def quantize(source: Path, path: Path) -> None:
    """onnxruntime dynamic int8 quantisation of the legacy export."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8)


class _Calibration:
    """onnxruntime's calibration reader over the sample feeds: each item alone, then the batch."""

    def __init__(self, feeds: dict[str, np.ndarray], wanted: set[str]) -> None:
        feeds = {name: value for name, value in feeds.items() if name in wanted}
        if "position_ids" in wanted - set(feeds):  # optimum's decoders take them as an input
            feeds["position_ids"] = np.tile(np.arange(TOKENS, dtype=np.int64), (BATCH, 1))
        items = [{name: value[i : i + 1] for name, value in feeds.items()} for i in range(BATCH)]
        self.items = [*items, feeds]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return self.items.pop(0) if self.items else None


def quantize_static_form(
    source: Path, path: Path, feeds: dict[str, np.ndarray], form: str, products_only: bool
) -> None:
    """onnxruntime static int8 quantisation of the legacy export, ``form`` ``"qdq"`` or
    ``"qoperator"``, with the quantiser's defaults otherwise (int8 weights per tensor, int8
    activations; MinMax calibration on :class:`_Calibration`), after its own pre-processing
    (``quant_pre_process``, without symbolic shape inference, which these graphs defeat);
    ``products_only``: only ``MatMul`` and ``Gemm`` nodes (see :data:`STATIC_PRODUCTS_ONLY`)."""
    from onnxruntime.quantization import QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = path.with_name(path.stem + "_prepared.onnx")
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
    wanted = {value.name for value in onnx.load(str(prepared)).graph.input}
    quant_format = QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator
    try:
        quantize_static(
            str(prepared),
            str(path),
            _Calibration(feeds, wanted),
            quant_format=quant_format,
            op_types_to_quantize=["MatMul", "Gemm"] if products_only else None,
        )
    finally:
        prepared.unlink(missing_ok=True)
    import onnxruntime  # a file onnxruntime refuses is an export failure, not a fixture

    try:
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:
        path.unlink()
        raise


def quantize_nbits(source: Path, path: Path) -> None:
    """onnxruntime's 4-bit block quantisation (``MatMulNBits``, blocks of 16, with zero points)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)), block_size=NBITS_BLOCK, is_symmetric=False, bits=4
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(path))


def to_float16(source: Path, path: Path) -> None:
    """onnxruntime's float16 conversion (``keep_io_types``: the graph still takes float32 inputs)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=True), str(path))


def float16_weights(fp16_path: Path) -> dict[str, np.ndarray]:
    """``{initializer: its float16 value}`` for the initializers the conversion made float16."""
    return {
        t.name: numpy_helper.to_array(t).astype(np.float32)
        for t in onnx.load(str(fp16_path)).graph.initializer
        if t.data_type == onnx.TensorProto.FLOAT16
    }


def int8_weights(int8_path: Path) -> dict[str, np.ndarray]:
    """``{float initializer: its dequantised value}`` for the weights ``quantize_dynamic`` quantised."""
    ints = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(int8_path)).graph.initializer}
    values = {}
    for name, q in ints.items():
        if not name.endswith("_quantized"):
            continue
        base = name.removesuffix("_quantized")
        zero = ints.get(f"{base}_zero_point", np.zeros(()))
        dq = (q.astype(np.float64) - zero.astype(np.float64)) * ints[f"{base}_scale"]
        if base.endswith("_Transposed"):  # a Gemm(transB=1) weight quantize_dynamic transposed
            values[base.removesuffix("_Transposed")] = dq.T.astype(np.float32)
        else:
            values[base] = dq.astype(np.float32)
    return values


def static_weights(quantised_path: Path) -> dict[str, np.ndarray]:
    """``{float initializer: its dequantised value}`` for the weights ``quantize_static`` stored
    quantised (``<name>_quantized``): dequantised with the scale and zero point its reader gives
    it — a ``DequantizeLinear``'s (QDQ; per tensor or per axis), or the two inputs after it in a
    ``QLinear*`` node (QOperator; per tensor). A bias stored as int32 without its own scale (a
    ``QLinearConv``'s) is left out: only matrices enter the truth."""
    model = onnx.load(str(quantised_path))
    ints = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if not name.endswith("_quantized") or name not in ints:
                continue
            parameters = list(node.input[position + 1 : position + 3])
            if len(parameters) < 1 or parameters[0] not in ints:
                continue
            codes, scale = ints[name], ints[parameters[0]]
            zero = ints.get(parameters[1], np.zeros(())) if len(parameters) > 1 else np.zeros(())
            if scale.ndim == 1 and scale.size > 1:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                assert node.op_type == "DequantizeLinear", f"per-axis {node.op_type} {name}"
                shape = [1] * codes.ndim
                shape[axis] = scale.size
                scale, zero = scale.reshape(shape), zero.reshape(shape)
            dq = (codes.astype(np.float64) - zero.astype(np.float64)) * scale
            values[name.removesuffix("_quantized")] = dq.astype(np.float32)
    return values


def nbits_weights(nbits_path: Path) -> dict[str, np.ndarray]:
    """``{float initializer: the (K, N) weight onnxruntime multiplies by}`` per ``MatMulNBits``.

    Read from the runtime itself: the node alone, run on ``A = I_K``, returns its weight.
    """
    import onnxruntime

    model = onnx.load(str(nbits_path))
    inits = {t.name: t for t in model.graph.initializer}
    values = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        K, N = int(attrs["K"]), int(attrs["N"])
        single = onnx.helper.make_graph(
            [node],
            "one",
            [onnx.helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, [K, K])],
            [onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, [K, N])],
            [inits[name] for name in node.input[1:] if name],
        )
        proto = onnx.helper.make_model(single, ir_version=10, opset_imports=model.opset_import)
        session = onnxruntime.InferenceSession(
            proto.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        (weight,) = session.run(None, {node.input[0]: np.eye(K, dtype=np.float32)})
        values[node.input[1].rsplit("_Q", 1)[0]] = weight
    return values


def dequantised_model(
    model: nn.Module, float_path: Path, values: dict[str, np.ndarray]
) -> nn.Module:
    """A copy of ``model`` whose weights the quantised export stores quantised hold their
    dequantised ``values`` (keyed by the float export's initializer name).

    Each torch weight is matched to a float initializer equal to it or to its transpose, or to a
    block of columns of one (the optimizer's packed QKV weight holds Q, K and V side by side).
    """
    import copy

    floats = {
        t.name: numpy_helper.to_array(t) for t in onnx.load(str(float_path)).graph.initializer
    }
    replaced = copy.deepcopy(model)
    for param in replaced.parameters():
        if param.ndim != 2:
            continue
        value = param.detach().numpy()
        for name, stored in floats.items():
            if name not in values:
                continue
            dq = _dequantised_part(stored, value, values[name].astype(np.float32))
            if dq is None:
                continue
            with torch.no_grad():
                param.copy_(torch.from_numpy(dq))
            break
    return replaced


def _dequantised_part(
    stored: np.ndarray, value: np.ndarray, dequantised: np.ndarray
) -> np.ndarray | None:
    """The part of ``dequantised`` (the float initializer ``stored``, dequantised) that stands
    for the torch weight ``value``: all of it (as is or transposed), or the block of columns of
    a packed weight that equals ``value``'s transpose; None where ``value`` is not in ``stored``."""
    if stored.shape == value.shape and np.array_equal(stored, value):
        return dequantised
    if stored.shape == value.T.shape and np.array_equal(stored, value.T):
        return dequantised.T.copy()
    rows, width = value.T.shape
    if stored.ndim != 2 or stored.shape[0] != rows or stored.shape[1] <= width:
        return None
    for start in range(0, stored.shape[1] - width + 1, width):
        if np.array_equal(stored[:, start : start + width], value.T):
            return dequantised[:, start : start + width].T.copy()
    return None


# --------------------------------------------------------------------------------------------------
# Driver.


@dataclass
class Corpus:
    """The fixtures written so far and the attempts that failed."""

    out: Path
    entries: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def add(
        self, family: Family, variant: str, exporter: str, opset: int, path: Path, **extra: Any
    ) -> None:
        """Record one fixture."""
        self.entries.append(
            {
                "id": f"{family.name}-{variant}",
                "family": family.name,
                "exporter": exporter,
                "opset": opset,
                "variant": variant,
                "file": path.relative_to(self.out).as_posix(),
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "truth": extra.pop("truth"),
                "features": family.features,
                "inputs": family.inputs,
            }
            | extra
        )

    def fail(self, family: Family, variant: str, err: BaseException) -> None:
        """Record an export that did not work (the corpus folder in its message written as
        ``<out>``: the manifest names no path of the machine that made it)."""
        line = _first_line(err)
        for folder in {str(self.out.resolve()), str(self.out)}:
            line = line.replace(folder, "<out>")
        _log(f"  {variant}: FAILED {line}")
        self.skipped.append({"id": f"{family.name}-{variant}", "error": line})


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0][:300]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # noqa: T201


def _save_truth(path: Path, arrays: dict[str, np.ndarray]) -> str:
    np.savez_compressed(path, **arrays)
    return path.name


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' warnings and chatter."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        yield


def _attempt(corpus: Corpus, family: Family, variant: str, work: Callable[[], None]) -> bool:
    try:
        with _quiet():
            work()
    except Exception as err:
        corpus.fail(family, variant, err)
        return False
    return True


def build_family(corpus: Corpus, family: Family) -> None:
    """Export every variant of one family and write its truth."""
    _log(f"{family.name}")
    folder = corpus.out / family.name
    folder.mkdir(parents=True, exist_ok=True)
    feeds = sample_feeds(family)
    model = family.make("eager")
    truth_file = f"{family.name}/{_save_truth(folder / 'truth.npz', truth(family, model, feeds))}"
    legacy = folder / "legacy_eager.onnx"
    if _attempt(
        corpus, family, "legacy_eager", lambda: export_legacy(model, family, feeds, legacy)
    ):
        corpus.add(family, "legacy_eager", "torchscript", LEGACY_OPSET, legacy, truth=truth_file)
    if family.legacy_only:
        return
    old_opset = folder / "legacy_opset14.onnx"
    opset14 = family.name in OPSET14_FAMILIES and family.wants("legacy_opset14")
    if opset14 and _attempt(
        corpus,
        family,
        "legacy_opset14",
        lambda: export_legacy(model, family, feeds, old_opset, OLD_LEGACY_OPSET),
    ):
        corpus.add(
            family, "legacy_opset14", "torchscript", OLD_LEGACY_OPSET, old_opset, truth=truth_file
        )
    if family.sdpa and family.wants("legacy_sdpa"):
        _sdpa_variant(corpus, family, feeds, truth_file)
    if family.wants("dynamo_eager"):
        _dynamo_variant(corpus, family, model, feeds, truth_file)
    source = legacy if legacy.exists() else None
    if family.optimum and family.wants("optimum"):
        path = folder / "optimum.onnx"
        if _attempt(corpus, family, "optimum", lambda: export_optimum(model, path)):
            corpus.add(family, "optimum", "optimum", LEGACY_OPSET, path, truth=truth_file)
            source = source or path
    if source is not None:
        _derived_variants(corpus, family, model, feeds, source)
    _with_past_variant(corpus, family, model, truth_file)
    _genai_variants(corpus, family)


def _keras() -> Any:
    """Keras 3 on the torch backend (development only, like torch)."""
    import os

    os.environ["KERAS_BACKEND"] = "torch"
    import keras

    return keras


def _keras_model() -> tuple[Any, Any]:
    """A Keras 3 encoder on the torch backend (seeded): token embedding, then two post-LN
    blocks of ``MultiHeadAttention`` and a GELU MLP; returns (model, model of every layer)."""
    keras = _keras()
    keras.utils.set_random_seed(SEED)
    ids = keras.Input(shape=(TOKENS,), batch_size=BATCH, dtype="int64", name="input_ids")
    stream = keras.layers.Embedding(VOCAB, D_MODEL)(ids)
    layers = [stream]
    for _ in range(N_LAYERS):
        attended = keras.layers.MultiHeadAttention(N_HEADS, D_MODEL // N_HEADS)(stream, stream)
        stream = keras.layers.LayerNormalization()(stream + attended)
        hidden = keras.layers.Dense(D_FF, activation="gelu")(stream)
        stream = keras.layers.LayerNormalization()(stream + keras.layers.Dense(D_MODEL)(hidden))
        layers.append(stream)
    return keras.Model(ids, stream), keras.Model(ids, layers)


def build_keras(corpus: Corpus, family: Family) -> None:
    """Keras' own ONNX export (``model.export(format="onnx")``, the sizes fixed by the input
    signature: Keras then uses torch's dynamo exporter) and the truth from Keras itself."""
    keras = _keras()
    _log(family.name)
    folder = corpus.out / family.name
    folder.mkdir(parents=True, exist_ok=True)
    model, every_layer = _keras_model()
    ids = sample_feeds(family)["input_ids"]
    hidden = [keras.ops.convert_to_numpy(h) for h in every_layer(ids)]
    attentions = [
        layer for layer in model.layers if isinstance(layer, keras.layers.MultiHeadAttention)
    ]
    kernels = [
        [
            keras.ops.convert_to_numpy(dense.kernel)
            for dense in (a._query_dense, a._key_dense, a._value_dense, a._output_dense)
        ]
        for a in attentions
    ]
    arrays = {
        key: np.stack(
            [k[i].reshape(-1, D_MODEL) if i == 3 else k[i].reshape(D_MODEL, -1) for k in kernels]
        ).astype(np.float32)
        for i, key in enumerate(("W_Q", "W_K", "W_V", "W_O"))
    } | {
        "n_heads": np.array(N_HEADS),
        "n_kv_heads": np.array(N_HEADS),
        "d_head": np.array(D_MODEL // N_HEADS),
        "hidden": np.stack(hidden).astype(np.float32),
        "feed_input_ids": ids,
    }
    truth_file = f"{family.name}/{_save_truth(folder / 'truth.npz', arrays)}"
    path = folder / "keras_export.onnx"
    spec = keras.InputSpec(shape=ids.shape, dtype="int64", name="input_ids")
    if _attempt(
        corpus,
        family,
        "keras_export",
        lambda: model.export(str(path), format="onnx", input_signature=[spec], verbose=False),
    ):
        _strip_debug_metadata(path)
        opset = next(o.version for o in onnx.load(str(path)).opset_import if o.domain == "")
        corpus.add(family, "keras_export", "keras", opset, path, truth=truth_file)


def build_with_past_only(corpus: Corpus, family: Family) -> None:
    """Only the ``with_past`` export of one family, and its truth file given the empty caches
    among its feeds: the arrays an existing truth file holds are kept as they are (a recomputed
    hidden state can differ from them in the last bit), the ones it lacks added."""
    _log(f"{family.name} (with_past only)")
    folder = corpus.out / family.name
    folder.mkdir(parents=True, exist_ok=True)
    model = family.make("eager")
    arrays = truth(family, model, sample_feeds(family))
    if (folder / "truth.npz").exists():
        with np.load(folder / "truth.npz") as old:
            arrays |= {key: old[key] for key in old.files}
    truth_file = f"{family.name}/{_save_truth(folder / 'truth.npz', arrays)}"
    _with_past_variant(corpus, family, model, truth_file)


def _with_past_variant(corpus: Corpus, family: Family, model: nn.Module, truth_file: str) -> None:
    if family.name not in WITH_PAST_FAMILIES:
        return
    if family.name in MERGED_FAMILIES:
        merged = corpus.out / family.name / "merged.onnx"
        if _attempt(corpus, family, "merged", lambda: export_merged(model, merged)):
            corpus.add(
                family, "merged", "optimum+merge_decoders", LEGACY_OPSET, merged, truth=truth_file
            )
    path = corpus.out / family.name / "with_past.onnx"
    if _attempt(corpus, family, "with_past", lambda: export_with_past(model, path)):
        corpus.add(
            family,
            "with_past",
            "optimum",
            LEGACY_OPSET,
            path,
            truth=truth_file,
            task=WITH_PAST_TASK,
        )
        _optimized_with_past(corpus, family, model, path, truth_file)


def _optimized_with_past(
    corpus: Corpus, family: Family, model: nn.Module, source: Path, truth_file: str
) -> None:
    """``optimized_with_past`` (the optimizer on ``with_past.onnx``) and ``fp16_with_past`` (its
    float16 conversion, with ``truth_fp16_with_past.npz``: the float truth's feeds, the empty
    caches among them, and the model with its weights rounded as the file rounds them)."""
    if family.name not in OPTIMIZED_WITH_PAST_FAMILIES:
        return
    folder = corpus.out / family.name
    origin = {"derived_from": source.name, "task": WITH_PAST_TASK}
    path = folder / "optimized_with_past.onnx"
    if not _attempt(corpus, family, "optimized_with_past", lambda: optimize(family, source, path)):
        return
    corpus.add(
        family,
        "optimized_with_past",
        "optimum+ort-optimizer",
        LEGACY_OPSET,
        path,
        truth=truth_file,
        optimizer_model_type=family.optimizer,
        **origin,
    )
    if family.name not in FP16_WITH_PAST_FAMILIES:
        return
    fp16 = folder / "fp16_with_past.onnx"
    if _attempt(corpus, family, "fp16_with_past", lambda: to_float16(path, fp16)):
        fake = dequantised_model(model, path, float16_weights(fp16))
        arrays = truth(family, fake, sample_feeds(family))  # the empty caches among the feeds
        name = _save_truth(folder / "truth_fp16_with_past.npz", arrays)
        corpus.add(
            family,
            "fp16_with_past",
            "optimum+ort-optimizer+float16",
            LEGACY_OPSET,
            fp16,
            truth=f"{family.name}/{name}",
            derived_from=path.name,
            task=WITH_PAST_TASK,
        )


def _genai_variants(corpus: Corpus, family: Family) -> None:
    """onnxruntime-genai's ``genai_fp32`` and ``genai_int4`` files of one family, made from its
    own model (:func:`genai_model`), with ``truth_genai.npz`` and ``truth_genai_int4.npz`` (the
    same model with each weight as the int4 file's ``MatMulNBits`` multiplies by it)."""
    if family.name not in GENAI_FAMILIES:
        return
    _log(f"{family.name} (genai)")
    folder = corpus.out / family.name
    folder.mkdir(parents=True, exist_ok=True)
    sized, model = genai_model(family)
    feeds = sample_feeds(family)
    caches = {f"feed_{name}": value for name, value in empty_caches(sized).items()}
    arrays = truth(sized, model.model, feeds) | caches
    truth_file = f"{family.name}/{_save_truth(folder / 'truth_genai.npz', arrays)}"
    fp32 = folder / "genai_fp32.onnx"
    if not _attempt(corpus, family, "genai_fp32", lambda: export_genai(model, "fp32", fp32)):
        return
    version = {"onnxruntime_genai": importlib.metadata.version("onnxruntime-genai")}
    corpus.add(sized, "genai_fp32", GENAI_EXPORTER, _opset(fp32), fp32, truth=truth_file, **version)
    int4 = folder / "genai_int4.onnx"
    if _attempt(corpus, family, "genai_int4", lambda: export_genai(model, "int4", int4)):
        fake = dequantised_by_columns(model, fp32, nbits_weights(int4))
        arrays = truth(sized, fake.model, feeds) | caches
        name = _save_truth(folder / "truth_genai_int4.npz", arrays)
        corpus.add(
            sized,
            "genai_int4",
            GENAI_EXPORTER,
            _opset(int4),
            int4,
            truth=f"{family.name}/{name}",
            **version,
        )


def _opset(path: Path) -> int:
    """The default-domain opset a file imports."""
    return next(
        int(entry.version)
        for entry in onnx.load(str(path), load_external_data=False).opset_import
        if entry.domain in ("", "ai.onnx")
    )


def _sdpa_variant(
    corpus: Corpus, family: Family, feeds: dict[str, np.ndarray], truth_file: str
) -> None:
    path = corpus.out / family.name / "legacy_sdpa.onnx"
    model = family.make("sdpa")
    if _attempt(corpus, family, "legacy_sdpa", lambda: export_legacy(model, family, feeds, path)):
        corpus.add(family, "legacy_sdpa", "torchscript", LEGACY_OPSET, path, truth=truth_file)


def _dynamo_variant(
    corpus: Corpus, family: Family, model: nn.Module, feeds: dict[str, np.ndarray], truth_file: str
) -> None:
    path = corpus.out / family.name / "dynamo_eager.onnx"
    dynamic: list[bool] = []

    def work() -> None:
        dynamic.append(export_dynamo(model, family, feeds, path))

    if _attempt(corpus, family, "dynamo_eager", work):
        corpus.add(
            family,
            "dynamo_eager",
            "dynamo",
            DYNAMO_OPSET,
            path,
            truth=truth_file,
            dynamic_axes=dynamic[0],
        )


def _derived_variants(
    corpus: Corpus, family: Family, model: nn.Module, feeds: dict[str, np.ndarray], legacy: Path
) -> None:
    """The optimizer's and the int8 quantiser's output of ``legacy`` (or optimum's export)."""
    origin = {"derived_from": legacy.name}
    folder = corpus.out / family.name
    truth_file = f"{family.name}/truth.npz"
    if family.optimizer is not None and family.wants("optimized"):
        path = folder / "optimized.onnx"
        if _attempt(corpus, family, "optimized", lambda: optimize(family, legacy, path)):
            corpus.add(
                family,
                "optimized",
                "torchscript+ort-optimizer",
                LEGACY_OPSET,
                path,
                truth=truth_file,
                optimizer_model_type=family.optimizer,
                **origin,
            )
    quantisers = [("int8", "torchscript+quantize_dynamic", quantize, int8_weights)]
    if family.name in STATIC_FAMILIES:
        quantisers += _static_quantisers(family, feeds)
    if family.name in NBITS_FAMILIES:
        quantisers.append(("nbits", "torchscript+matmul_nbits", quantize_nbits, nbits_weights))
        quantisers.append(("fp16", "torchscript+float16", to_float16, float16_weights))
    _quantised_variants(corpus, family, model, feeds, legacy, quantisers)


#: One quantised route: variant, exporter label, ``quantise(source, path)``, and the dequantised
#: weights it stores (``{float initializer: value}``).
Quantiser = tuple[str, str, Callable[[Path, Path], None], Callable[[Path], dict[str, np.ndarray]]]


def _static_quantisers(family: Family, feeds: dict[str, np.ndarray]) -> list[Quantiser]:
    """``quantize_static`` in its QDQ and QOperator forms (int8 weights; :func:`static_weights`
    reads what each stores)."""
    return [
        (
            form,
            f"torchscript+quantize_static_{form}",
            functools.partial(
                quantize_static_form,
                feeds=feeds,
                form=form,
                products_only=family.name in STATIC_PRODUCTS_ONLY,
            ),
            static_weights,
        )
        for form in ("qdq", "qoperator")
    ]


def _quantised_variants(
    corpus: Corpus,
    family: Family,
    model: nn.Module,
    feeds: dict[str, np.ndarray],
    legacy: Path,
    quantisers: list[Quantiser],
) -> None:
    """Each quantiser's output of ``legacy``, with the truth of ``model`` holding the weights the
    quantised file stores (``truth_<variant>.npz``)."""
    folder = corpus.out / family.name
    for variant, exporter, quantise, dequantised_weights in quantisers:
        if not family.wants(variant):
            continue
        path = folder / f"{variant}.onnx"
        if _attempt(corpus, family, variant, functools.partial(quantise, legacy, path)):
            fake = dequantised_model(model, legacy, dequantised_weights(path))
            name = _save_truth(folder / f"truth_{variant}.npz", truth(family, fake, feeds))
            corpus.add(
                family,
                variant,
                exporter,
                LEGACY_OPSET,
                path,
                truth=f"{family.name}/{name}",
                derived_from=legacy.name,
            )


#: Dynamic int8 quantisation of onnxruntime's optimizer output (its fused ``Attention`` becomes
#: ``QAttention``, its ``EmbedLayerNormalization`` ``QEmbedLayerNormalization``).
OPTIMIZED_INT8_FAMILIES = frozenset({"bert"})


def quantize_optimized(source: Path, path: Path) -> None:
    """``quantize_dynamic`` (int8 weights) of the optimizer's output; its contrib operators'
    outputs have no inferred type, so float is said to be the default."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(path),
        weight_type=QuantType.QInt8,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def build_optimized_int8_only(corpus: Corpus, family: Family) -> None:
    """Only the dynamic int8 quantisation of a family's committed ``optimized`` file."""
    import lzma

    _log(f"{family.name} (int8 of the optimizer's output only)")
    optimized = corpus.out / family.name / "optimized.onnx"
    optimized.write_bytes(lzma.decompress(optimized.with_name(optimized.name + ".xz").read_bytes()))
    quantiser: Quantiser = (
        "optimized_int8",
        "torchscript+ort-optimizer+quantize_dynamic",
        quantize_optimized,
        int8_weights,
    )
    try:
        feeds = sample_feeds(family)
        _quantised_variants(corpus, family, family.make("eager"), feeds, optimized, [quantiser])
    finally:
        optimized.unlink()


def build_static_only(corpus: Corpus, family: Family) -> None:
    """Only the static-quantisation routes of a family already in the corpus, derived from the
    committed file its ``int8`` route was made from (decompressed for the quantiser, then
    removed)."""
    import lzma

    _log(f"{family.name} (static quantisation only)")
    manifest = json.loads((corpus.out / "manifest.json").read_text(encoding="utf-8"))
    (source,) = (
        entry["derived_from"]
        for entry in manifest["fixtures"]
        if entry["id"] == f"{family.name}-int8"
    )
    legacy = corpus.out / family.name / source
    legacy.write_bytes(lzma.decompress(legacy.with_name(legacy.name + ".xz").read_bytes()))
    try:
        feeds = sample_feeds(family)
        _quantised_variants(
            corpus, family, family.make("eager"), feeds, legacy, _static_quantisers(family, feeds)
        )
    finally:
        legacy.unlink()


def _compress(out: Path, entry: dict[str, Any]) -> None:
    """Replace a fixture's ``.onnx`` by ``.onnx.xz`` (xz -9e): the corpus stays under 20 MB.

    ``sha256`` becomes the compressed file's digest; ``onnx_sha256`` keeps the export's.
    """
    import lzma

    path = out / entry["file"]
    data = path.read_bytes()
    packed = path.with_name(path.name + ".xz")
    packed.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    path.unlink()
    entry["file"] += ".xz"
    entry["sha256"] = hashlib.sha256(packed.read_bytes()).hexdigest()
    entry["onnx_sha256"] = hashlib.sha256(data).hexdigest()


def write_manifest(corpus: Corpus, *, whole_families: bool = True) -> None:
    """``manifest.json``: the fixtures (sorted by id) and the exports that failed.

    ``whole_families``: the families built replace every entry of theirs; otherwise (a route
    added to families already there) only the entries of the ids built are replaced.
    """
    path = corpus.out / "manifest.json"
    old: dict[str, Any] = {"fixtures": [], "export_failures": []}
    if path.exists():
        old = json.loads(path.read_text(encoding="utf-8"))
    families = {e["family"] for e in corpus.entries} | {
        s["id"].split("-")[0] for s in corpus.skipped
    }
    for entry in corpus.entries:  # the manifest is written after every family: new files only
        if not entry["file"].endswith(".xz"):
            _compress(corpus.out, entry)
    ids = {e["id"] for e in corpus.entries} | {s["id"] for s in corpus.skipped}
    replaced = families if whole_families else set()
    keep = [e for e in old["fixtures"] if e["family"] not in replaced and e["id"] not in ids]
    keep_failed = [
        s
        for s in old["export_failures"]
        if s["id"].split("-")[0] not in replaced and s["id"] not in ids
    ]
    manifest = {
        "generator": "scripts/make_family_fixtures.py",
        "versions": _versions(),
        "fixtures": sorted(keep + corpus.entries, key=lambda e: e["id"]),
        "export_failures": sorted(keep_failed + corpus.skipped, key=lambda s: s["id"]),
    }
    # Hand-kept notes (``dropped_for_size``: fixtures deleted to keep the corpus small) survive.
    manifest |= {key: value for key, value in old.items() if key not in manifest}
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _versions() -> dict[str, str]:
    import onnxruntime
    import onnxscript

    return {
        "torch": torch.__version__,
        "transformers": tf.__version__,
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    """Build the chosen families (default: all) into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "families")
    parser.add_argument("--only", default="", help="comma-separated family names")
    parser.add_argument(
        "--with-past-only",
        action="store_true",
        help="only the with_past route (and the truth files) of the chosen families",
    )
    parser.add_argument(
        "--genai-only",
        action="store_true",
        help="only the onnxruntime-genai routes (and their truth files) of the chosen families",
    )
    parser.add_argument(
        "--optimized-int8-only",
        action="store_true",
        help="only the int8 quantisation of the optimizer's output of the chosen families",
    )
    parser.add_argument(
        "--static-only",
        action="store_true",
        help="only the quantize_static routes (QDQ, QOperator) of the chosen families",
    )
    args = parser.parse_args(argv)
    chosen = set(filter(None, args.only.split(",")))
    unknown = chosen - {f.name for f in FAMILIES}
    if unknown:
        parser.error(f"unknown families: {sorted(unknown)}")
    torch.set_num_threads(1)
    corpus = Corpus(args.out)
    build = build_with_past_only if args.with_past_only else build_family
    routes = WITH_PAST_FAMILIES if args.with_past_only else frozenset(GENAI_FAMILIES)
    if args.genai_only:
        build = _genai_variants
    if args.static_only:
        build, routes = build_static_only, STATIC_FAMILIES
    if args.optimized_int8_only:
        build, routes = build_optimized_int8_only, OPTIMIZED_INT8_FAMILIES
    partial = args.with_past_only or args.genai_only or args.static_only or args.optimized_int8_only
    for family in FAMILIES:
        if partial and family.name not in routes:
            continue
        if not chosen or family.name in chosen:
            make = family.build or build
            if _attempt(corpus, family, "model", lambda f=family, m=make: m(corpus, f)):
                write_manifest(corpus, whole_families=not partial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
