"""The regime map of a simulator sweep (``oversmooth sweep``'s ``regime_map.png``).

Rows: the rules with their options; columns: the H spectra (with γ when it varies); colour: the
median over the other axes of log10 of the final HFC/LFC (low: smoothing); text: the share of cells
the theory predicts to smooth (Perron-dominated).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.figures._common import new_figure, save_png

__all__ = ["HFC_LFC_FLOOR", "plot_regime_map", "save_regime_map"]

#: HFC/LFC below this is drawn as this (the float64 floor stops runs near it anyway).
HFC_LFC_FLOOR = 1e-16


def _column_label(row: dict[str, Any], gammas: bool) -> str:
    if not gammas:
        return str(row["h_spectrum"])
    gamma = "none" if row["gamma"] is None else f"{row['gamma']:g}"
    return f"{row['h_spectrum']}\nγ={gamma}"


def _row_label(row: dict[str, Any]) -> str:
    return f"{row['rule']} {row['params']}".strip()


def plot_regime_map(rows: Sequence[dict[str, Any]]) -> Any:
    """The regime map of a sweep's rows (see the module docstring); returns the Figure."""
    gammas = len({row["gamma"] for row in rows}) > 1
    row_labels = list(dict.fromkeys(_row_label(row) for row in rows))
    column_labels = list(dict.fromkeys(_column_label(row, gammas) for row in rows))
    values = np.full((len(row_labels), len(column_labels)), np.nan)
    perron = np.full_like(values, np.nan)
    for i, label in enumerate(row_labels):
        for j, column in enumerate(column_labels):
            group = [
                r for r in rows if _row_label(r) == label and _column_label(r, gammas) == column
            ]
            ratios = np.array([r["final_hfc_lfc"] for r in group], dtype=float)
            finite = ratios[np.isfinite(ratios)]
            if finite.size:
                values[i, j] = np.median(np.log10(np.maximum(finite, HFC_LFC_FLOOR)))
            perron[i, j] = np.mean([r["predicted_kind"] == "perron" for r in group])
    width = max(3.4, 1.1 * len(column_labels) + 2.5)
    fig, ax = new_figure("column", 1.0)
    fig.set_size_inches(width, 0.45 * len(row_labels) + 1.6)
    mesh = ax.imshow(values, cmap="viridis", aspect="auto", interpolation="nearest")
    shade = mesh.norm(values)  # dark text on the light end of the colour map
    for (i, j), share in np.ndenumerate(perron):
        color = "k" if np.ma.filled(shade, 0.0)[i, j] > 0.6 else "w"
        ax.text(j, i, f"{100 * share:.0f}% P", ha="center", va="center", color=color, fontsize=7)
    ax.set_xticks(range(len(column_labels)), column_labels)
    ax.set_yticks(range(len(row_labels)), row_labels)
    ax.grid(False)
    ax.set_title("final HFC/LFC (log10, median); text: predicted Perron share", fontsize=8)
    fig.colorbar(mesh, ax=ax, label="log10 HFC/LFC (low: smoothing)")
    return fig


def save_regime_map(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Draw :func:`plot_regime_map` of ``rows`` into the PNG file ``path``."""
    save_png(plot_regime_map(rows), path)
