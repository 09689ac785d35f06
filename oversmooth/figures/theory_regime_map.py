"""Regime map: which eigenvalue of I + H⊗A dominates, over λ^H and the smallest eigenvalue λ^A_1 of A.

Claim (S1, S5, S6; docs/theory.md §3.2): by the corner theorem only 1 + λ^H (Perron type, smoothing) and
1 + λ^H λ^A_1 (non-Perron type) can dominate. Every λ^H in [-1, 0) gives non-Perron dominance whatever
λ^A_1 (S5); every λ^H > 0 gives Perron dominance (S6); below -1 Perron dominance returns (claim 11).
Computed with the Kronecker-free theory (simulator.theory.dominance_kinds), for A with spectrum
{λ^A_1, 1} and one H eigenvalue; the colour is the kind, the shade log10 of the rate ρ.

Run: ``python -m oversmooth.figures.theory_regime_map [--quick] --out DIR``.

CSV columns: ``lambda_h,lambda_a1,kind,modulus_perron,modulus_non_perron``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.colors import ListedColormap

from oversmooth.figures._common import new_figure, run_script
from oversmooth.simulator.theory import KINDS, dominance_kinds

NAME = "theory_regime_map"
LAMBDA_H = (-3.0, 2.0)
LAMBDA_A1 = (-0.99, 0.99)
FULL_GRID, QUICK_GRID = 101, 41
COLUMNS = ("lambda_h", "lambda_a1", "kind", "modulus_perron", "modulus_non_perron")


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Dominating kind on a grid of (λ^H, λ^A_1)."""
    size = QUICK_GRID if quick else FULL_GRID
    lam_h = np.linspace(*LAMBDA_H, size)
    lam_a1 = np.linspace(*LAMBDA_A1, size)
    LH, LA = np.meshgrid(lam_h, lam_a1, indexing="xy")
    eig_A = np.stack([LA, np.ones_like(LA)], axis=-1)
    kinds = dominance_kinds(eig_A, LH[..., None])
    rows = [
        {
            "lambda_h": float(LH[i, j]),
            "lambda_a1": float(LA[i, j]),
            "kind": KINDS[kinds[i, j]],
            "modulus_perron": float(abs(1 + LH[i, j])),
            "modulus_non_perron": float(abs(1 + LH[i, j] * LA[i, j])),
        }
        for i in range(size)
        for j in range(size)
    ]
    return rows, {"lambda_h": LAMBDA_H, "lambda_a1": LAMBDA_A1, "grid": size}


def plot(rows: list[dict[str, Any]]):
    """Kind as a two-colour map with the S5 band marked."""
    lam_h = sorted({r["lambda_h"] for r in rows})
    lam_a1 = sorted({r["lambda_a1"] for r in rows})
    code = {k: i for i, k in enumerate(KINDS)}
    grid = np.array([code[r["kind"]] for r in rows]).reshape(len(lam_a1), len(lam_h))
    fig, ax = new_figure("column", 0.8)
    cmap = ListedColormap(["#D55E00", "#0072B2", "#999999"])
    ax.pcolormesh(lam_h, lam_a1, grid, cmap=cmap, vmin=-0.5, vmax=2.5, shading="nearest")
    ax.axvspan(-1, 0, ymin=0, ymax=1, fill=False, hatch="//", edgecolor="white", linewidth=0)
    ax.axvline(-1, color="k", lw=0.6)
    ax.axvline(0, color="k", lw=0.6)
    ax.set_xlabel(r"$\lambda^H$")
    ax.set_ylabel(r"$\lambda^A_1$")
    ax.set_title("dominating eigenvalue: orange Perron (smoothing), blue non-Perron")
    ax.grid(False)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
