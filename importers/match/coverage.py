"""All or nothing: which attention of a model was left unmatched, and refusing partial answers.

A result over some of a model's attention blocks silently drops layers (the audit's layer i is the
output of the i-th *matched* block), so the audit and the weights refuse it unless asked
(``partial=True``, ``--partial``) and then say first which blocks are missing.

Every Softmax that was not matched counts as unmatched attention unless it is plainly a
classifier: its scores are a product of activations with a constant matrix (``x W + b``), not of
two activations (``Q Kᵀ``, with or without an additive bias such as ALiBi). Fused attention
operators (onnxruntime's ``Attention``, ``MultiHeadAttention``, ``GroupQueryAttention``,
``PackedAttention``, ONNX's ``Attention``) are rewritten into standard ONNX when the model is
loaded (:mod:`importers.graph.defuse`); one still in the graph was declined there and counts, with
the feature that stopped the rewrite as its reason.

Public API
----------
is_attention_softmax
    Whether a rejected Softmax is attention (True unless it is a classifier's).
fused_attention_failures
    One failure per fused attention operator in the graph.
check_complete
    Raise :class:`IncompleteMatchError` when attention is unmatched and ``partial`` is not set.
missing_blocks_note
    The one-line statement of what a partial result lacks.
IncompleteMatchError
    Exit status 1: some attention was not matched.
"""

from __future__ import annotations

from collections.abc import Mapping

from importers.errors import ImporterError
from importers.graph import GraphIndex, Node
from importers.match.codes import RejectCode
from importers.match.limits import SOFTMAX_SEARCH_DEPTH
from importers.match.results import MatchFailure, MatchReport

__all__ = [
    "FUSED_ATTENTION",
    "IncompleteMatchError",
    "check_complete",
    "fused_attention_failures",
    "is_attention_softmax",
    "missing_blocks_note",
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


def is_attention_softmax(index: GraphIndex, softmax: Node) -> bool:
    """True unless the Softmax's scores come from a product with a constant matrix (a classifier).

    Walks back from the Softmax input through masks, scales, casts and layout ops (at most 8
    nodes deep) to the first product: two activations (``Q Kᵀ``) or nothing found → attention;
    an activation times a constant (logits ``x W + b``) → not attention.
    """
    frontier = [name for name in softmax.inputs[:1] if name]
    for _ in range(SOFTMAX_SEARCH_DEPTH):
        following: list[str] = []
        for name in frontier:
            node = index.producer(name)
            if node is None:
                continue
            if node.op_type in _PRODUCTS:
                operands = [x for x in node.inputs[:2] if x]
                return not any(index.is_constant(x) for x in operands)
            if node.op_type in _THROUGH:
                following += [x for x in node.inputs if x and not index.is_constant(x)]
        if not following:
            return True
        frontier = following
    return True


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


def missing_blocks_note(report: MatchReport) -> str:
    """``PARTIAL: k of n attention blocks not matched (...)``, naming each and its reason."""
    unmatched = report.unmatched
    total = len(report.blocks) + len(unmatched)
    named = "; ".join(f"{failure.softmax!r}: {failure.reason}" for failure in unmatched)
    return (
        f"PARTIAL: {len(unmatched)} of {total} attention blocks not matched ({named}); layers "
        f"are numbered over the {len(report.blocks)} matched blocks, so the missing blocks' "
        "outputs are not layers of this result"
    )


def check_complete(report: MatchReport, *, partial: bool) -> None:
    """Raise :class:`IncompleteMatchError` when attention is unmatched, unless ``partial``."""
    if report.unmatched and not partial:
        unmatched = report.unmatched
        first = unmatched[0]
        more = f" and {len(unmatched) - 1} more" if len(unmatched) > 1 else ""
        raise IncompleteMatchError(
            f"{len(unmatched)} of {len(report.blocks) + len(unmatched)} attention blocks are not "
            f"matched ({first.softmax!r}: {first.reason}{more}); a result would silently miss "
            "their layers: pass --partial to use the matched blocks only"
        )
