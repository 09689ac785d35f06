"""The results of attention matching: :class:`AttentionBlock`, :class:`MatchReport` and their parts.

Re-exported by :mod:`oversmooth.importers.match`, the public face; import them from there.

AttentionBlock, MatchReport, MatchFailure, LinearMatch, NormMatch
    Structure only; :mod:`oversmooth.importers.weights` reads the numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from oversmooth.importers.errors import ImporterError
from oversmooth.importers.match.codes import RejectCode, by_design

#: How a block may depart from the update ``X + A X W_V W_O``, linear in X for the A the graph
#: computes, and still be read (short names in :attr:`AttentionBlock.departures`, with what each
#: means). How A itself is computed (Q/K norms, soft-capped scores) is no departure: A is measured.
DEPARTURES = {
    "branch-norm": "attention output normalised before the residual sum",
    "value-clip": "values clipped to constant bounds before the attention",
}


@dataclass(frozen=True)
class MatchFailure:
    """Why one Softmax was not matched as an attention block.

    Attributes
    ----------
    softmax : str
        The Softmax node's name (or ``"Softmax#<position>"``).
    reason : str
        One line, naming the part that was not found or did not fit.
    nodes : tuple of str
        Nodes involved in the rejection.
    code : RejectCode
        A stable short tag for the kind of failure (:class:`~oversmooth.importers.match.codes.RejectCode`,
        e.g. ``"value_matmul_missing"``).
    not_attention : str or None
        Why the Softmax is not attention at all, in one line (its scores are a classifier's, or
        its output is not the A of an A·V product: reduced away, a graph output, a gate...; see
        :func:`oversmooth.importers.match.coverage.not_attention_reason`); None for attention left
        unmatched, the blocks a result would miss.
    """

    softmax: str
    reason: str
    nodes: tuple[str, ...] = ()
    code: RejectCode = RejectCode.OTHER
    not_attention: str | None = None

    @property
    def attention(self) -> bool:
        """Whether the Softmax is attention left unmatched (``not_attention`` is None)."""
        return self.not_attention is None

    @property
    def skipped(self) -> bool:
        """Whether it is attention declined by design, outside the theory (cross-attention,
        windowed attention: :data:`~oversmooth.importers.match.codes.DISPOSITIONS`): a result over the
        other blocks misses nothing the theory is about."""
        return self.attention and by_design(self.code)

    def to_dict(self) -> dict[str, Any]:
        """The failure's JSON record: ``softmax``, ``code``, ``reason``, ``nodes``, ``attention``,
        ``skipped`` (declined by design) and ``not_attention`` (the reason it is not attention,
        or null)."""
        return {
            "softmax": self.softmax,
            "code": self.code,
            "reason": self.reason,
            "nodes": list(self.nodes),
            "attention": self.attention,
            "skipped": self.skipped,
            "not_attention": self.not_attention,
        }


@dataclass(frozen=True)
class LinearMatch:
    """A projection ``y = x @ W + b`` found in the graph (weights not read yet).

    ``kind`` is ``"matmul"``, ``"gemm"``, ``"fused_matmul"``, ``"matmul_integer"`` (onnxruntime
    dynamic quantisation; ``weight_scale``/``weight_zero_point`` name the dequantisation constants)
    or ``"matmul_nbits"`` (onnxruntime's block-quantised ``MatMulNBits``: ``weight`` holds the packed
    ``bits``-bit codes in blocks of ``block_size`` along the input axis, see :mod:`oversmooth.importers.nbits`).
    ``transpose`` says the stored weight is (out, in); ``alpha``/``beta`` are Gemm's factors.
    ``"einsum"`` and ``"conv"`` (:mod:`oversmooth.importers.match.linear_forms`) are the same product with the
    features elsewhere: ``in_axes`` trailing input axes contracted, the output features shaped
    ``out_dims`` (empty: ``(d_out,)``), the stored weight's axes ``weight_axes`` (contracted, then
    kept), or the features on ``channel_axis`` (-1: the last) with ``groups`` block-diagonal
    kernels.
    """

    kind: str
    x: str
    weight: str
    output: str
    d_in: int
    d_out: int
    bias: str | None = None
    transpose: bool = False
    alpha: float = 1.0
    beta: float = 1.0
    weight_scale: str | None = None
    weight_zero_point: str | None = None
    bits: int = 0
    block_size: int = 0
    nodes: tuple[str, ...] = ()
    out_dims: tuple[int, ...] = ()
    in_axes: int = 1
    weight_axes: tuple[int, ...] = ()
    channel_axis: int = -1
    groups: int = 1


#: Where a block's norm sits: before the attention, after the residual sum, or nowhere.
NormPosition = Literal["pre", "post", "none"]
#: The normalisations the matcher recognises.
NormKind = Literal["layernorm", "rmsnorm"]
#: What else is added to the content scores before the Softmax (:mod:`oversmooth.importers.match.scores`).
ScoreBiasKind = Literal["none", "alibi", "relative", "disentangled", "other"]
#: The rotary embedding on Q and K.
RotaryForm = Literal["none", "full", "partial"]
#: Each closed set of block field values, by field (for readers such as the report's schema).
BLOCK_FIELD_VALUES: dict[str, tuple[str, ...]] = {
    "norm": get_args(NormPosition),
    "norm_kind": get_args(NormKind),
    "score_bias": get_args(ScoreBiasKind),
    "rotary": get_args(RotaryForm),
}


@dataclass(frozen=True)
class NormMatch:
    """A normalisation found by structure: ``kind`` is ``"layernorm"`` or ``"rmsnorm"``."""

    kind: NormKind
    input: str
    output: str
    gamma: str | None
    beta: str | None
    eps: float | None
    nodes: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class AttentionBlock:
    """One matched self-attention sub-block (structure; weights via :mod:`oversmooth.importers.weights`).

    Attributes
    ----------
    index : int
        Depth order (0 = closest to the input).
    softmax : str
        Name of the Softmax node.
    n_heads, n_kv_heads, d_model, d_head : int
    norm : {"pre", "post", "none"}
    norm_kind : {"layernorm", "rmsnorm"} or None
    has_layer_scale : bool
    scale : float
        Product of the scalar factors found on Q, K and the scores (1/sqrt(d_head) normally).
    input_name : str
        Residual stream entering the block: its layer's input (:mod:`oversmooth.importers.match.boundaries`),
        which is the stream the attention reads (pre-LN: the norm's input; post-LN: the attention
        input) unless residual sub-layers come before the attention inside the layer.
    residual_name : str or None
        Output of the attention residual sum (an ``Add``, or a fused skip norm's sum output; for
        parallel blocks the sum after both branches).
    norm_output_name : str or None
        Post-LN only: output of the norm after the residual Add.
    output_name : str
        The stream leaving the block, in the layout of ``input_name``: the residual sum closing the
        MLP branch (pre-LN, no norm), its norm (post-LN), the sum after both branches (parallel),
        or the attention sub-block's stream where no MLP branch follows; where residual
        sub-layers come before each attention inside a layer, the layer's output
        (:mod:`oversmooth.importers.match.boundaries`).
    attention_name : str
        The Softmax output (attention probabilities, shape (batch, n_heads, T, T), or
        (batch · n_heads, T, T) where the scores are batched 3-D products: see
        :func:`oversmooth.importers.audit.dominance.attention_by_head`).
    q, k, v, o : LinearMatch
        The projections (Q, K, V may be one fused projection).
    q_columns, k_columns, v_columns : ndarray of int
        Columns of the projection weight, in canonical order (head-major, contiguous heads;
        K and V hold the ``n_kv_heads`` distinct heads).
    o_rows : ndarray of int
        Rows of the W_O weight in canonical order (row ``h*d_head + j`` is head h, feature j).
    norm_match : NormMatch or None
    layer_scale_name : str or None
        The constant of the LayerScale Mul.
    notes : tuple of str
        Non-fatal observations (e.g. a score scale differing from 1/sqrt(d_head)).
    roles : dict of str to str
        Node names by role, for reports.
    parallel : bool
        Attention and MLP read the same stream; their results are added to it together.
    stream_error : str or None
        Why the residual stream around the block could not be established (one line naming what
        was not found); the audit refuses to read its layers (:mod:`oversmooth.importers.match.stream`).
    score_bias : {"none", "alibi", "relative", "disentangled", "other"}
        What else is added to the content scores Q K^T before the Softmax, masks aside: ALiBi
        (linear in the key position per head), a relative position bias (a function of j - i, a
        table gathered by relative position), disentangled position terms (a Q or K projection
        times position embeddings, DeBERTa) or another term independent of the hidden states
        (:mod:`oversmooth.importers.match.scores`). A stays the real Softmax output; W_Q and W_K are the
        content projections.
    causal : bool
        A mask hides every key after its query (found by evaluating the masks, not by names).
    rotary : {"none", "full", "partial"}
        The rotary embedding on Q and K (W_Q and W_K are read before it).
    rotary_width : int
        Columns rotated per head (d_head for full, 0 for none).
    input_base : str or None
        The stream that ``input_name`` adds terms to that do not depend on the inputs' values
        (YOLOS adds position embeddings between blocks), where it adds any: the previous block's
        output may be this tensor rather than ``input_name``.
    defused_from : str or None
        The fused operator the block was rewritten from at load (its note), else None.
    departures : tuple of str
        How the block departs from the linear update ``X + A X W_V W_O`` the theory is about, in
        short (:data:`DEPARTURES`); each has a note. A is still the Softmax output the graph
        computes, and W_V W_O the value path.
    time_major : bool
        The block's stream tensors are (tokens, batch, features), not (batch, tokens, features)
        (PyTorch's ``nn.TransformerEncoder`` without ``batch_first``).
    further_sums : int
        Residual sums closing non-attention branches that the stream walk passed after the MLP
        residual up to the next attention (:meth:`~oversmooth.importers.match.stream.StreamMatcher.
        further_sublayers`; 0 in most families).
    attention_input_name : str or None
        The stream the attention reads (as ``input_name`` describes it) where residual
        sub-layers come before the attention inside the layer, so that it is not ``input_name``
        (a Conformer's half-step FFN); None otherwise.
    """

    index: int
    softmax: str
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    norm: NormPosition
    norm_kind: NormKind | None
    has_layer_scale: bool
    scale: float
    input_name: str
    residual_name: str | None
    norm_output_name: str | None
    output_name: str
    attention_name: str
    q: LinearMatch = field(repr=False)
    k: LinearMatch = field(repr=False)
    v: LinearMatch = field(repr=False)
    o: LinearMatch = field(repr=False)
    q_columns: np.ndarray = field(repr=False)
    k_columns: np.ndarray = field(repr=False)
    v_columns: np.ndarray = field(repr=False)
    o_rows: np.ndarray = field(repr=False)
    norm_match: NormMatch | None = field(repr=False)
    layer_scale_name: str | None = field(repr=False)
    notes: tuple[str, ...] = ()
    roles: dict[str, str] = field(default_factory=dict, repr=False)
    parallel: bool = False
    stream_error: str | None = None
    score_bias: ScoreBiasKind = "none"
    causal: bool = False
    rotary: RotaryForm = "none"
    rotary_width: int = 0
    departures: tuple[str, ...] = ()
    input_base: str | None = None
    time_major: bool = False
    defused_from: str | None = None
    further_sums: int = 0
    attention_input_name: str | None = None

    @property
    def sources(self) -> dict[str, str]:
        """Graph tensors the weights come from (``W_Q``, ``b_Q``, ..., ``gamma``, ``layer_scale``)."""
        found = {"softmax": self.softmax}
        for key, linear in (("Q", self.q), ("K", self.k), ("V", self.v), ("O", self.o)):
            found[f"W_{key}"] = linear.weight
            if linear.bias is not None:
                found[f"b_{key}"] = linear.bias
        if self.norm_match is not None:
            if self.norm_match.gamma is not None:
                found["gamma"] = self.norm_match.gamma
            if self.norm_match.beta is not None:
                found["beta"] = self.norm_match.beta
        if self.layer_scale_name is not None:
            found["layer_scale"] = self.layer_scale_name
        return found

    def to_dict(self) -> dict[str, Any]:
        """The block's JSON record, used by ``inspect --json`` and ``audit.json`` alike."""
        return {
            "index": self.index,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "norm": self.norm,
            "norm_kind": self.norm_kind,
            "has_layer_scale": self.has_layer_scale,
            "parallel": self.parallel,
            "causal": self.causal,
            "score_bias": self.score_bias,
            "rotary": self.rotary,
            "rotary_width": self.rotary_width,
            "departures": list(self.departures),
            "time_major": self.time_major,
            "scale": self.scale,
            "sources": self.sources,
            "tensors": {
                "input": self.input_name,
                "residual": self.residual_name,
                "norm_output": self.norm_output_name,
                "output": self.output_name,
                "attention": self.attention_name,
            }
            | ({"attention_input": self.attention_input_name} if self.attention_input_name else {}),
            "notes": list(self.notes),
            "stream_error": self.stream_error,
        }

    def summary(self) -> str:
        """One line: heads, sizes, norm, LayerScale, and causal mask, rotary and score bias when
        present."""
        norm = self.norm if self.norm_kind is None else f"{self.norm}-LN {self.norm_kind}"
        extras = [
            *(["LayerScale"] if self.has_layer_scale else []),
            *(["causal"] if self.causal else []),
            *([f"rotary {self.rotary_text}"] if self.rotary != "none" else []),
            *([f"score bias {self.score_bias}"] if self.score_bias != "none" else []),
        ]
        return (
            f"{self.n_heads} heads ({self.n_kv_heads} kv) x {self.d_head}, "
            f"d_model {self.d_model}, norm {norm}" + "".join(f", {extra}" for extra in extras)
        )

    @property
    def rotary_text(self) -> str:
        """``none``, ``full`` or ``partial W/d_head`` (columns rotated per head)."""
        if self.rotary == "partial":
            return f"partial {self.rotary_width}/{self.d_head}"
        return self.rotary


@dataclass(frozen=True)
class MatchReport:
    """Result of :func:`find_attention_blocks`.

    Attributes
    ----------
    blocks : list of AttentionBlock
        In depth (graph) order.
    failures : list of MatchFailure
        One per Softmax that was not matched.
    n_softmax : int
        Number of Softmax nodes examined.
    """

    blocks: list[AttentionBlock]
    failures: list[MatchFailure]
    n_softmax: int

    @property
    def unmatched(self) -> list[MatchFailure]:
        """The failures that are attention the theory covers and the matcher could not read (fused
        operators included): blocks a result would miss."""
        return [failure for failure in self.failures if failure.attention and not failure.skipped]

    @property
    def skipped(self) -> list[MatchFailure]:
        """The attention declined by design (:attr:`MatchFailure.skipped`): named, not audited."""
        return [failure for failure in self.failures if failure.skipped]

    @property
    def not_attention(self) -> list[MatchFailure]:
        """The failures that are no attention at all (each with its ``not_attention`` reason)."""
        return [failure for failure in self.failures if not failure.attention]

    def to_dict(self) -> dict[str, Any]:
        """``{"n_softmax", "n_unmatched_attention", "n_skipped", "n_not_attention", "blocks": [...],
        "failures": [...]}`` (see :meth:`AttentionBlock.to_dict`, :meth:`MatchFailure.to_dict`)."""
        return {
            "n_softmax": self.n_softmax,
            "n_unmatched_attention": len(self.unmatched),
            "n_skipped": len(self.skipped),
            "n_not_attention": len(self.not_attention),
            "blocks": [block.to_dict() for block in self.blocks],
            "failures": [failure.to_dict() for failure in self.failures],
        }

    def explain(self) -> str:
        """Multi-line text: for each Softmax, what matched, why it is not attention, or why it
        was rejected."""
        groups = ((self.skipped, "skipped by design"), (self.not_attention, "not attention"))
        others = ", ".join(f"{len(group)} {label}" for group, label in groups if group)
        others = f" ({others})" if others else ""
        lines = [
            f"{self.n_softmax} Softmax node(s): {len(self.blocks)} attention block(s) matched, "
            f"{len(self.failures)} rejected{others}"
        ]
        for block in self.blocks:
            lines.append(f"Softmax {block.softmax!r}: block {block.index}: {block.summary()}")
            lines.extend(f"  {role}: {what}" for role, what in block.roles.items())
            lines.extend(f"  note: {note}" for note in block.notes)
            if block.stream_error is not None:
                lines.append(f"  residual stream not established: {block.stream_error}")
        for failure in self.failures:
            rejected = f"rejected [{failure.code}]: {failure.reason}"
            if failure.skipped:
                skipped = f"skipped by design [{failure.code}]: {failure.reason}"
                lines.append(f"Softmax {failure.softmax!r}: {skipped}")
            elif failure.not_attention is None:
                lines.append(f"Softmax {failure.softmax!r}: {rejected}")
            else:
                lines.append(f"Softmax {failure.softmax!r}: not attention: {failure.not_attention}")
                lines.append(f"  {rejected}")
            if failure.nodes:
                lines.append(f"  nodes: {', '.join(failure.nodes)}")
        return "\n".join(lines)


class NoAttentionBlocksError(ImporterError):
    """No Softmax in the graph matched the attention pattern.

    Attributes
    ----------
    failures : tuple of MatchFailure
        One entry per rejected Softmax candidate (empty when the graph has no Softmax at all).
    """

    exit_code = 1

    def __init__(self, message: str, failures: Sequence[MatchFailure] = ()) -> None:
        super().__init__(message)
        self.failures = tuple(failures)

    @classmethod
    def from_failures(
        cls, failures: Sequence[MatchFailure], *, top: int = 3, fused: Sequence[str] = ()
    ) -> NoAttentionBlocksError:
        """Build the error with a message naming the ``top`` most common rejection reasons.

        ``fused`` lists fused attention op types found instead of a Softmax (not supported).
        """
        if not failures:
            extra = (
                f" (it uses fused {', '.join(sorted(set(fused)))} nodes, which hide the attention "
                f"weights' structure; export without attention fusion)"
                if fused
                else ""
            )
            return cls(f"no attention block found: the graph has no Softmax node{extra}", ())
        counts = Counter(failure.code for failure in failures)
        example: dict[str, MatchFailure] = {}
        for failure in failures:
            example.setdefault(failure.code, failure)
        parts = []
        for code, count in counts.most_common(top):
            times = f" (x{count})" if count > 1 else ""
            parts.append(f"Softmax {example[code].softmax!r}: {example[code].reason}{times}")
        return cls(
            f"no attention block found among {len(failures)} Softmax node(s); "
            f"most common reasons: {'; '.join(parts)}",
            failures,
        )


def departures_note(blocks: Sequence[AttentionBlock]) -> str | None:
    """One line naming, per departure (:data:`DEPARTURES`), the blocks that depart from the linear
    update the dominance theory is about; None when none does."""
    parts = []
    for name, meaning in DEPARTURES.items():
        indices = [block.index for block in blocks if name in block.departures]
        if indices:
            parts.append(f"{meaning} in block(s) {_index_ranges(indices)}")
    if not parts:
        return None
    return (
        "not the linear update X + A X W_V W_O the dominance theory is about: "
        + "; ".join(parts)
        + " (A is still the graph's Softmax output; the blocks' notes say more)"
    )


def _index_ranges(indices: Sequence[int]) -> str:
    """``0-3, 7, 9-10`` for [0, 1, 2, 3, 7, 9, 10] (sorted, distinct)."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
