"""Per-case and per-block records of the audit's dominance, operator and depth steps, with their
summaries and the agreement statistic: the parts :class:`~oversmooth.importers.audit.records.AuditResult` holds.

Split from :mod:`oversmooth.importers.audit.records` (which re-exports every name) to keep each module small;
every record has one ``to_dict()`` (:class:`Record`).

Public API
----------
Record
    The ``to_dict()`` mixin of every audit record.
DominanceCase, OperatorCase, HeadCase
    One (input, block, head) or (input, block) case of the dominance, operator and depth steps.
DominanceSummary, BlockVerdict, Agreement, OperatorBlock, OperatorSummary
    The fractions overall and per block, each block's predicted and observed direction, and the
    agreement between them with its chance level.
HeadDepth, DepthBlock, DepthSummary
    The depth step's per-head and per-block summaries (docs/theory.md §6.11).
summarize_dominance_block, kind_fractions, operator_summary
    The summaries computed from the cases.
DOMINANCE_COLUMNS, OPERATOR_COLUMNS, HEAD_COLUMNS, DEPTH_COLUMNS
    The columns of ``dominance.csv``, ``operator.csv``, ``heads.csv`` and ``depth.csv``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

__all__ = [
    "DEPTH_COLUMNS",
    "DOMINANCE_COLUMNS",
    "HEAD_COLUMNS",
    "OPERATOR_COLUMNS",
    "Agreement",
    "BlockVerdict",
    "DepthBlock",
    "DepthSummary",
    "DominanceCase",
    "DominanceSummary",
    "HeadCase",
    "HeadDepth",
    "OperatorBlock",
    "OperatorCase",
    "OperatorSummary",
    "Record",
    "block_verdict",
    "kind_fractions",
    "operator_summary",
]

#: Columns of ``dominance.csv``.
DOMINANCE_COLUMNS = (
    "input",
    "block",
    "head",
    "kind",
    "mu_real",
    "mu_imag",
    "modulus",
    "lambda_a_real",
    "lambda_a_imag",
    "lambda_h_real",
    "lambda_h_imag",
    "n_tokens",
)


class Record:
    """Mixin: ``to_dict()`` of a dataclass, field by field (nested records stay objects; the JSON
    serialiser :func:`oversmooth.simulator.output.to_json` converts them through their own ``to_dict``)."""

    def to_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True)
class DominanceCase(Record):
    """The dominating eigenvalue ``μ = 1 + λ^H λ^A`` of ``I + H_h ⊗ A`` for one (input, block, head).

    ``kind`` is ``"perron"`` (μ uses the Perron root of A: smoothing), ``"non-perron"``,
    ``"balanced"`` (tied dominating modes in both A and H; counted as non-perron too) or
    ``"contracting"`` (the head's H alone rules out perron kind: its null space ties every row of
    A at |μ| = 1 and no non-zero ``|1 + λ^H|`` exceeds it; docs/theory.md §6.10). A contracting
    case has no mode: μ, λ^A and λ^H are NaN.
    """

    input: int
    block: int
    head: int
    kind: str
    mu: complex
    lambda_a: complex
    lambda_h: complex
    n_tokens: int

    def row(self) -> tuple[Any, ...]:
        """The ``dominance.csv`` row, in :data:`DOMINANCE_COLUMNS` order."""
        return (
            self.input,
            self.block,
            self.head,
            self.kind,
            self.mu.real,
            self.mu.imag,
            abs(self.mu),
            self.lambda_a.real,
            self.lambda_a.imag,
            self.lambda_h.real,
            self.lambda_h.imag,
            self.n_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(zip(DOMINANCE_COLUMNS, self.row(), strict=True))


#: Columns of ``operator.csv``: one row per (input, block).
OPERATOR_COLUMNS = (
    "input",
    "block",
    "kind",
    "rho_lfc",
    "rho_quotient",
    "eigenvalue_real",
    "eigenvalue_imag",
    "iterations",
    "n_tokens",
)


@dataclass(frozen=True)
class OperatorCase(Record):
    """The dominating eigenvalue of one block's whole operator on one input.

    ``kind`` is ``"perron"`` when ``rho_lfc`` (the low-frequency subspace, ``1 + eig(Σ_h M_h)``)
    exceeds ``rho_quotient`` (the rest of T) beyond the tie tolerance, ``"non-perron"`` the other
    way round, ``"balanced"`` within it; ``eigenvalue`` dominates the winning side.
    """

    input: int
    block: int
    kind: str
    rho_lfc: float
    rho_quotient: float
    eigenvalue: complex
    iterations: int
    n_tokens: int

    def row(self) -> tuple[Any, ...]:
        """The ``operator.csv`` row, in :data:`OPERATOR_COLUMNS` order."""
        return (
            self.input,
            self.block,
            self.kind,
            self.rho_lfc,
            self.rho_quotient,
            self.eigenvalue.real,
            self.eigenvalue.imag,
            self.iterations,
            self.n_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(zip(OPERATOR_COLUMNS, self.row(), strict=True))


#: Columns of ``heads.csv``: one row per (block, head) (docs/theory.md §6.11).
HEAD_COLUMNS = (
    "block",
    "head",
    "sigma_max_over_rho",
    "asymmetry",
    "lambda2_mean",
    "lambda2_std",
    "growth",
    "cases",
)
#: Columns of ``depth.csv``: one row per block (docs/theory.md §6.11).
DEPTH_COLUMNS = (
    "block",
    "predicted_growth",
    "operator_growth",
    "measured_growth",
    "predicted_hfc_lfc",
    "operator_hfc_lfc",
    "measured_hfc_lfc",
    "lambda2_mean",
    "norm_scale",
    "inverse_scale_mean",
    "bias_norm",
    "bias_ratio",
)


@dataclass(frozen=True)
class HeadCase(Record):
    """One (input, block, head) of the depth step: A's second eigenvalue modulus and the two
    spectral radii of ``I + H_h ⊗ A`` split by the low-frequency subspace (Lemma 1).

    ``lambda2`` is ``|λ₂(A)|`` (:func:`oversmooth.simulator.depth.second_eigenvalue_modulus`);
    ``rho_lfc = max_j |1 + λ^H_j|`` and ``rho_quotient = max |1 + λ^H_j λ_i|`` over A's other
    eigenvalues (:func:`oversmooth.simulator.depth.head_growth`), with the H eigenvalues of the dominance
    step; their ratio is the head's predicted growth of HFC/LFC per layer.
    """

    input: int
    block: int
    head: int
    n_tokens: int
    lambda2: float
    rho_lfc: float
    rho_quotient: float

    @property
    def growth(self) -> float:
        """``rho_quotient / rho_lfc`` (inf when only rho_lfc is 0, NaN when both are)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.float64(self.rho_quotient) / np.float64(self.rho_lfc))


@dataclass(frozen=True)
class HeadDepth(Record):
    """One head: its value product's non-normality and its attention's spectrum over inputs.

    ``sigma_max_over_rho`` and ``asymmetry`` are those of the head's ``M_h`` as the dominance step
    uses it (effective or stored: :func:`oversmooth.simulator.depth.nonnormality`); ``lambda2_mean`` and
    ``lambda2_std`` are over the ``cases`` inputs of the depth step, ``growth`` the geometric
    mean of the head's ``rho_quotient / rho_lfc`` over them (NaN without cases).
    """

    block: int
    head: int
    sigma_max_over_rho: float
    asymmetry: float
    lambda2_mean: float
    lambda2_std: float
    growth: float
    cases: int

    def row(self) -> tuple[Any, ...]:
        """The ``heads.csv`` row, in :data:`HEAD_COLUMNS` order."""
        return tuple(getattr(self, name) for name in HEAD_COLUMNS)


@dataclass(frozen=True)
class DepthBlock(Record):
    """One block of the depth step: its predicted and measured growth of HFC/LFC, and the terms
    the effective H leaves out (docs/theory.md §6.11).

    ``predicted_growth``: the geometric mean of its heads' ``rho_quotient / rho_lfc`` over the
    depth step's (input, head) cases; ``operator_growth``: the same of the whole operator's
    ``rho_quotient / rho_lfc`` over its (input) cases (``--dominance operator``; else NaN);
    ``measured_growth``: ``hfc_lfc[block + 1] / hfc_lfc[block]`` of the layer means.
    ``*_hfc_lfc``: the measured HFC/LFC at layer 0 times the product of the predicted growths up
    to this block (the predicted value at layer ``block + 1``), and the measured one there.
    ``lambda2_mean``: mean ``|λ₂(A_h)|`` over the block's cases. ``norm_scale`` names the
    per-token scale (``1/sigma`` of a pre-LayerNorm, ``1/rms`` of a pre-RMSNorm, or why it does
    not apply); ``inverse_scale_mean`` its mean over tokens and inputs. ``bias_norm`` is ‖c‖, c the
    constant row the branch adds, ``bias_ratio`` the mean over inputs of ‖c‖ / ‖x̄‖, x̄ the mean
    token of the stream the block's attention reads (layer ``block``, or the stream after the
    sub-layers that come before the attention inside the layer: a Conformer's).
    """

    block: int
    predicted_growth: float
    operator_growth: float
    measured_growth: float
    predicted_hfc_lfc: float
    operator_hfc_lfc: float
    measured_hfc_lfc: float
    lambda2_mean: float
    norm_scale: str
    inverse_scale_mean: float
    bias_norm: float
    bias_ratio: float

    def row(self) -> tuple[Any, ...]:
        """The ``depth.csv`` row, in :data:`DEPTH_COLUMNS` order."""
        return tuple(getattr(self, name) for name in DEPTH_COLUMNS)


@dataclass(frozen=True)
class DepthSummary(Record):
    """What the theory predicts over depth against what was measured, and the heads behind it.

    ``inputs``: the inputs of the depth step's attention spectra (the first ``depth_inputs``);
    ``start``: the measured mean HFC/LFC at layer 0, where both curves start; ``agreement``:
    per block, predicted growth > 1 against measured growth > 1 (blocks with a ratio of exactly
    1 or undefined left out), with its chance level (:class:`Agreement`);
    ``operator_agreement`` the same for the whole operator's growth (None without it).
    """

    definition: str
    inputs: int
    start: float
    per_block: tuple[DepthBlock, ...]
    heads: tuple[HeadDepth, ...]
    agreement: Agreement | None
    operator_agreement: Agreement | None


@dataclass(frozen=True)
class BlockVerdict(Record):
    """One attention block: its dominance fractions against what it did to the stream.

    ``block`` is the block's index: it maps layer ``block`` to layer ``block + 1``. Predicted: smoothing
    when more than half of its cases are perron-type, "no smoothing" when fewer, "tie" at exactly
    half. Observed: smoothing when the mean HFC/LFC falls
    (``hfc_lfc_ratio`` < 1) and the mean cosine rises, "no smoothing" when both move the other way,
    else "mixed" (``agree`` is None after a tie or a mixed change). ``part`` says over what the change is measured: ``attention``
    (layer ``block`` to the stream right after the attention sublayer, what the theory covers) where
    that stream was measured, else ``block`` (to layer ``block + 1``, attention and MLP together);
    ``mlp_hfc_lfc_ratio`` and ``mlp_cosine_change`` are the rest of the block (NaN for ``block``).
    The theory is for repeated linear layers: a heuristic reading.
    """

    block: int
    part: str
    cases: int
    perron: float
    non_perron: float
    balanced: float
    contracting: float
    hfc_lfc_ratio: float
    cosine_change: float
    predicted: str
    observed: str
    agree: bool | None
    mlp_hfc_lfc_ratio: float
    mlp_cosine_change: float


@dataclass(frozen=True)
class Agreement(Record):
    """How often the blocks' predicted and observed directions agree, against chance.

    Over the ``decided`` blocks (neither a predicted tie nor a mixed observation), ``agree`` of
    them agree. ``expected`` is the mean agreement count when the observed directions are
    shuffled among those blocks (margins fixed: as many blocks predicted and observed smoothing as
    measured), ``p_value`` the chance of at least ``agree`` agreements under that shuffle (exact,
    hypergeometric: the agreement count is ``2X + decided − predicted − observed`` with X the
    blocks predicted and observed smoothing).
    """

    agree: int
    decided: int
    expected: float
    p_value: float

    @classmethod
    def of(cls, verdicts: Sequence[BlockVerdict]) -> Agreement | None:
        """The agreement of ``verdicts``; None when no block is decided."""
        return cls.of_pairs(
            [
                (v.predicted == "smoothing", v.observed == "smoothing")
                for v in verdicts
                if v.agree is not None
            ]
        )

    @classmethod
    def of_pairs(cls, pairs: Sequence[tuple[bool, bool]]) -> Agreement | None:
        """The agreement of decided blocks given as (predicted, observed) directions (True: the
        one direction, e.g. smoothing, or HFC/LFC growing); None when there are none."""
        decided = list(pairs)
        if not decided:
            return None
        m = len(decided)
        predicted = sum(bool(p) for p, _ in decided)
        observed = sum(bool(o) for _, o in decided)
        agree = sum(bool(p) == bool(o) for p, o in decided)
        # X, the blocks predicted and observed smoothing, is hypergeometric under the shuffle
        expected = 2 * predicted * observed / m + m - predicted - observed
        # agree >= k  <=>  X >= (k - m + predicted + observed) / 2
        threshold = math.ceil((agree - m + predicted + observed) / 2)
        tail = sum(
            math.comb(observed, x) * math.comb(m - observed, predicted - x)
            for x in range(max(threshold, 0), min(observed, predicted) + 1)
        )
        return cls(agree, m, expected, tail / math.comb(m, predicted))


@dataclass(frozen=True)
class DominanceSummary(Record):
    """Fractions of perron / non-perron (balanced among them) / contracting cases overall (None
    without cases) and per block; perron, non-perron and contracting add up to 1.

    ``inputs`` is how many of the audit's first inputs the cases come from, ``rule`` how that
    number was chosen (``--dominance-inputs``: a number, ``all`` or ``auto``) and
    ``interval_width`` the widest 95 % bootstrap interval over inputs of the four shares there
    (:mod:`oversmooth.importers.audit.dominance_inputs`; None where not computed)."""

    cases: int
    perron: float | None
    non_perron: float | None
    balanced: float | None
    contracting: float | None
    per_block: tuple[BlockVerdict, ...]
    agreement: Agreement | None = None
    operator: OperatorSummary | None = None
    inputs: int | None = None
    rule: str | None = None
    interval_width: float | None = None


@dataclass(frozen=True)
class OperatorBlock(Record):
    """One block's exact operator dominance against the per-head rule, on the same inputs.

    ``agreement`` is the share of its (input, block) cases where the operator's kind (perron or
    not) equals the per-head rule's: perron when at least half the block's heads are.
    """

    block: int
    cases: int
    perron: float
    per_head_perron: float
    agreement: float


@dataclass(frozen=True)
class OperatorSummary(Record):
    """The exact operator dominance over its (input, block) cases, overall and per block.

    ``agreement`` is the share of cases where the per-head majority rule gives the operator's
    perron-or-not; ``agreement_test`` the same count against chance (:class:`Agreement`: the
    expectation when one side is shuffled with the margins fixed, and the exact p-value).
    """

    inputs: int
    cases: int
    perron: float
    non_perron: float
    balanced: float
    agreement: float
    per_block: tuple[OperatorBlock, ...]
    agreement_test: Agreement | None = None


def operator_summary(
    operator: Sequence[OperatorCase], dominance: Sequence[DominanceCase]
) -> OperatorSummary | None:
    """Fractions of the operator cases and their agreement with the per-head majority rule."""
    if not operator:
        return None
    heads: dict[tuple[int, int], list[bool]] = {}
    for case in dominance:
        heads.setdefault((case.input, case.block), []).append(case.kind == "perron")
    exact = np.array([case.kind == "perron" for case in operator])
    majority = np.array([np.mean(heads[case.input, case.block]) >= 0.5 for case in operator])
    blocks = np.array([case.block for case in operator])
    kinds = np.array([case.kind for case in operator])
    per_block = tuple(
        OperatorBlock(
            block=int(block),
            cases=int(np.sum(blocks == block)),
            perron=float(np.mean(exact[blocks == block])),
            per_head_perron=float(np.mean(majority[blocks == block])),
            agreement=float(np.mean(exact[blocks == block] == majority[blocks == block])),
        )
        for block in np.unique(blocks)
    )
    return OperatorSummary(
        inputs=len({case.input for case in operator}),
        cases=len(operator),
        perron=float(np.mean(exact)),
        non_perron=float(1.0 - np.mean(exact)),
        balanced=float(np.mean(kinds == "balanced")),
        agreement=float(np.mean(exact == majority)),
        per_block=per_block,
        agreement_test=Agreement.of_pairs(
            list(zip(majority.tolist(), exact.tolist(), strict=True))
        ),
    )


def kind_fractions(kinds: np.ndarray) -> tuple[float, float, float, float]:
    """(perron, non-perron with balanced, balanced, contracting) shares of ``kinds``."""
    perron = float(np.mean(kinds == "perron"))
    non_perron = float(np.mean((kinds == "non-perron") | (kinds == "balanced")))
    contracting = float(np.mean(kinds == "contracting"))
    return perron, non_perron, float(np.mean(kinds == "balanced")), contracting


def _change(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """(HFC/LFC after / before, cosine after − before) of two stream positions' mean metrics."""
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero or NaN mean gives no verdict
        ratio = np.float64(after["hfc_lfc"]) / np.float64(before["hfc_lfc"])
    return float(ratio), float(after["cosine"] - before["cosine"])


def block_verdict(
    block: int,
    kinds: np.ndarray,
    means: dict[tuple[int, str], float],
    attention: dict[tuple[int, str], float],
) -> BlockVerdict:
    perron, non_perron, balanced, contracting = kind_fractions(kinds)
    at = {metric: means[block, metric] for metric in ("hfc_lfc", "cosine")}
    out = {metric: means[block + 1, metric] for metric in ("hfc_lfc", "cosine")}
    mid = {metric: attention.get((block, metric), np.nan) for metric in ("hfc_lfc", "cosine")}
    measured = bool(np.isfinite(mid["hfc_lfc"]) and np.isfinite(mid["cosine"]))
    ratio, cosine = _change(at, mid if measured else out)
    mlp_ratio, mlp_cosine = _change(mid, out) if measured else (np.nan, np.nan)
    predicted = "tie" if perron == 0.5 else ("smoothing" if perron > 0.5 else "no smoothing")
    if ratio < 1 and cosine > 0:
        observed = "smoothing"
    elif ratio > 1 and cosine < 0:
        observed = "no smoothing"
    else:
        observed = "mixed"
    return BlockVerdict(
        block=block,
        part="attention" if measured else "block",
        cases=int(kinds.size),
        perron=perron,
        non_perron=non_perron,
        balanced=balanced,
        contracting=contracting,
        hfc_lfc_ratio=float(ratio),
        cosine_change=float(cosine),
        predicted=predicted,
        observed=observed,
        agree=None if observed == "mixed" or predicted == "tie" else predicted == observed,
        mlp_hfc_lfc_ratio=float(mlp_ratio),
        mlp_cosine_change=float(mlp_cosine),
    )
