"""All or nothing: which attention of a model was left unmatched, and refusing partial answers.

A result over some of a model's attention blocks silently drops layers (the audit's layer i is the
output of the i-th *matched* block), so the audit and the weights refuse it unless asked
(``partial=True``, ``--partial``) and then say first which blocks are missing.

Only token self-attention is an attention block. Attention declined by design, outside the
theory (cross-attention, windowed attention: :data:`~oversmooth.importers.match.codes.DISPOSITIONS`), is
*skipped*: it does not make a result partial, and every result names it
(:func:`skipped_blocks_note`); the residual-stream walk keeps a cross-attention sub-layer inside
the layer of the self-attention block before it (:mod:`oversmooth.importers.match.stream`). A Softmax the
matcher rejected for any other reason counts as unmatched attention unless
:func:`not_attention_reason` gives a reason it is none:

- its scores are a product of activations with a constant matrix (``x W + b``: a classifier's or
  a router's logits), not of two activations (``Q Kᵀ``, with or without an additive bias such as
  ALiBi) (:func:`is_attention_softmax`); or
- its output is not the A of an A·V product (:mod:`oversmooth.importers.match.softmax_uses`, a walk
  forward through everything the matcher's walk to the ·V ``MatMul`` passes and more): every use
  of its probabilities is one of: reduced away (``ReduceSum``/``ReduceMean``/``ReduceMax``...,
  ``ArgMax``, over any axes), a graph output, a gate of another activation (a ``Mul`` by it,
  then anything but an A·V product), the right operand of a product (X·P), a product with a
  constant, or nothing.

Where the probabilities also feed an A·V product (the left operand of a ``MatMul`` with an
activation, the right one of ``Vᵀ Aᵀ``, any operand of an ``Einsum`` with an activation,
batched 3-D or not), or reach an op none of those names, the Softmax stays attention: attention
whose probabilities are also returned as graph outputs (``output_attentions=True``) is still
attention, and a block the matcher declines for another reason is refused, never dropped.

Decided: a weighted sum — the probabilities times another activation, then reduced — is the A·V
product written out as ``Mul`` + ``ReduceSum``, or a pooling. It stays attention when the
probabilities are a square (query, key) matrix at the probe's sizes (the long probe's where the
default one leaves their shape unknown), or of unknown shape: token attention may be written
that way and the matcher reads only a ``MatMul``, so the audit refuses rather than drop a block.
Otherwise (one row per learned or pooled query, as in attention pooling with a learned query,
whose scores are a product of two activations once the query is broadcast to the batch; or a
vector of weights, as in an audio encoder's attentive statistics pooling) it is a pooling and
not attention, whatever its scores.

Fused attention operators (onnxruntime's ``Attention``, ``MultiHeadAttention``,
``GroupQueryAttention``, ``PackedAttention``, ONNX's ``Attention``) are rewritten into standard
ONNX when the model is loaded (:mod:`oversmooth.importers.graph.defuse`); one still in the graph was declined
there and counts, with the feature that stopped the rewrite as its reason.

Public API
----------
not_attention_reason
    Why a rejected Softmax is not attention (one line), or None when it is.
is_attention_softmax
    The scores rule alone: False for a classifier's Softmax.
fused_attention_failures
    One failure per fused attention operator in the graph.
score_product, score_operands
    The product behind a Softmax's scores and its two factors.
check_complete
    Raise :class:`IncompleteMatchError` when attention is unmatched and ``partial`` is not set.
missing_blocks_note
    The one-line statement of what a partial result lacks.
skipped_blocks_note
    The one-line statement of the attention skipped by design, each block and why.
IncompleteMatchError
    Exit status 1: some attention was not matched.
"""

from __future__ import annotations

from collections.abc import Mapping

from oversmooth.importers.errors import ImporterError
from oversmooth.importers.graph import GraphIndex, Node
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.limits import SOFTMAX_SEARCH_DEPTH
from oversmooth.importers.match.results import MatchFailure, MatchReport
from oversmooth.importers.match.softmax_uses import SoftmaxUses
from oversmooth.importers.match.walker import MatchBasis

__all__ = [
    "CLASSIFIER_SCORES",
    "FUSED_ATTENTION",
    "IncompleteMatchError",
    "check_complete",
    "fused_attention_failures",
    "is_attention_softmax",
    "missing_blocks_note",
    "not_attention_reason",
    "score_operands",
    "score_product",
    "skipped_blocks_note",
]

#: Fused attention operators (any domain): their structure is inside one node.
FUSED_ATTENTION = frozenset(
    {"Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"}
)
_PRODUCTS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Einsum", "MatMulInteger", "MatMulNBits"})
#: Ops between a product and the Softmax that keep the scores' meaning (masks, scales, biases).
_THROUGH = frozenset(
    {"Add", "Sub", "Mul", "Div", "Cast", "Where", "Reshape", "Transpose", "Identity", "Squeeze"}
)


class IncompleteMatchError(ImporterError):
    """Some attention of the model was not matched; a result would silently miss its layers."""

    exit_code = 1


#: The reason a Softmax whose scores are a classifier's is not attention.
CLASSIFIER_SCORES = (
    "its scores are a product with a constant matrix (x W + b: a classifier's or a router's "
    "logits), not of two activations (Q Kᵀ)"
)


def not_attention_reason(
    basis: MatchBasis, softmax: Node, long: MatchBasis | None = None
) -> str | None:
    """Why ``softmax``, rejected by the matcher, is not attention (one line); None when it is.

    The scores rule first (:func:`is_attention_softmax`), then the uses of its output
    (:class:`~oversmooth.importers.match.softmax_uses.SoftmaxUses`) over ``basis`` (the probe's default
    sizes; ``long``, the long probe's, for shapes those leave unknown). A graph too malformed
    around it to follow leaves it attention.
    """
    if not is_attention_softmax(basis.index, softmax):
        return CLASSIFIER_SCORES
    try:
        return SoftmaxUses(basis, softmax, long).not_attention()
    except (ValueError, TypeError, IndexError, KeyError, OverflowError):
        return None


def is_attention_softmax(index: GraphIndex, softmax: Node) -> bool:
    """True unless the Softmax's scores come from a product with a constant matrix (a classifier).

    The scores rule alone (the residual-stream walk uses it to tell a router's Softmax in an MLP
    branch from the next block's attention); :func:`not_attention_reason` adds the uses of the
    output. Walks back from the Softmax input through masks, scales, casts and layout ops (at most 8
    nodes deep) to the first product: two activations (``Q Kᵀ``) or nothing found → attention;
    an activation times a constant (logits ``x W + b``) → not attention.
    """
    product = score_product(index, softmax)
    if product is None:
        return True
    return not any(index.is_constant(x) for x in score_operands(product))


def score_product(index: GraphIndex, softmax: Node) -> Node | None:
    """The first product behind the Softmax's scores, walking back through masks, scales, casts
    and layout ops (at most 8 nodes deep); None when none is found."""
    frontier = [name for name in softmax.inputs[:1] if name]
    for _ in range(SOFTMAX_SEARCH_DEPTH):
        following: list[str] = []
        for name in frontier:
            node = index.producer(name)
            if node is None:
                continue
            if node.op_type in _PRODUCTS:
                return node
            if node.op_type in _THROUGH:
                following += [x for x in node.inputs if x and not index.is_constant(x)]
        if not following:
            return None
        frontier = following
    return None


def score_operands(product: Node) -> list[str]:
    """The two factors of a score product (its first two inputs that are set)."""
    return [x for x in product.inputs[:2] if x]


def fused_attention_failures(
    index: GraphIndex, declined: Mapping[str, str] | None = None
) -> list[MatchFailure]:
    """One :class:`MatchFailure` (code ``fused_attention_op``) per fused attention operator left in
    the graph; ``declined`` maps a node's label to why it was not defused (one line)."""
    declined = declined or {}
    return [
        MatchFailure(
            node.label,
            declined.get(
                node.label,
                f"fused {node.domain or 'ai.onnx'} {node.op_type} operator: not defused",
            )
            + " (export or optimise without attention fusion)",
            (node.label,),
            RejectCode.FUSED_ATTENTION_OP,
        )
        for node in index.nodes
        if node.op_type in FUSED_ATTENTION
    ]


def _attention_count(report: MatchReport) -> int:
    """The model's attention: blocks matched, unmatched and skipped by design."""
    return len(report.blocks) + len(report.unmatched) + len(report.skipped)


def missing_blocks_note(report: MatchReport) -> str:
    """``PARTIAL: k of n attention blocks not matched (...)``, naming each and its reason."""
    unmatched = report.unmatched
    total = _attention_count(report)
    named = "; ".join(f"{failure.softmax!r}: {failure.reason}" for failure in unmatched)
    return (
        f"PARTIAL: {len(unmatched)} of {total} attention blocks not matched ({named}); layers "
        f"are numbered over the {len(report.blocks)} matched blocks, so the missing blocks' "
        "outputs are not layers of this result"
    )


def skipped_blocks_note(report: MatchReport) -> str:
    """``SKIPPED by design: k of n attention blocks ...``, naming each skipped block and why
    (empty when none is)."""
    skipped = report.skipped
    if not skipped:
        return ""
    named = "; ".join(
        f"{failure.softmax!r} [{failure.code}]: {failure.reason}" for failure in skipped
    )
    return (
        f"SKIPPED by design: {len(skipped)} of {_attention_count(report)} attention blocks are "
        f"outside the theory, which is about self-attention, and are not audited ({named}); the "
        f"layers are the residual stream at the boundaries of the {len(report.blocks)} "
        "self-attention blocks, a sub-layer skipped between two of them inside the layer of the "
        "first"
    )


def check_complete(report: MatchReport, *, partial: bool) -> None:
    """Raise :class:`IncompleteMatchError` when attention is unmatched, unless ``partial``.

    Attention skipped by design (:attr:`MatchReport.skipped`) is not unmatched: it never refuses.
    """
    if report.unmatched and not partial:
        unmatched = report.unmatched
        first = unmatched[0]
        more = f" and {len(unmatched) - 1} more" if len(unmatched) > 1 else ""
        raise IncompleteMatchError(
            f"{len(unmatched)} of {_attention_count(report)} attention blocks are not "
            f"matched ({first.softmax!r}: {first.reason}{more}); a result would silently miss "
            "their layers: pass --partial to use the matched blocks only"
        )
