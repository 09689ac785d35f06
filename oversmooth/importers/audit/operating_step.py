"""The audit's operating point and attribution: each block's attention sublayer rebuilt on its input.

For the first ``inputs`` inputs (``--operator-inputs``) the session returns every layer tensor
whole (:attr:`~oversmooth.importers.runtime.reductions.ReductionPlan.token_rows`); with the attention the
dominance step already has, each (input, block) gives:

- the **attribution** (default): the sublayer rebuilt on the same X and A with parts removed —
  the effective-H operator alone, with the norm's per-token scale D, with the bias row c — and
  the block's observed change of HFC/LFC and of the cosine split among them, the post-LN norm,
  the reconstruction residual against the graph's own tensor and the MLP
  (:mod:`oversmooth.simulator.attribution`; docs/theory.md §6.12);
- the **operating point** (``dominance="operating"``): the frozen operator
  ``T_D(X) = X + Σ_h A_h D X M_h`` classified by where its dominating eigenvector lies against
  the low-frequency subspace, and what repeating it does to the input's HFC/LFC
  (:mod:`oversmooth.simulator.operating`).

D is the pre-norm's ``1/σ_t`` (LayerNorm) or ``1/rms_t`` (RMSNorm) of the block's input, computed
here from the returned layer with the norm's own epsilon (the formula of the in-graph mean,
:mod:`oversmooth.importers.runtime.reductions`); post-LN and norm-free blocks have D = I.

Public API
----------
BlockTerms, block_terms
    Per block what the rebuilt sublayer needs besides X and A.
OperatingPlan
    The blocks' terms, the inputs, whether to classify the operating point, where the layers are.
OperatingCase, AttributionCase
    One (input, block) of ``operating.csv``; one (input, block, part) of ``attribution.csv``.
sublayer_cases
    Both kinds of case for one batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oversmooth.importers.audit.depth import bias_rows
from oversmooth.importers.audit.dominance import DominanceProblem
from oversmooth.importers.audit.operator_step import operator_factors
from oversmooth.importers.audit.records import Record
from oversmooth.importers.runtime.reductions import ReductionPlan
from oversmooth.importers.weights import BlockWeights
from oversmooth.simulator.attention import layer_norm, rms_norm
from oversmooth.simulator.attribution import PARTS, attribute, relative_residual, sublayer_states
from oversmooth.simulator.backend import to_numpy
from oversmooth.simulator.metrics import cosine, hfc_lfc
from oversmooth.simulator.operating import (
    operating_dominance,
    repetition_direction,
    token_inverse_scale,
)
from oversmooth.simulator.operator import HeadFactors

__all__ = [
    "ATTRIBUTION_COLUMNS",
    "OPERATING_COLUMNS",
    "AttributionCase",
    "BlockTerms",
    "OperatingCase",
    "OperatingPlan",
    "block_terms",
    "sublayer_cases",
    "sublayer_plan",
]

#: Columns of ``operating.csv``: one row per (input, block).
OPERATING_COLUMNS = (
    "input",
    "block",
    "scale",
    "mean_inverse_scale",
    "kind",
    "rho",
    "mu_real",
    "mu_imag",
    "hfc_share",
    "limit_low",
    "limit_high",
    "input_hfc_lfc",
    "direction",
    "dominating",
    "gap",
    "iterations",
    "n_tokens",
)
#: Columns of ``attribution.csv``: one row per (input, block, part).
ATTRIBUTION_COLUMNS = (
    "block",
    "input",
    "part",
    "delta_hfc_lfc",
    "delta_cosine",
    "sequential_hfc_lfc",
    "sequential_cosine",
    "reconstruction_residual",
)


@dataclass(frozen=True)
class BlockTerms:
    """What the rebuilt attention sublayer of one block needs besides X and A.

    Attributes
    ----------
    factors : HeadFactors
        The effective ``M_h`` per query head (centring, γ, W_V^h W_O^h, output scale).
    bias : (d,) ndarray
        The bias row c (:func:`~oversmooth.importers.audit.depth.bias_rows`).
    pre_scale : (kind, eps) or None
        The pre-norm whose per-token scale is D; None: D = I (post-LN, norm-free, unknown eps).
    post_norm : (kind, gamma, beta, eps) or None
        A post-LN block's norm after the residual add.
    """

    factors: HeadFactors
    bias: np.ndarray
    pre_scale: tuple[str, float] | None
    post_norm: tuple[str, np.ndarray | None, np.ndarray | None, float] | None

    @property
    def scale_label(self) -> str:
        """What D is for this block (the ``scale`` column)."""
        if self.pre_scale is not None:
            return "1/sigma" if self.pre_scale[0] == "layernorm" else "1/rms"
        return "identity (post-LN)" if self.post_norm is not None else "identity"


def block_terms(blocks: Sequence[BlockWeights]) -> tuple[BlockTerms, ...]:
    """Per block, its :class:`BlockTerms` (always the effective H: D and c are defined with it)."""
    rows = bias_rows(blocks) if blocks else np.zeros((0, 0))
    terms = []
    for block, factors, bias in zip(
        blocks, operator_factors(blocks, "effective"), rows, strict=True
    ):
        known = block.eps is not None and block.norm_kind is not None
        pre = (str(block.norm_kind), float(block.eps)) if block.norm == "pre" and known else None  # type: ignore[arg-type]
        post = None
        if block.norm == "post" and known:
            post = (str(block.norm_kind), block.gamma, block.beta, float(block.eps))  # type: ignore[arg-type]
        terms.append(BlockTerms(factors, np.asarray(bias, np.float64), pre, post))
    return tuple(terms)


@dataclass(frozen=True)
class OperatingPlan:
    """What the batch work needs: per block its terms, the inputs (those numbered below
    ``inputs``), whether to classify the operating point, the layer plan and the position in it
    of every block's sublayer tensor (None: a parallel block, no attribution) and of the stream
    its attention reads (``reads``; empty: block b reads layer b)."""

    terms: tuple[BlockTerms, ...]
    inputs: int
    operating: bool
    plan: ReductionPlan
    sublayers: tuple[int | None, ...]
    tie_rtol: float
    reads: tuple[int, ...] = ()


def sublayer_plan(
    terms: Sequence[BlockTerms],
    inputs: int,
    operating: bool,
    plan: ReductionPlan,
    sublayers: Sequence[int],
    tie_rtol: float,
    reads: Sequence[int] = (),
) -> OperatingPlan | None:
    """The :class:`OperatingPlan` of a session whose ``plan`` returns whole layers, the blocks
    ``sublayers`` (in that order) having their sublayer tensor after the layers, block b's
    attention reading plan layer ``reads[b]``; None when there is nothing to do (no terms, no
    inputs, or a plan without the layers' rows)."""
    if not terms or inputs <= 0 or not plan.token_rows:
        return None
    where = {block: position for position, block in enumerate(sublayers)}
    positions = tuple(where.get(block) for block in range(len(terms)))
    return OperatingPlan(tuple(terms), inputs, operating, plan, positions, tie_rtol, tuple(reads))


@dataclass(frozen=True)
class OperatingCase(Record):
    """The operating-point operator of one block on one input (:mod:`oversmooth.simulator.operating`)."""

    input: int
    block: int
    scale: str
    mean_inverse_scale: float
    kind: str
    rho: float
    eigenvalue: complex
    hfc_share: float
    limit_low: float
    limit_high: float
    input_hfc_lfc: float
    direction: str
    dominating: int
    gap: float
    iterations: int
    n_tokens: int

    def row(self) -> tuple[Any, ...]:
        """The ``operating.csv`` row, in :data:`OPERATING_COLUMNS` order."""
        values = {**vars(self), "mu_real": self.eigenvalue.real, "mu_imag": self.eigenvalue.imag}
        return tuple(values[name] for name in OPERATING_COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        return dict(zip(OPERATING_COLUMNS, self.row(), strict=True))


@dataclass(frozen=True)
class AttributionCase(Record):
    """One part of one block's observed change on one input (:mod:`oversmooth.simulator.attribution`)."""

    block: int
    input: int
    part: str
    delta_hfc_lfc: float
    delta_cosine: float
    sequential_hfc_lfc: float
    sequential_cosine: float
    reconstruction_residual: float

    def row(self) -> tuple[Any, ...]:
        """The ``attribution.csv`` row, in :data:`ATTRIBUTION_COLUMNS` order."""
        return tuple(getattr(self, name) for name in ATTRIBUTION_COLUMNS)


def _post_norm(terms: BlockTerms, Z: np.ndarray) -> np.ndarray:
    kind, gamma, beta, eps = terms.post_norm  # type: ignore[misc]
    if kind == "layernorm":
        return layer_norm(Z, gamma, beta, eps=eps)
    return rms_norm(Z, gamma, eps=eps) + (0.0 if beta is None else beta)


def _attribution(
    problem: DominanceProblem,
    terms: BlockTerms,
    A: np.ndarray,
    tensors: tuple[np.ndarray, np.ndarray, np.ndarray],
    scale: np.ndarray | None,
    counted: np.ndarray,
    layer: np.ndarray,
) -> list[AttributionCase]:
    """The parts of one (input, block): X, the graph's sublayer tensor and the block's output.

    ``layer`` is the block's input, X itself unless sub-layers come before the attention inside
    the layer (a Conformer's half-step FFN): their change joins the ``mlp`` part (every
    non-attention sub-layer of the block), so the parts still sum to the block's change.
    """
    X, graph, output = tensors
    states = sublayer_states(A, terms.factors, X, scale, terms.bias)
    named = {
        name: getattr(states, name) for name in ("x", "linear", "scaled", "linear_bias", "model")
    }
    rebuilt = states.model
    if terms.post_norm is not None:
        rebuilt = named["normed"] = _post_norm(terms, states.model)
    named |= {"graph": graph, "output": output}
    residual = relative_residual(graph, rebuilt)
    split = {
        f.__name__: _with_before(
            attribute({name: float(f(Z[counted])) for name, Z in named.items()}),
            float(f(X[counted]) - f(layer[counted])) if layer is not X else 0.0,
        )
        for f in (hfc_lfc, cosine)
    }
    return [
        AttributionCase(
            problem.layer,
            problem.item,
            part,
            *(split["hfc_lfc"][part][0], split["cosine"][part][0]),
            *(split["hfc_lfc"][part][1], split["cosine"][part][1]),
            residual,
        )
        for part in PARTS
    ]


def _with_before(
    split: dict[str, tuple[float, float]], before: float
) -> dict[str, tuple[float, float]]:
    """``split`` with ``before`` (the change of the sub-layers before the attention) added to
    its ``mlp`` part, in both columns."""
    shapley, sequential = split["mlp"]
    return split | {"mlp": (shapley + before, sequential + before)}


def _operating(
    problem: DominanceProblem,
    terms: BlockTerms,
    A: np.ndarray,
    X: np.ndarray,
    scale: np.ndarray | None,
    tie_rtol: float,
) -> OperatingCase:
    found = operating_dominance(A, terms.factors, scale, tie_rtol=tie_rtol)
    start = float(hfc_lfc(X))
    return OperatingCase(
        problem.item,
        problem.layer,
        terms.scale_label,
        float(scale.mean()) if scale is not None else 1.0,
        found.kind,
        found.rho,
        found.eigenvalue,
        found.hfc_share,
        found.limit_low,
        found.limit_high,
        start,
        repetition_direction(found.limit_low, found.limit_high, start, tie_rtol),
        found.dominating,
        found.gap,
        found.iterations,
        problem.n_tokens,
    )


def _rows(
    outputs: Mapping[str, Any], plan: ReductionPlan, layer: int, row: int, keep: np.ndarray
) -> np.ndarray:
    """Item ``row``'s real tokens of plan layer ``layer`` (float64, (n, d))."""
    return np.asarray(to_numpy(outputs[plan.tokens_name(layer)])[row], np.float64)[keep]


def sublayer_cases(
    problems: Sequence[DominanceProblem],
    outputs: Mapping[str, Any],
    plan: OperatingPlan,
    start: int,
) -> tuple[list[OperatingCase], list[AttributionCase]]:
    """The operating and attribution cases of one batch's problems below ``plan.inputs``.

    ``start`` numbers the batch's first item; the layer rows returned for it are the batch's
    first items, in order (:meth:`~oversmooth.importers.runtime.reductions.ReductionPlan.rows_feed`).
    """
    operating: list[OperatingCase] = []
    parts: list[AttributionCase] = []
    n_layers = len(plan.terms) + 1
    for problem in problems:
        if problem.item >= plan.inputs:
            continue
        row, b, terms = problem.item - start, problem.layer, plan.terms[problem.layer]
        keep = np.asarray(problem.token_mask, dtype=bool)
        A = np.asarray(to_numpy(problem.attention()), np.float64)
        source = plan.reads[b] if plan.reads else b  # the stream the attention reads
        X = _rows(outputs, plan.plan, source, row, keep)
        scale = token_inverse_scale(X, *terms.pre_scale) if terms.pre_scale else None  # type: ignore[arg-type]
        if plan.operating:
            operating.append(_operating(problem, terms, A, X, scale, plan.tie_rtol))
        mid = plan.sublayers[b]
        if mid is None:
            continue
        counted = np.flatnonzero(keep) >= plan.plan.prefix  # the metrics' tokens among the real
        tensors = (
            X,
            _rows(outputs, plan.plan, n_layers + mid, row, keep),
            _rows(outputs, plan.plan, b + 1, row, keep),
        )
        layer = _rows(outputs, plan.plan, b, row, keep) if source != b else X
        parts += _attribution(problem, terms, A, tensors, scale, counted, layer)
    return operating, parts
