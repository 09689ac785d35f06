"""The audit's depth step: what the theory predicts over depth, and the terms it leaves out.

Per (input, block, head) of the first ``depth_inputs`` inputs, the head's attention spectrum
(:func:`head_cases`: ``|λ₂(A_h)|`` and the two spectral radii of ``I + H_h ⊗ A_h``, from one
eigensolve of the (n−1)×(n−1) quotient of A by 𝟙); per head, the non-normality of its value
product ``M_h`` as the dominance step uses it; per block, the predicted growth of HFC/LFC against
the measured one and its product over depth, the pre-norm's mean per-token scale and the bias row
c against the mean token. Definitions: docs/theory.md §6.11; the mathematics:
:mod:`oversmooth.simulator.depth`.

Public API
----------
head_cases
    The depth step's cases of one batch's (input, block) problems.
bias_rows
    Per block, the constant row c the attention branch adds to every token.
depth_summary
    The :class:`~oversmooth.importers.audit.records.DepthSummary` of an audit result.
DEPTH_DEFINITION
    What ``audit.json`` → ``depth`` holds, in one sentence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oversmooth.importers.audit.dominance import DominanceProblem
from oversmooth.importers.audit.operator_step import operator_factors
from oversmooth.importers.audit.records import (
    Agreement,
    AuditResult,
    DepthBlock,
    DepthSummary,
    HeadCase,
    HeadDepth,
)
from oversmooth.importers.value_spectra import HChoice
from oversmooth.importers.weights import BlockWeights
from oversmooth.simulator.backend import to_numpy
from oversmooth.simulator.depth import (
    geometric_mean,
    head_growth,
    nonnormality,
    predicted_curve,
    quotient_spectrum,
)

__all__ = ["DEPTH_DEFINITION", "bias_rows", "depth_summary", "head_cases"]

#: What ``audit.json`` → ``depth`` means (docs/theory.md §6.11).
DEPTH_DEFINITION = (
    "per block: predicted growth of HFC/LFC per layer = geometric mean over its (input, head) "
    "cases of rho_quotient/rho_lfc of I + H_h (x) A_h (Lemma 1; the operator's own ratio with "
    "--dominance operator), its product over depth from the measured layer-0 HFC/LFC against the "
    "measured curve (measured growth = hfc_lfc[l+1]/hfc_lfc[l]); per head: |lambda_2(A_h)| and "
    "sigma_max(M_h)/rho(M_h), ||M_h - M_h^T||_F/||M_h||_F of the H the dominance step uses; per "
    "block: the pre-norm's mean per-token 1/sigma (LayerNorm) or 1/rms (RMSNorm), and ||c||/||x_bar||"
    " with c = ((beta W_V + b_V) W_O + b_O) * s the branch's constant row and x_bar the mean token "
    "of the block's input"
)


def head_cases(problems: Sequence[DominanceProblem], inputs: int) -> list[HeadCase]:
    """The depth cases of ``problems`` whose input is among the first ``inputs``, in order.

    Each (input, block) problem's attention (real tokens, rows renormalised: on the host, copied
    from a GPU for these few inputs) gives per head the quotient spectrum of A
    (:func:`oversmooth.simulator.depth.quotient_spectrum`, one (n−1)×(n−1) eigensolve), its largest modulus
    ``|λ₂|`` and, with the head's H eigenvalues of the dominance step, the two radii of
    ``I + H_h ⊗ A_h`` (:func:`oversmooth.simulator.depth.head_growth`).
    """
    cases = []
    for problem in problems:
        if problem.item >= inputs:
            continue
        rest = quotient_spectrum(to_numpy(problem.attention()))  # (heads, n − 1)
        lambda2 = np.abs(rest).max(axis=-1) if rest.shape[-1] else np.full(len(rest), np.nan)
        rho_lfc, rho_q = head_growth(rest, problem.eig_H)
        cases += [
            HeadCase(
                problem.item,
                problem.layer,
                head,
                problem.n_tokens,
                float(lambda2[head]),
                float(rho_lfc[head]),
                float(rho_q[head]),
            )
            for head in range(len(rest))
        ]
    return cases


def bias_rows(blocks: Sequence[BlockWeights]) -> np.ndarray:
    """(n_blocks, d) float64: per block, ``c = ((β W_V + b_V) W_O + b_O) ⊙ s``.

    The attention branch adds ``A (LN(X) W_V + b_V) W_O + b_O`` (times s) to the stream; with
    ``LN(x) = γ ⊙ (x − x̄)/σ + β`` the β and the biases give one row that a row-stochastic A
    passes to every token unchanged (``A 𝟙 cᵀ = 𝟙 cᵀ``): c. β is the pre-norm's (zero without
    one: a post-LN norm acts after the residual add, outside the branch), s the branch's output
    scale (LayerScale or a constant multiplier, :meth:`BlockWeights.h_factors`); key/value heads
    are expanded to their query heads. All blocks must share d (as they do in one model).
    """
    rows = []
    for block in blocks:
        width = block.n_heads * block.d_head
        value = np.zeros(width)
        if block.norm == "pre" and block.beta is not None:
            value = value + block.beta @ block.expanded_W_V()
        if block.b_V is not None:
            heads = [head // block.kv_group for head in range(block.n_heads)]
            d = block.d_head
            value = value + np.concatenate([block.b_V[kv * d : (kv + 1) * d] for kv in heads])
        row = value @ block.W_O + (block.b_O if block.b_O is not None else 0.0)
        rows.append(row * block.h_factors()["h_scale_out"])
    return np.asarray(rows, dtype=np.float64)


def _norm_scale(block: BlockWeights) -> str:
    """What the block's per-token scale is, or why it does not apply."""
    if block.norm != "pre":
        return f"not applicable ({block.norm}-norm block)"
    if block.eps is None or block.norm_kind is None:
        return "not measured (the norm's epsilon is unknown)"
    return "1/sigma (LayerNorm)" if block.norm_kind == "layernorm" else "1/rms (RMSNorm)"


def _heads(
    blocks: Sequence[BlockWeights], h: HChoice, cases: Sequence[HeadCase]
) -> tuple[HeadDepth, ...]:
    by_head: dict[tuple[int, int], list[HeadCase]] = {}
    for case in cases:
        by_head.setdefault((case.block, case.head), []).append(case)
    rows = []
    for index, factors in enumerate(operator_factors(blocks, h)):
        ratio, asymmetry = nonnormality(factors.W_V, factors.W_O)
        for head in range(len(ratio)):
            found = by_head.get((index, head), [])
            lambda2 = np.array([case.lambda2 for case in found])
            rows.append(
                HeadDepth(
                    block=index,
                    head=head,
                    sigma_max_over_rho=float(ratio[head]),
                    asymmetry=float(asymmetry[head]),
                    lambda2_mean=float(np.nanmean(lambda2)) if found else float("nan"),
                    lambda2_std=float(np.nanstd(lambda2)) if found else float("nan"),
                    growth=geometric_mean([case.growth for case in found]),
                    cases=len(found),
                )
            )
    return tuple(rows)


def _agreement(predicted: np.ndarray, measured: np.ndarray) -> Agreement | None:
    """Predicted growth > 1 against measured growth > 1 over the blocks where both are decided."""
    decided = np.isfinite(predicted) & np.isfinite(measured) & (predicted != 1) & (measured != 1)
    pairs = [
        (bool(p > 1), bool(m > 1))
        for p, m in zip(predicted[decided], measured[decided], strict=True)
    ]
    return Agreement.of_pairs(pairs)


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def depth_summary(result: AuditResult) -> DepthSummary:
    """Per block and head, the depth step of ``result`` (docs/theory.md §6.11).

    Needs ``result.blocks`` with their weights; the attention cases come from
    ``result.heads`` and ``result.operator`` (either may be empty: their columns are then NaN),
    the measured curve from the layer means, the stream terms from ``result.stream``.
    """
    blocks = result.blocks
    n_blocks = len(blocks)
    means = {row["layer"]: row["mean"] for row in result.layer_rows() if row["metric"] == "hfc_lfc"}
    measured_curve = np.array([means[layer] for layer in range(n_blocks + 1)], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        measured = measured_curve[1:] / measured_curve[:-1]
    per_head: dict[int, list[float]] = {}
    lambda2: dict[int, list[float]] = {}
    for case in result.heads:
        per_head.setdefault(case.block, []).append(case.growth)
        lambda2.setdefault(case.block, []).append(case.lambda2)
    whole: dict[int, list[float]] = {}
    for exact in result.operator:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.float64(exact.rho_quotient) / np.float64(exact.rho_lfc)
        whole.setdefault(exact.block, []).append(float(ratio))
    predicted = np.array([geometric_mean(per_head.get(b, [])) for b in range(n_blocks)])
    operator = np.array([geometric_mean(whole.get(b, [])) for b in range(n_blocks)])
    start = float(measured_curve[0])
    curve, operator_curve = predicted_curve(start, predicted), predicted_curve(start, operator)
    c_norm = np.linalg.norm(bias_rows(blocks), axis=-1) if blocks else np.zeros(0)
    nan = np.full((result.inputs.n_inputs, n_blocks + 1), np.nan)
    mean_norm = result.stream.get("mean_norm", nan)
    inverse_scale = result.stream.get("inverse_scale", nan)
    rows = []
    for b, block in enumerate(blocks):
        with np.errstate(divide="ignore", invalid="ignore"):
            bias_ratio = c_norm[b] / mean_norm[:, b]
        rows.append(
            DepthBlock(
                block=b,
                predicted_growth=float(predicted[b]),
                operator_growth=float(operator[b]),
                measured_growth=float(measured[b]),
                predicted_hfc_lfc=float(curve[b + 1]),
                operator_hfc_lfc=float(operator_curve[b + 1]),
                measured_hfc_lfc=float(measured_curve[b + 1]),
                lambda2_mean=_mean(np.array(lambda2.get(b, []), dtype=np.float64)),
                norm_scale=_norm_scale(block),
                inverse_scale_mean=_mean(inverse_scale[:, b]),
                bias_norm=float(c_norm[b]),
                bias_ratio=_mean(bias_ratio),
            )
        )
    return DepthSummary(
        definition=DEPTH_DEFINITION,
        inputs=len({case.input for case in result.heads}),
        start=start,
        per_block=tuple(rows),
        heads=_heads(
            blocks, "stored" if result.config.h == "stored" else "effective", result.heads
        ),
        agreement=_agreement(predicted, measured),
        operator_agreement=_agreement(operator, measured) if result.operator else None,
    )
