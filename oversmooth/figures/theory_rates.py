"""Predicted against simulated convergence rates of HFC/LFC under Perron-type dominance.

Claim (S2, S9, claim 12): when the Perron-type eigenvalue 1 + λ^H_d dominates, log(HFC/LFC) decays with
slope log ρ, ρ = max_{i≠n, j} |μ_ij| / (1 + λ^H_d), computed from eig(A) and eig(H) alone. Each point is
one random system (symmetric-score A, symmetric H with positive spectrum) whose next non-Perron mode is
well separated (|μ_(3)| / |μ_(2)| < 0.9), iterated with the linear rule; the slope is fitted over the
second half of the layers that stay above 1e-11 (before the float64 floor).

Run: ``python -m oversmooth.figures.theory_rates [--quick] --out DIR``.

CSV columns: ``system,n,d,predicted_log_rate,fitted_log_rate,relative_error``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from oversmooth.figures._common import new_figure, run_script
from oversmooth.simulator import spectra
from oversmooth.simulator.dynamics import fit_rate, iterate
from oversmooth.simulator.theory import kron_eigenvalues, perron_index, predict
from oversmooth.simulator.updates import LinearRule

NAME = "theory_rates"
SEED = 12
FULL = {"systems": 60, "layers": 400}
QUICK = {"systems": 8, "layers": 200}
SEPARATION = 0.9
FIT_FLOOR = 1e-11
COLUMNS = ("system", "n", "d", "predicted_log_rate", "fitted_log_rate", "relative_error")


def _separated(A: np.ndarray, H: np.ndarray) -> bool:
    lam_A = np.linalg.eigvals(A)
    mu = np.abs(kron_eigenvalues(lam_A, np.linalg.eigvals(H)))
    others = np.sort(np.delete(mu, perron_index(lam_A), axis=0).ravel())[::-1]
    return others[1] / others[0] < SEPARATION


def _fitted(A: np.ndarray, H: np.ndarray, X0: np.ndarray, layers: int) -> float:
    ratio = iterate(
        LinearRule(A, H.T, np.eye(H.shape[0])), X0, layers, metrics=("hfc_lfc",), floor=None
    )
    values = ratio.metrics["hfc_lfc"]
    above = np.flatnonzero(values > FIT_FLOOR)
    window = above[above >= above[-1] // 2]  # the second half of the layers above the floor
    return float(np.log(fit_rate(values[window], window)))


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Draw separated Perron-dominated systems and compare fitted with predicted log-rates."""
    size = QUICK if quick else FULL
    rng = np.random.default_rng(SEED)
    rows: list[dict[str, Any]] = []
    while len(rows) < size["systems"]:
        n, d = int(rng.integers(4, 17)), int(rng.integers(2, 9))
        A = spectra.attention_symmetric_scores(n, scale=float(rng.uniform(0.5, 1.5)), rng=rng)
        H = spectra.h_symmetric(rng.uniform(0.05, 1.0, d), rng=rng)
        if not _separated(A, H):
            continue
        predicted = float(np.log(predict(A, H).rate))
        fitted = _fitted(A, H, spectra.random_tokens(n, d, rng=rng), size["layers"])
        rows.append(
            {
                "system": len(rows),
                "n": n,
                "d": d,
                "predicted_log_rate": predicted,
                "fitted_log_rate": fitted,
                "relative_error": abs(fitted - predicted) / abs(predicted),
            }
        )
    return rows, {"seed": SEED, **size, "separation": SEPARATION, "fit_floor": FIT_FLOOR}


def plot(rows: list[dict[str, Any]]):
    """Fitted against predicted log ρ with the identity line."""
    fig, ax = new_figure("column", 0.85)
    predicted = [float(r["predicted_log_rate"]) for r in rows]
    fitted = [float(r["fitted_log_rate"]) for r in rows]
    lo = min(predicted + fitted)
    ax.plot([lo, 0], [lo, 0], color="0.6", lw=0.8, label="identity")
    ax.plot(predicted, fitted, "o", label="random systems")
    ax.set_xlabel(r"predicted $\log\rho$ (from eig(A), eig(H))")
    ax.set_ylabel(r"fitted slope of $\log$ HFC/LFC")
    median = float(np.median([float(r["relative_error"]) for r in rows]))
    ax.set_title(f"median relative error {median:.1e}")
    ax.legend()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
