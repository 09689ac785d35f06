"""Find self-attention blocks in an ONNX graph by structure, starting from every Softmax.

Public API
----------
find_attention_blocks
    Match every Softmax; returns a :class:`MatchReport` (blocks in depth order plus the reason each
    rejected Softmax failed), or raises :class:`NoAttentionBlocksError` (exit status 1).
AttentionBlock, MatchReport, MatchFailure, LinearMatch, NormMatch
    The results (structure only; :mod:`oversmooth.importers.weights` reads the numbers).
check_complete, missing_blocks_note, skipped_blocks_note, IncompleteMatchError
    All or nothing: refuse a result that would miss unmatched attention, and name the attention
    skipped by design, outside the theory (:mod:`.coverage`).

How a block is matched (names are never used, only op types, constants and shapes):

1. Back from the Softmax through the score sum (:mod:`oversmooth.importers.match.scores`: ``Add``/``Sub``,
   mask fills, scalar ``Mul``/``Div`` scaling, views that keep the (query, key) axes) to the QKᵀ
   ``MatMul`` (two non-constant operands, Q and K projections of one stream); every other term
   added to it is classified (``score_bias``: a mask, ALiBi, relative, disentangled or other;
   ``causal``). A scalar factor (here and on the Q/K paths) is
   a constant or a value computed from constants and shapes only (e.g. SDPA's
   ``Sqrt(1/Sqrt(Cast(Shape(q)[-1])))`` on both Q and K), evaluated at the probe's sizes; one
   computed from the activations is declined. The block's ``scale`` is the product of them all.
2. Forward from the Softmax (through an ``IsNaN``→``Where`` guard, ``Cast``, ``Dropout``, views
   that keep the (query, key) axes) to the ·V ``MatMul``.
3. Back from Q, K and V through head-split layout ops (Reshape, Transpose, Squeeze, Unsqueeze, Expand,
   Tile, and Split/Slice/Gather of a fused QKV), scalar scaling, rotary embeddings
   (:mod:`oversmooth.importers.match.rotary`), Q/K norms, constant clips and the ``Concat`` of an empty
   key/value cache input with the new keys or values (the identity at past length 0, where the
   audit runs a decoder exported for generation: :mod:`oversmooth.importers.graph.kv_cache`) to a projection:
   ``MatMul`` with a constant weight (+ bias ``Add``), ``Gemm``, ``FusedMatMul``, or
   ``DynamicQuantizeLinear``→``MatMulInteger``. Weight constants may be folded chains (see
   :meth:`oversmooth.importers.graph.GraphIndex.constant_value`).
4. A numeric *probe* runs those layout ops on a tensor whose entries encode (token, column): what
   reaches the QKᵀ and ·V MatMuls tells the number of heads, the head size, the key/value head
   grouping (GQA) and exactly which weight column feeds which head, whatever the export's layout.
   Positions are numbered in the stream's layout, also where the projections read a (tokens, batch)
   view of it (``nn.MultiheadAttention``: a projection commutes with that Transpose).
   The head count therefore comes from the graph's Reshape shape constants; the score scale is only
   a cross-check (a mismatch is recorded in ``notes``). Symbolic batch and sequence sizes are
   probed as 2 and 3 (or as the sizes a static export's head-split Reshape spells out); the probe's
   leading axes are the projection input's shape, evaluated from the graph's own arithmetic at those
   sizes (so a vision model's patch count is the one its image size fixes), and Reshape targets
   computed at run time (``Shape``/``Gather``/``Concat``...) are evaluated the same way
   (:class:`oversmooth.importers.graph.ShapeContext`).
5. Forward from the ·V MatMul through the head merge to the output projection W_O (probed the same
   way for its row order), an optional LayerScale ``Mul`` by a constant, and the residual ``Add``.
6. The residual stream and the norm (:mod:`oversmooth.importers.match.stream`): forward from the attention
   output through residual sums (``Add`` of two non-constant tensors, or a fused
   ``SkipLayerNormalization``) to the one that adds the stream the attention read: pre-LN when
   that is a norm's input, post-LN when it is the attention input and the sum feeds a norm; a
   summand passed on the way is a parallel branch. Then the MLP residual on the resulting stream
   (a sum whose other summand is computed from it without a Softmax) gives the block output. Norms
   are fused ``LayerNormalization``, the decomposed LayerNorm chain, RMSNorm
   (Pow/ReduceMean/Add/Sqrt/Reciprocal-or-Div/Mul/Mul), ``SimplifiedLayerNormalization``,
   ``RMSNormalization`` or the fused skip norms (:mod:`oversmooth.importers.match.norms`).
7. Once every block is matched, the layers' boundaries (:mod:`oversmooth.importers.match.boundaries`): where a
   layer holds residual sub-layers before its attention (a Conformer's half-step FFN), each block's
   input and output move that many sub-layers back, to the stream between whole layers.

This package's ``__init__`` is the public face; the work is done in its modules: :mod:`oversmooth.importers.match.results`
(the result classes), :mod:`oversmooth.importers.match.core` (the Softmax-anchored walk, steps 1, 2 and 5),
:mod:`oversmooth.importers.match.projections` (step 3), :mod:`oversmooth.importers.match.layout` (the probe, steps 4 and 5),
:mod:`oversmooth.importers.match.stream` and :mod:`oversmooth.importers.match.norms` (step 6), :mod:`oversmooth.importers.match.boundaries` (step 7) and :mod:`oversmooth.importers.match.walker` (the shared graph queries).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from oversmooth.importers.errors import ImporterError
from oversmooth.importers.graph import GraphIndex, Node, OnnxModel
from oversmooth.importers.match.boundaries import layer_boundaries
from oversmooth.importers.match.codes import RejectCode
from oversmooth.importers.match.core import SCALE_RTOL as SCALE_RTOL
from oversmooth.importers.match.core import Matcher
from oversmooth.importers.match.coverage import (
    IncompleteMatchError,
    check_complete,
    fused_attention_failures,
    missing_blocks_note,
    not_attention_reason,
    skipped_blocks_note,
)
from oversmooth.importers.match.limits import LONG_PROBE_SEQUENCE, PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.results import (
    AttentionBlock,
    LinearMatch,
    MatchFailure,
    MatchReport,
    NoAttentionBlocksError,
    NormMatch,
    departures_note,
)
from oversmooth.importers.match.walker import MatchBasis, RejectError
from oversmooth.simulator.errors import one_line

__all__ = [
    "AttentionBlock",
    "IncompleteMatchError",
    "LinearMatch",
    "MatchFailure",
    "MatchReport",
    "NoAttentionBlocksError",
    "NormMatch",
    "ProbeBases",
    "RejectCode",
    "check_complete",
    "departures_note",
    "find_attention_blocks",
    "match_outcome",
    "match_softmax",
    "missing_blocks_note",
    "retry_sizes",
    "skipped_blocks_note",
]


def find_attention_blocks(model: OnnxModel) -> MatchReport:
    """Match every Softmax of ``model`` as a self-attention block.

    Parameters
    ----------
    model : OnnxModel
        From :func:`oversmooth.importers.graph.load_model`.

    Returns
    -------
    MatchReport
        ``blocks`` in depth order, ``failures`` for the Softmax nodes that did not match.

    Raises
    ------
    NoAttentionBlocksError
        No Softmax node at all, or none matched (exit status 1; carries the failures).
    """
    index = model.index
    softmaxes = index.nodes_of_type("Softmax")
    fused = fused_attention_failures(index, {item.node: item.line() for item in model.declined})
    if not softmaxes:
        if fused:
            raise NoAttentionBlocksError(
                f"no attention block found: the graph has no Softmax node; {fused[0].reason}",
                fused,
            )
        raise NoAttentionBlocksError.from_failures([])
    bases = ProbeBases(index)
    outcomes = [match_outcome(bases, softmax) for softmax in softmaxes]
    blocks = [outcome for outcome in outcomes if isinstance(outcome, AttentionBlock)]
    failures = [outcome for outcome in outcomes if isinstance(outcome, MatchFailure)]
    if not blocks:
        raise NoAttentionBlocksError.from_failures(failures + fused)
    defused = {item.softmax: item.note() for item in model.defused}
    merged = tuple(item.note() for item in model.branches)  # a merged decoder's cache branch
    blocks = [
        dataclasses.replace(
            block,
            index=position,
            notes=(*merged, *filter(None, [defused.get(block.softmax)]), *block.notes),
            defused_from=defused.get(block.softmax),
        )
        for position, block in enumerate(blocks)
    ]
    blocks = layer_boundaries(bases.at((PROBE_BATCH, PROBE_SEQUENCE)), blocks)
    return MatchReport(blocks=blocks, failures=failures + fused, n_softmax=len(softmaxes))


def match_outcome(bases: ProbeBases, softmax: Node) -> AttentionBlock | MatchFailure:
    """The block ``softmax`` heads (``index`` 0: numbered by :func:`find_attention_blocks`), or
    why it is not one (with the reason it is no attention at all, where it is none:
    :func:`~oversmooth.importers.match.coverage.not_attention_reason`). Independent of which Softmaxes were
    matched before it over ``bases``."""
    try:
        return match_softmax(lambda sizes: Matcher(bases.at(sizes)).match(softmax, 0))
    except RejectError as reject:
        default, long = (PROBE_BATCH, PROBE_SEQUENCE), (PROBE_BATCH, LONG_PROBE_SEQUENCE)
        not_attention = not_attention_reason(bases.at(default), softmax, bases.at(long))
        return MatchFailure(softmax.label, reject.reason, reject.nodes, reject.code, not_attention)
    except ImporterError:  # a file problem (external data, ...) is the user's answer as is
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError) as err:
        # A malformed attribute or constant (an axis of the wrong type, an impossible shape)
        # rejects this candidate with the reason instead of escaping as a traceback.
        reason = f"malformed graph around it: {one_line(err)}"
        return MatchFailure(softmax.label, reason, (), RejectCode.MALFORMED)


class ProbeBases:
    """The :class:`~oversmooth.importers.match.walker.MatchBasis` of one graph at each pair of probe sizes,
    made on first use and shared by every match attempt at those sizes."""

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
        self._bases: dict[tuple[int, int], MatchBasis] = {}

    def at(self, sizes: tuple[int, int]) -> MatchBasis:
        """The basis probing at ``sizes`` (batch, open axes)."""
        if sizes not in self._bases:
            self._bases[sizes] = MatchBasis(self.index, *sizes)
        return self._bases[sizes]


def match_softmax(attempt: Callable[[tuple[int, int]], AttentionBlock]) -> AttentionBlock:
    """``attempt`` at the default probe sizes, then at each size :func:`retry_sizes` derives from
    that rejection; raises the rejection that stands.

    :func:`match_outcome` makes every attempt a new :class:`~oversmooth.importers.match.core.Matcher` over
    the shared basis at its sizes, so nothing one attempt pinned reaches another.
    """
    default = (PROBE_BATCH, PROBE_SEQUENCE)
    try:
        return attempt(default)
    except RejectError as reject:
        first = reject
    later: list[RejectError] = []
    for sizes in retry_sizes(first):
        try:
            return attempt(sizes)
        except RejectError as reject:
            later.append(reject)
    asked_other_sizes = first.probe_sizes not in (None, default)
    raise later[0] if later and asked_other_sizes else first


def retry_sizes(reject: RejectError) -> tuple[tuple[int, int], ...]:
    """The probe sizes worth another attempt after ``reject`` at the default sizes.

    A static head-split Reshape that asked for other (batch, sequence) sizes (an export with
    fixed shapes): those sizes, then the same swapped (a time-major stream spells them
    (tokens, batch)); the failure at the asked sizes is then the one reported. Any other
    head-split failure: every open axis :data:`LONG_PROBE_SEQUENCE` long; the first failure is
    then the one reported. Anything else: none.
    """
    default = (PROBE_BATCH, PROBE_SEQUENCE)
    sizes = reject.probe_sizes
    if sizes is not None and sizes != default:
        swapped = (sizes[1], sizes[0])
        return (sizes,) if swapped in (sizes, default) else (sizes, swapped)
    if reject.code == RejectCode.HEAD_RESHAPE:
        return ((PROBE_BATCH, LONG_PROBE_SEQUENCE),)
    return ()
