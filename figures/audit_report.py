"""Pictures of one audit (``oversmooth audit``): smoothing per layer, value spectra, dominance per layer.

``render(result, folder)`` draws the PNGs next to the report and returns ``[(title, file name), ...]``
for :func:`oversmooth.report.save_audit` to embed in ``report.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from figures._common import new_figure, save_png
from importers.run.records import AuditResult

#: Panels of the per-layer figure: metric, axis label, log scale.
LAYER_PANELS = (
    ("hfc_lfc", "HFC / LFC (Def. 1)", True),
    ("cosine", "mean token cosine (Def. 2)", False),
    ("sigma_ratio", "σ2 / σ1 (Def. 3)", True),
)


def plot_layers(
    ax_row: Sequence[Any], rows: Sequence[dict[str, Any]], label: str, color: str | None = None
) -> None:
    """Mean ± std per layer of each LAYER_PANELS metric, one line on each axis of ``ax_row``."""
    for ax, (metric, title, log) in zip(ax_row, LAYER_PANELS, strict=True):
        sel = sorted((r for r in rows if r["metric"] == metric), key=lambda r: int(r["layer"]))
        layers = np.array([int(r["layer"]) for r in sel])
        mean = np.array([float(r["mean"]) for r in sel])
        std = np.array([float(r["std"]) for r in sel])
        (line,) = ax.plot(layers, mean, "o-", label=label, color=color)
        low = np.clip(mean - std, mean * 0.05, None) if log else mean - std
        ax.fill_between(layers, low, mean + std, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel("layer")
        if log:
            ax.set_yscale("log")


def plot_spectrum(ax: Any, real: np.ndarray, label: str, color: str | None = None) -> None:
    """Density histogram of eigenvalue real parts with the negative fraction and skewness marked."""
    if real.size == 0:
        return
    lim = np.quantile(np.abs(real), 0.99) or 1.0
    bins = np.linspace(-lim, lim, 61)
    negative = float(np.mean(real < 0))
    centred = real - real.mean()
    skew = (
        float(np.mean(centred**3) / np.mean(centred**2) ** 1.5) if np.any(centred) else float("nan")
    )
    ax.hist(
        np.clip(real, -lim, lim),
        bins=bins,
        density=True,
        histtype="step",
        color=color,
        label=f"{label}: {100 * negative:.0f}% < 0, skew {skew:.2f}",
    )
    ax.axvline(0, color="0.5", lw=0.6)
    ax.set_xlabel("Re λ of W_V W_O")


def plot_dominance(
    ax: Any,
    layers: Sequence[int],
    perron_fractions: Sequence[float],
    contracting_fractions: Sequence[float] | None = None,
    *,
    legend: bool = True,
) -> None:
    """Stacked bars per attention block: perron, non-perron and contracting fractions (the last
    decided from H alone); the legend, if asked for, above the axes, clear of the bars."""
    perron = np.asarray(perron_fractions, dtype=float)
    contracting = (
        np.zeros_like(perron)
        if contracting_fractions is None
        else np.asarray(contracting_fractions, dtype=float)
    )
    non_perron = 1 - perron - contracting
    ax.bar(layers, perron, color="#D55E00", label="perron (λ^A = 1)")
    ax.bar(layers, non_perron, bottom=perron, color="#0072B2", label="non-perron")
    if contracting.any():
        ax.bar(
            layers,
            contracting,
            bottom=perron + non_perron,
            color="#BBBBBB",
            label="contracting (H alone)",
        )
    ax.set_ylim(0, 1)
    ax.set_xlabel("attention block")
    ax.set_ylabel("fraction of (input, head) cases")
    if legend:
        ax.legend(
            fontsize=6, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, frameon=False
        )


def render(result: AuditResult, folder: Path) -> list[tuple[str, str]]:
    """Draw ``layers.png``, ``spectra.png`` and ``dominance.png`` into ``folder``."""
    drawn = []
    fig, axes = new_figure("full", 0.33, ncols=3)
    plot_layers(axes, result.layer_rows(), result.model.name)
    save_png(fig, folder / "layers.png")
    drawn.append(("smoothing metrics per layer", "layers.png"))

    fig, ax = new_figure("column", 0.75)
    for kind in ("head", "layer", "head-effective", "layer-effective"):
        real = np.array([row.real for row in result.spectra if row.kind == kind])
        plot_spectrum(ax, real, kind)
    ax.legend(fontsize=6)
    save_png(fig, folder / "spectra.png")
    drawn.append(("eigenvalues of the stored and the effective H (real parts)", "spectra.png"))

    summary = result.dominance_summary()
    if summary.cases:
        fig, ax = new_figure("column", 0.75)
        plot_dominance(
            ax,
            [r.block for r in summary.per_block],
            [r.perron for r in summary.per_block],
            [r.contracting for r in summary.per_block],
        )
        save_png(fig, folder / "dominance.png")
        drawn.append(("dominating eigenvalue kind per block", "dominance.png"))
    return drawn
