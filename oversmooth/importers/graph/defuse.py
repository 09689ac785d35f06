"""Defusing: fused attention operators rewritten into the standard-ONNX subgraph they stand for.

onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer``) replaces a whole
attention block by one contrib node whose packed weights hide the structure and whose attention
probabilities cannot be fetched. :func:`defuse_attention` rewrites each such node into
projection ``MatMul`` (+ bias ``Add``) → head split → ``MatMul(Q, Kᵀ)`` → scale ``Mul`` → mask /
bias ``Add`` → ``Softmax`` → ``MatMul(·, V)`` → head merge (:mod:`.defuse_parts`), with packed
weights sliced into per-Q/K/V constants, so that the Softmax-anchored matcher finds the block
unchanged and a run can expose the Softmax output. It is applied once, by
:func:`oversmooth.importers.graph.model_from_proto`, so matching, weights, transforms and runs all see the same
graph. Rewritten, each exactly as the onnxruntime contrib operator spec defines it:

- ``com.microsoft`` ``Attention``: ``num_heads``, ``qkv_hidden_sizes``, ``scale``,
  ``unidirectional``, ``mask_filter_value``; ``mask_index`` as key lengths (B), end and start
  positions (2B), a raw 0/1 mask (B, T) or (B, S, T), or a dummy (1, 1)/(B, 1); ``attention_bias``;
  past state: ``past`` (2, B, N, P, H), keys ``Concat(past[0], K)`` and values
  ``Concat(past[1], V)`` along the sequence, stacked into the ``present`` output.
- ``com.microsoft`` ``MultiHeadAttention``: separate 3-D Q, K, V (+ packed ``bias``) or packed QKV
  (B, T, N, 3, H); ``key_padding_mask`` as for ``Attention``; ``attention_bias``; ``unidirectional``;
  past state: ``past_key``/``past_value`` (B, N, P, H), the ``present_key``/``present_value``
  outputs ``Concat(past, new)`` along the sequence.

With past state the attention reads the present keys and values (so the past inputs are key/value
cache inputs, :mod:`oversmooth.importers.graph.kv_cache`, fed empty by the audit) and the causal mask is
bottom-right (query i at position P + i), as onnxruntime's kernels compute it.
- ONNX ``Attention`` (opset 23): 3-D or 4-D Q, K, V, grouped key/value heads, boolean or additive
  ``attn_mask``, ``is_causal``, ``scale``.
- ``com.microsoft`` ``GroupQueryAttention`` (onnxruntime-genai's decoders): packed or separate
  Q/K/V, its key/value cache (present = past ++ new), ``seqlens_k``, its own rotary embedding,
  ``local_window_size``, ``softcap`` (:mod:`.defuse_gqa`).
- ``com.microsoft`` ``RelativePositionBias`` (T5's bucketed position bias, which onnxruntime's CPU
  provider cannot run).

Anything else (a shared past/present buffer or ``past_sequence_length``, beam search's
``cache_indirection``, past state on MultiHeadAttention's packed QKV, rotary inside ``Attention``,
ONNX's softcap and past state, 4-D Megatron masks, ...) is declined: the node stays fused and :class:`Declined` says, in one line,
which feature stopped it.

Public API
----------
defuse_attention
    Rewrite every fused attention node of a model; returns a :class:`Defusion`.
Defusion, Defused, Declined
    The result, one rewritten node, one node left fused (and why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from oversmooth.importers.graph.defuse_gqa import group_query_attention
from oversmooth.importers.graph.defuse_parts import (
    BATCH,
    DeclinedError,
    Emitter,
    Facts,
    attention_scale,
    num_heads,
    refuse,
    refuse_inputs,
    refuse_outputs,
    with_replaced_nodes,
)
from oversmooth.importers.graph.index import GraphIndex
from oversmooth.importers.graph.node import DEFAULT_DOMAINS, Node

__all__ = ["Declined", "Defused", "Defusion", "defuse_attention"]


@dataclass(frozen=True)
class Defused:
    """One fused node rewritten: its label, ``"<domain> <op>"`` and the new Softmax's name."""

    node: str
    op: str
    softmax: str

    def note(self) -> str:
        return f"defused from {self.op} {self.node!r}"


@dataclass(frozen=True)
class Declined:
    """One fused node left as it is, with the feature that stopped it (``"with past state"``)."""

    node: str
    op: str
    reason: str

    def line(self) -> str:
        """``fused com.microsoft Attention 'name' with past state: not defused``."""
        return f"fused {self.op} {self.node!r} {self.reason}: not defused"


@dataclass(frozen=True)
class Defusion:
    """The rewritten model (None when nothing was rewritten) and what happened to each node."""

    proto: onnx.ModelProto | None
    defused: tuple[Defused, ...] = ()
    declined: tuple[Declined, ...] = field(default=())


def _origin(node: Node) -> str:
    return f"{'ai.onnx' if node.domain in DEFAULT_DOMAINS else node.domain} {node.op_type}"


def _mask_form(facts: Facts, mask: str, batch: int) -> str | None:
    """The form of an onnxruntime key mask (:data:`defuse_parts.MASK_FORMS`) from its shape."""
    if not mask:
        return None
    shape = facts.shape(mask)
    refuse(shape is None, "with a mask of unknown shape")
    assert shape is not None
    if len(shape) == 1 and shape[0] in (batch, 2 * batch):
        return "index"
    if len(shape) == 2 and shape[1] == 1 and shape[0] in (1, batch):
        return "dummy"
    if len(shape) in (2, 3):
        return "keys" if len(shape) == 2 else "queries_keys"
    what = "a 4-D (Megatron) mask" if len(shape) == 4 else f"a mask of shape {list(shape)}"
    raise DeclinedError(f"with {what}")


def _mask_biases(
    em: Emitter,
    node: Node,
    facts: Facts,
    mask: str,
    queries: str,
    keys: tuple[str, int],
    past: bool = False,
) -> list[str]:
    """The additive biases of a contrib op: key mask, causal mask, ``attention_bias``.

    ``keys``: a batch-first tensor of the keys and its sequence axis; with a ``past`` the causal
    mask is bottom-right (query i at position P + i).
    """
    filler = float(node.attr("mask_filter_value", -10000.0))
    batch = (facts.shape(queries) or (BATCH,))[0]
    form = _mask_form(facts, mask, batch)
    biases = []
    if form not in (None, "dummy"):
        biases.append(em.key_mask_bias(mask, form, keys[0], filler, keys[1]))
    if node.attr("unidirectional", 0):
        lowest = float(np.finfo(em.dtype).min)
        biases.append(em.causal_bias((queries, 1), keys, lowest, bottom_right=past))
    if node.input(5):
        biases.append(node.input(5))
    return biases


def _contrib_attention(node: Node, facts: Facts, softmax: str) -> Emitter:
    """``com.microsoft`` ``Attention``: packed weights (D_in, D_q + D_k + D_v) sliced per role;
    with ``past`` (2, B, N, P, H) and/or the ``present`` output (:func:`_packed_present`)."""
    refuse_inputs(node, {6: "with past state (past_sequence_length)"})
    refuse(node.attr("do_rotary", 0), "with rotary embedding inside the op (do_rotary)")
    refuse(node.attr("past_present_share_buffer", 0), "with past_present_share_buffer")
    weights = facts.constant(node.input(1))
    refuse(weights is None, "with weights computed at run time (not a constant)")
    assert weights is not None
    refuse(weights.ndim != 2 or weights.dtype.kind != "f", "with non-float or non-2-D weights")
    heads = num_heads(node)
    sizes = [int(size) for size in node.attr("qkv_hidden_sizes") or [weights.shape[1] // 3] * 3]
    refuse(
        len(sizes) != 3
        or sum(sizes) != weights.shape[1]
        or sizes[0] != sizes[1]
        or any(size % heads for size in sizes),
        f"with qkv_hidden_sizes {sizes} inconsistent with weights {list(weights.shape)} and "
        f"{heads} heads",
    )
    bias = facts.constant(node.input(2)) if node.input(2) else None
    refuse(node.input(2) and bias is None, "with a bias computed at run time (not a constant)")
    em = Emitter(node.label, weights.dtype)
    x, bounds = node.input(0), np.cumsum([0, *sizes])
    parts = [
        em.project(
            x,
            weights[:, bounds[i] : bounds[i + 1]],
            None if bias is None else np.ravel(bias)[bounds[i] : bounds[i + 1]],
            role,
        )
        for i, role in enumerate("QKV")
    ]
    stateful = bool(node.input(4)) or _output(node, 1) != ""
    if stateful:
        q, k_t, v, keys = _packed_present(em, node, facts, parts, heads)
    else:
        (q, k_t, v), keys = _split_qkv(em, parts, heads), (x, 1)
    biases = _mask_biases(em, node, facts, node.input(3), x, keys, past=stateful)
    context = em.attend(q, k_t, v, attention_scale(node, sizes[0] // heads), biases, softmax)
    em.merge_heads(context, node.outputs[0])
    return em


def _output(node: Node, position: int) -> str:
    """The name of the node's output at ``position`` ("" when it has none)."""
    return node.outputs[position] if len(node.outputs) > position else ""


def _packed_present(
    em: Emitter, node: Node, facts: Facts, parts: list[str], heads: int
) -> tuple[str, str, str, tuple[str, int]]:
    """Q (B, N, S, H), Kᵀ, V and (keys, 2) of ``Attention`` with past state, as onnxruntime
    computes them: keys = ``Concat(past[0], K)``, values = ``Concat(past[1], V)`` along the
    sequence, ``present`` = the two stacked (2, B, N, P + S, H)."""
    past = node.input(4)
    if past:
        shape = facts.shape(past)
        refuse(
            shape is None or len(shape) != 5 or shape[0] != 2,
            "with a past that is not (2, batch, heads, past, head size)",
        )
    q, k, v = (em.split_heads(part, heads, (0, 2, 1, 3)) for part in parts)
    keys, values = (
        em.present(em.gather(past, index) if past else "", new, "")
        for index, new in enumerate((k, v))
    )
    present = _output(node, 1)
    if present:
        stacked = [em.op("Unsqueeze", [part, em.ints("axis", [0])]) for part in (keys, values)]
        em.op("Concat", stacked, axis=0, output=present)
    k_t = em.op("Transpose", [keys], perm=[0, 1, 3, 2])
    return q, k_t, values, (keys, 2)


def _split_qkv(em: Emitter, parts: list[str], heads: int) -> tuple[str, str, str]:
    """Q (B, N, S, H), Kᵀ (B, N, H, T), V (B, N, T, H) from (B, T, N·H) tensors."""
    q = em.split_heads(parts[0], heads, (0, 2, 1, 3))
    k = em.split_heads(parts[1], heads, (0, 2, 3, 1))
    return q, k, em.split_heads(parts[2], heads, (0, 2, 1, 3))


def _multi_head_attention(node: Node, facts: Facts, softmax: str) -> Emitter:
    """``com.microsoft`` ``MultiHeadAttention``, with ``past_key``/``past_value`` (B, N, P, H)
    and/or the ``present_key``/``present_value`` outputs (:meth:`Emitter.present`)."""
    refuse_inputs(
        node,
        {
            8: "with past state (past_sequence_length)",
            9: "with cache_indirection (beam search)",
        },
    )
    refuse_outputs(node, {3: "with a qk output"})
    past_key, past_value = node.input(6), node.input(7)
    refuse(bool(past_key) != bool(past_value), "with a past key but no past value (or the reverse)")
    stateful = bool(past_key) or any(_output(node, position) for position in (1, 2))
    heads, query = num_heads(node), node.input(0)
    em = Emitter(node.label, facts.float_dtype(query, "a query"))
    q_shape = facts.shape(query)
    refuse(q_shape is None or len(q_shape) not in (3, 5), "with a query of unknown shape")
    assert q_shape is not None
    if len(q_shape) == 5:  # packed QKV (B, T, N, 3, H)
        refuse(node.input(1) or node.input(2), "with packed QKV and separate key/value")
        refuse(node.input(3), "with packed QKV and a bias")
        refuse(stateful, "with packed QKV and past state")
        packed = [em.gather(query, index, axis=3) for index in range(3)]
        q = em.op("Transpose", [packed[0]], perm=[0, 2, 1, 3])
        k = em.op("Transpose", [packed[1]], perm=[0, 2, 3, 1])
        v = em.op("Transpose", [packed[2]], perm=[0, 2, 1, 3])
        head_size, keys = q_shape[4], (query, 1)
    else:
        key, value = node.input(1), node.input(2)
        ranks = [len(facts.shape(name) or ()) for name in (key, value)]
        refuse(not key or not value, "without separate key and value")
        refuse(ranks != [3, 3], "with key/value not of shape (batch, sequence, hidden)")
        width = q_shape[2]
        bias = facts.constant(node.input(3)) if node.input(3) else None
        refuse(node.input(3) and bias is None, "with a bias computed at run time")
        offsets = [0, width, 2 * width, None]
        parts = [
            em.add_bias(
                name, None if bias is None else np.ravel(bias)[offsets[i] : offsets[i + 1]], role
            )
            for i, (name, role) in enumerate(zip((query, key, value), "QKV", strict=True))
        ]
        head_size = width // heads
        if stateful:
            q, k, v = (em.split_heads(part, heads, (0, 2, 1, 3)) for part in parts)
            k = em.present(past_key, k, _output(node, 1))
            v = em.present(past_value, v, _output(node, 2))
            keys, k = (k, 2), em.op("Transpose", [k], perm=[0, 1, 3, 2])
        else:
            (q, k, v), keys = _split_qkv(em, parts, heads), (key, 1)
    biases = _mask_biases(em, node, facts, node.input(4), query, keys, past=stateful)
    context = em.attend(q, k, v, attention_scale(node, head_size), biases, softmax)
    em.merge_heads(context, node.outputs[0])
    return em


def _onnx_attention(node: Node, facts: Facts, softmax: str) -> Emitter:
    """ONNX ``Attention`` (opset 23) without past state, softcap or a qk output."""
    refuse_inputs(
        node, {4: "with past key/value", 5: "with past key/value", 6: "with nonpad_kv_seqlen"}
    )
    refuse_outputs(
        node,
        {
            1: "with present key/value outputs",
            2: "with present key/value outputs",
            3: "with the qk_matmul_output output",
        },
    )
    refuse(float(node.attr("softcap", 0.0)) != 0.0, "with softcap")
    refuse(node.attr("softmax_precision") is not None, "with softmax_precision")
    query, key, value = node.input(0), node.input(1), node.input(2)
    em = Emitter(node.label, facts.float_dtype(query, "a query"))
    shapes = [facts.shape(name) for name in (query, key, value)]
    ranks = {len(shape) for shape in shapes if shape is not None}
    refuse(len(ranks) != 1 or None in shapes or ranks - {3, 4}, "with Q/K/V of unknown rank")
    q_shape, k_shape, _ = (shape for shape in shapes if shape is not None)
    if ranks == {3}:
        q_heads, kv_heads = num_heads(node, "q_num_heads"), num_heads(node, "kv_num_heads")
        q = em.split_heads(query, q_heads, (0, 2, 1, 3))
        k = em.split_heads(key, kv_heads, (0, 2, 1, 3))
        v = em.split_heads(value, kv_heads, (0, 2, 1, 3))
        head_size = q_shape[2] // q_heads
    else:
        q, k, v = query, key, value
        q_heads, kv_heads, head_size = q_shape[1], k_shape[1], q_shape[3]
    refuse(q_heads % kv_heads, f"with {q_heads} query heads not a multiple of {kv_heads}")
    k = em.op("Transpose", [em.repeat_heads(k, q_heads // kv_heads)], perm=[0, 1, 3, 2])
    v = em.repeat_heads(v, q_heads // kv_heads)
    biases = []
    mask = node.input(3)
    if mask:
        is_bool = facts.elem_type(mask) == onnx.TensorProto.BOOL
        biases.append(em.bool_mask_bias(mask) if is_bool else mask)
    if node.attr("is_causal", 0):
        biases.append(em.causal_bias((q, 2), (v, 2), -np.inf))
    context = em.attend(q, k, v, attention_scale(node, head_size), biases, softmax)
    if ranks == {3}:
        em.merge_heads(context, node.outputs[0])
    else:
        em.op("Identity", [context], output=node.outputs[0])
    return em


def _relative_position_bias(node: Node, facts: Facts, _softmax: str) -> Emitter:
    """``com.microsoft`` ``RelativePositionBias`` (T5): bucketed table lookup."""
    table = facts.constant(node.input(0))
    refuse(table is None or table.ndim != 2, "with a bias table that is not a 2-D constant")
    assert table is not None
    em = Emitter(node.label, table.dtype)
    n_buckets, n_heads = table.shape
    # The (n_buckets, n_heads) tensor holds the table column-major: entry (bucket, head) is at
    # flat position head * n_buckets + bucket.
    by_bucket = em.const("table", np.ascontiguousarray(table.reshape(n_heads, n_buckets).T))
    bias = em.relative_position_bias(
        by_bucket,
        node.input(1),
        node.input(2),
        int(node.attr("max_distance", 0)),
        bool(node.attr("is_bidirectional", 0)),
        n_buckets,
    )
    em.op("Identity", [bias], output=node.outputs[0])
    return em


_Rewrite = Callable[[Node, Facts, str], Emitter]
#: The rewrites, by (domain, op type); the flag says whether the node is attention (has a Softmax).
_REWRITES: dict[tuple[str, str], tuple[_Rewrite, bool]] = {
    ("com.microsoft", "Attention"): (_contrib_attention, True),
    ("com.microsoft", "MultiHeadAttention"): (_multi_head_attention, True),
    ("", "Attention"): (_onnx_attention, True),
    ("com.microsoft", "GroupQueryAttention"): (group_query_attention, True),
    ("com.microsoft", "RelativePositionBias"): (_relative_position_bias, False),
}
#: Fused attention operators with no rewrite yet: each is declined with this reason.
_NOT_REWRITTEN = {
    "PackedAttention": "(its token-packed batches are not rewritten)",
}


def _key(node: Node) -> tuple[str, str]:
    return ("" if node.domain in DEFAULT_DOMAINS else node.domain, node.op_type)


def defuse_attention(proto: onnx.ModelProto, index: GraphIndex) -> Defusion:
    """Rewrite every fused attention node of ``proto`` (top-level graph) into standard ONNX.

    Parameters
    ----------
    proto : onnx.ModelProto
        Left unchanged.
    index : GraphIndex
        The index of ``proto.graph`` (constants are read through it).

    Returns
    -------
    Defusion
        ``proto``: a rewritten copy (None when no node was rewritten); ``defused`` and ``declined``
        per fused node. A rewritten node is replaced in place by its subgraph (same output names);
        packed weights no other node reads are dropped.
    """
    facts = Facts(proto, index)
    replaced: dict[int, Emitter] = {}
    defused: list[Defused] = []
    declined: list[Declined] = []
    for node in index.nodes:
        rewrite = _REWRITES.get(_key(node))
        if rewrite is None:
            if node.op_type in _NOT_REWRITTEN:
                declined.append(Declined(node.label, _origin(node), _NOT_REWRITTEN[node.op_type]))
            continue
        function, is_attention = rewrite
        softmax = f"{node.label}/defused/Softmax"
        try:
            replaced[node.position] = function(node, facts, softmax)
        except DeclinedError as reason:
            declined.append(Declined(node.label, _origin(node), str(reason)))
            continue
        if is_attention:
            defused.append(Defused(node.label, _origin(node), softmax))
    if not replaced:
        return Defusion(None, (), tuple(declined))
    return Defusion(with_replaced_nodes(proto, index, replaced), tuple(defused), tuple(declined))
