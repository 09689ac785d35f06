"""Defusing onnxruntime's ``com.microsoft`` ``GroupQueryAttention`` (see :mod:`.defuse`).

onnxruntime-genai's model builder writes every attention of a decoder (Llama, Qwen2, Mistral,
Phi-3, ...) as one ``GroupQueryAttention`` node that takes the projected Q, K and V (packed in one
tensor or separate), the key/value cache of the tokens seen so far, ``seqlens_k`` (per item, its
total length minus 1) and ``total_sequence_length``, and the cos/sin caches of its own rotary
embedding. :func:`group_query_attention` rewrites it into the standard subgraph the matcher walks:

- Q, K, V: ``Slice`` s of a packed (B, S, (N + 2·N_kv)·H) input, or the separate inputs;
- the rotary embedding (``do_rotary``): onnxruntime's ``RotaryEmbedding`` on Q and K (rotate-half
  or ``rotary_interleaved``, on the first ``2 · cos_cache.shape[1]`` columns of each head) at
  positions ``P, P + 1, ...`` (P the past length, 0 where the audit feeds an empty cache);
- head split; the present key/value outputs ``Concat(past, new)`` along the sequence axis, which
  the attention reads (so the past inputs are key/value cache inputs:
  :mod:`oversmooth.importers.graph.kv_cache`); key/value heads repeated ``N / N_kv`` times;
- the scores ``scale · Q Kᵀ`` (``scale`` 0: 1/sqrt(H)), soft-capped (``softcap`` c > 0:
  ``c · tanh(s / c)``), plus ``attention_bias``, plus one mask bias hiding, for query i (at position
  ``P + i``) of item b, every key j that is later (``j > P + i``), past the item's length
  (``j > seqlens_k[b]``) or, with ``local_window_size`` w > 0, out of its window of w keys
  (``j ≤ P + i − w``); ``Softmax``; ·V; head merge.

``seqlens_k`` and ``total_sequence_length`` given as graph inputs (not computed from the attention
mask, as the builder computes them) are left out, and out of the graph's inputs: at past length 0
the causal mask hides the padding on the right from every real token.

This is exactly the operator at past length 0 (the audit's case; on the real tokens where the
lengths are graph inputs) and with a past for batches without padding; ``smooth_softmax``, ``head_sink``, the ``output_qk`` output, explicit
``position_ids`` and cos/sin caches of another element type than Q are declined by name.

Public API
----------
group_query_attention
    The rewrite (an :class:`~oversmooth.importers.graph.defuse_parts.Emitter`).
"""

from __future__ import annotations

import numpy as np
import onnx

from oversmooth.importers.graph.defuse_parts import (
    Emitter,
    Facts,
    attention_scale,
    num_heads,
    refuse,
    refuse_inputs,
    refuse_outputs,
)
from oversmooth.importers.graph.node import Node

__all__ = ["group_query_attention"]

MS = "com.microsoft"
#: Input positions of the operator (onnxruntime's contrib spec).
_PAST_KEY, _PAST_VALUE, _SEQLENS, _COS, _SIN, _BIAS = 3, 4, 5, 7, 8, 10


def group_query_attention(node: Node, facts: Facts, softmax: str) -> Emitter:
    """``com.microsoft`` ``GroupQueryAttention`` as standard ONNX (see the module docstring).

    Parameters
    ----------
    node : Node
        The fused node: inputs query (B, S, D) or packed QKV, key, value (B, S, N_kv·H), past key
        and value (B, N_kv, P, H), ``seqlens_k`` (B,), ``total_sequence_length``, cos and sin
        caches (positions, rotated width / 2), ...; outputs (B, S, N·H), present key and value.
    facts : Facts
        Shapes, constants and element types of the original graph.
    softmax : str
        The name of the new ``Softmax`` node.

    Returns
    -------
    Emitter
        The nodes and constants that replace ``node`` (same output names).

    Raises
    ------
    DeclinedError
        A feature the rewrite does not implement (its message names it).
    """
    refuse_inputs(node, {9: "with position_ids", 11: "with head_sink"})
    refuse_outputs(node, {3: "with the output_qk output"})
    refuse(node.attr("smooth_softmax", 0), "with smooth_softmax")
    heads, kv_heads = num_heads(node), num_heads(node, "kv_num_heads")
    refuse(heads % kv_heads, f"with {heads} query heads not a multiple of {kv_heads}")
    em = Emitter(node.label, facts.float_dtype(node.input(0), "a query"))
    q, k, v, head_size = _qkv(em, node, facts, heads, kv_heads)
    past = _past_length(em, node)
    if node.attr("do_rotary", 0):
        q = _rotary(em, node, facts, q, heads, head_size, past)
        k = _rotary(em, node, facts, k, kv_heads, head_size, past)
    keys = _present(em, node, em.split_heads(k, kv_heads, (0, 2, 1, 3)), _PAST_KEY, 1)
    values = _present(em, node, em.split_heads(v, kv_heads, (0, 2, 1, 3)), _PAST_VALUE, 2)
    group = heads // kv_heads
    k_t = em.op("Transpose", [em.repeat_heads(keys, group)], perm=[0, 1, 3, 2])
    q = em.split_heads(q, heads, (0, 2, 1, 3))
    biases = [_mask_bias(em, node, q, keys, past, _seqlens(em, node, facts))]
    if node.input(_BIAS):
        biases.append(node.input(_BIAS))
    values = em.repeat_heads(values, group)
    scale, cap = attention_scale(node, head_size), float(node.attr("softcap", 0.0))
    context = em.attend(q, k_t, values, scale, biases, softmax, softcap=cap)
    em.merge_heads(context, node.outputs[0])
    return em


def _qkv(
    em: Emitter, node: Node, facts: Facts, heads: int, kv_heads: int
) -> tuple[str, str, str, int]:
    """(Q (B, S, N·H), K, V (B, S, N_kv·H), H): the separate inputs or slices of the packed one."""
    query, key, value = node.input(0), node.input(1), node.input(2)
    shape = facts.shape(query)
    refuse(shape is None or len(shape) != 3, "with a query that is not (batch, sequence, hidden)")
    assert shape is not None
    if key or value:
        refuse(not (key and value), "with a key but no value (or a value but no key)")
        ranks = [len(facts.shape(name) or ()) for name in (key, value)]
        refuse(ranks != [3, 3], "with key/value not of shape (batch, sequence, hidden)")
        refuse(shape[2] % heads, f"with a query width {shape[2]} not a multiple of {heads} heads")
        return query, key, value, shape[2] // heads
    width = heads + 2 * kv_heads
    refuse(shape[2] % width, f"with a packed QKV width {shape[2]} not a multiple of {width} heads")
    head_size = shape[2] // width
    bounds = np.cumsum([0, heads, kv_heads, kv_heads]) * head_size
    parts = [
        em.op(
            "Slice",
            [
                query,
                em.ints("start", [int(bounds[i])]),
                em.ints("end", [int(bounds[i + 1])]),
                em.ints("axis", [2]),
            ],
        )
        for i in range(3)
    ]
    return parts[0], parts[1], parts[2], head_size


def _past_length(em: Emitter, node: Node) -> str:
    """The past length P as a (1,) int64 tensor (a constant 0 without a past key input)."""
    past_key = node.input(_PAST_KEY)
    if not past_key:
        return em.ints("past", [0])
    return em.gather(em.op("Shape", [past_key]), [2])


def _rotary(
    em: Emitter, node: Node, facts: Facts, x: str, heads: int, head_size: int, past: str
) -> str:
    """onnxruntime's ``RotaryEmbedding`` of (B, S, heads·H) ``x`` at positions ``past + s``."""
    cos, sin = node.input(_COS), node.input(_SIN)
    refuse(not cos or not sin, "with do_rotary but no cos/sin cache")
    shape = facts.shape(cos)
    refuse(shape is None or len(shape) != 2, "with a cos cache that is not (positions, width)")
    assert shape is not None
    width = 2 * shape[1]
    refuse(width > head_size, f"with a rotated width {width} beyond the head size {head_size}")
    for cache in (cos, sin):
        refuse(
            facts.elem_type(cache) != facts.elem_type(node.input(0)),
            "with a cos/sin cache of another element type than the query",
        )
    out = em.fresh("RotaryEmbedding")
    em.nodes.append(
        onnx.helper.make_node(
            "RotaryEmbedding",
            [x, past, cos, sin],
            [f"{out}_output"],
            name=out,
            domain=MS,
            num_heads=heads,
            interleaved=int(node.attr("rotary_interleaved", 0)),
            rotary_embedding_dim=0 if width == head_size else width,
        )
    )
    return f"{out}_output"


def _present(em: Emitter, node: Node, new: str, past_position: int, output: int) -> str:
    """The present keys or values (B, N_kv, P + S, H): ``Concat(past, new)`` (or ``new`` without
    a past input), written to the node's present output when it has one."""
    name = node.outputs[output] if len(node.outputs) > output and node.outputs[output] else ""
    past = node.input(past_position)
    if past:
        return em.op("Concat", [past, new], axis=2, output=name)
    return em.op("Identity", [new], output=name) if name else new


def _seqlens(em: Emitter, node: Node, facts: Facts) -> str:
    """``seqlens_k`` where the graph computes it (from its attention mask), else "".

    Given as graph inputs, ``seqlens_k`` and ``total_sequence_length`` are left out of the
    rewrite and of the graph (nothing else reads them): at past length 0 the causal mask already
    hides the keys past an item's length from its tokens (onnxruntime pads on the right), so only
    the padding rows, which no metric reads, would differ; no input source has to feed them.
    """
    seqlens = node.input(_SEQLENS)
    given = [name for name in (seqlens, node.input(6)) if name in facts.index.graph_inputs]
    em.unneeded_inputs.update(given)
    return "" if seqlens in given else seqlens


def _mask_bias(em: Emitter, node: Node, q: str, keys: str, past: str, seqlens: str) -> str:
    """(B, 1, S, T): the lowest float where a key is hidden from a query (later than it, past the
    item's ``seqlens_k``, out of the local window of the last ``local_window_size`` keys), else
    0."""
    key_positions = em.op("Unsqueeze", [em.positions(keys, 2), em.ints("axis", [0])])  # (1, T)
    query_positions = em.op(
        "Unsqueeze",
        [em.op("Add", [em.positions(q, 2), past]), em.ints("axis", [1])],
    )  # (S, 1)
    hidden = em.op("Greater", [key_positions, query_positions])
    window = int(node.attr("local_window_size", -1))
    if window > 0:
        start = em.op("Sub", [query_positions, em.ints("window", [window - 1])])
        hidden = em.op("Or", [hidden, em.op("Less", [key_positions, start])])
    if seqlens:
        lengths = em.op(
            "Unsqueeze",
            [em.op("Cast", [seqlens], to=onnx.TensorProto.INT64), em.ints("axis", [1])],
        )  # (B, 1)
        beyond = em.op("Greater", [key_positions, lengths])  # (B, T)
        hidden = em.op(
            "Or",
            [
                em.op("Unsqueeze", [hidden, em.ints("axis", [0])]),
                em.op("Unsqueeze", [beyond, em.ints("axis", [1])]),
            ],
        )  # (B, S, T)
    bias = em.where_bias(hidden, float(np.finfo(em.dtype).min))
    rank_axes = [1] if seqlens else [0, 1]
    return em.op("Unsqueeze", [bias, em.ints("axes", rank_axes)])
