"""Pictures of one audit (``oversmooth audit``): smoothing per layer, value spectra, dominance per
block, and the depth step's predicted against measured HFC/LFC.

``render(result, folder)`` draws the PNGs next to the report and returns ``[(title, file name), ...]``
for :func:`oversmooth.report.save_audit` to embed in ``report.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.figures._common import new_figure, save_png
from oversmooth.importers.audit.records import AuditResult, DepthSummary
from oversmooth.simulator.tolerances import ZERO_EIGENVALUE_RTOL

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


#: The spectra figure's panels: title, x-axis label and the spectrum kinds it draws.
SPECTRA_PANELS = (
    ("stored: W_V W_O as the checkpoint holds it", "Re λ of W_V W_O", ("head", "layer")),
    (
        "effective H (docs/theory.md §6.8)",
        "Re λ of the effective H",
        ("head-effective", "layer-effective"),
    ),
)


def nonzero_eigenvalues(values: np.ndarray) -> tuple[np.ndarray, int]:
    """``values`` without their null-space zeros (modulus at most ``ZERO_EIGENVALUE_RTOL`` times
    the largest), and how many were left out."""
    modulus = np.abs(values)
    if modulus.size == 0:
        return values, 0
    keep = modulus > ZERO_EIGENVALUE_RTOL * modulus.max()
    return values[keep], int(np.count_nonzero(~keep))


def plot_spectrum(
    ax: Any, values: np.ndarray, label: str, lim: float, color: str | None = None
) -> None:
    """Histogram (counts, log scale) of the real parts of the non-zero eigenvalues ``values`` on
    ``[-lim, lim]``, with the negative fraction, the skewness and the zeros left out marked."""
    kept, zeros = nonzero_eigenvalues(np.asarray(values))
    real = kept.real
    if real.size == 0:
        return
    negative = float(np.mean(real < 0))
    centred = real - real.mean()
    skew = (
        float(np.mean(centred**3) / np.mean(centred**2) ** 1.5) if np.any(centred) else float("nan")
    )
    left_out = f", {zeros} zero{'' if zeros == 1 else 's'} left out" if zeros else ""
    ax.hist(
        real,
        bins=np.linspace(-lim, lim, 81),
        histtype="step",
        color=color,
        label=f"{label}: {100 * negative:.0f}% < 0, skew {skew:.2f}{left_out}",
    )
    ax.axvline(0, color="0.5", lw=0.6)
    ax.set_yscale("log")
    ax.set_xlim(-lim, lim)
    ax.set_ylabel("eigenvalues per bin")


def plot_dominance(
    ax: Any,
    layers: Sequence[int],
    perron_fractions: Sequence[float],
    contracting_fractions: Sequence[float] | None = None,
    *,
    legend: bool = True,
) -> None:
    """Stacked bars per attention block: perron, non-perron and contracting fractions (the last
    decided from H alone); the legend, if asked for, right of the axes, clear of the bars."""
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
    if legend:  # to the right of the axes, clear of the bars (constrained layout makes room)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


def plot_depth(curve_ax: Any, growth_ax: Any, depth: DepthSummary, operator: bool) -> None:
    """Left: the measured HFC/LFC per layer against the predicted product over depth (per head;
    per operator when ``operator``). Right: per block, predicted against measured growth."""
    blocks = np.array([row.block for row in depth.per_block])
    layers = np.concatenate([[0], blocks + 1])
    measured = np.concatenate([[depth.start], [row.measured_hfc_lfc for row in depth.per_block]])
    predicted = np.concatenate([[depth.start], [row.predicted_hfc_lfc for row in depth.per_block]])
    curve_ax.plot(layers, measured, "o-", color="#000000", label="measured")
    curve_ax.plot(layers, predicted, "s--", color="#D55E00", label="predicted (heads)")
    growth_ax.plot(blocks, [r.measured_growth for r in depth.per_block], "o-", color="#000000")
    growth_ax.plot(blocks, [r.predicted_growth for r in depth.per_block], "s--", color="#D55E00")
    if operator:
        whole = [depth.start, *[row.operator_hfc_lfc for row in depth.per_block]]
        curve_ax.plot(layers, whole, "^:", color="#0072B2", label="predicted (operator)")
        growth_ax.plot(blocks, [r.operator_growth for r in depth.per_block], "^:", color="#0072B2")
    curve_ax.set_yscale("log")
    curve_ax.set_xlabel("layer")
    curve_ax.set_ylabel("HFC / LFC")
    curve_ax.legend(fontsize=6, frameon=False)
    growth_ax.axhline(1.0, color="0.5", lw=0.6)
    growth_ax.set_yscale("log")
    growth_ax.set_xlabel("attention block")
    growth_ax.set_ylabel("HFC/LFC growth per block")


def render(result: AuditResult, folder: Path) -> list[tuple[str, str]]:
    """Draw ``layers.png``, ``spectra.png``, ``dominance.png`` and ``depth.png`` into ``folder``."""
    drawn = []
    fig, axes = new_figure("full", 0.33, ncols=3)
    plot_layers(axes, result.layer_rows(), result.model.name)
    save_png(fig, folder / "layers.png")
    drawn.append(("smoothing metrics per layer", "layers.png"))

    values = {
        kind: np.array([complex(row.real, row.imag) for row in result.spectra if row.kind == kind])
        for _, _, kinds in SPECTRA_PANELS
        for kind in kinds
    }
    fig, axes = new_figure("full", 0.36, ncols=2)
    for ax, (title, xlabel, kinds) in zip(axes, SPECTRA_PANELS, strict=True):
        real = np.concatenate([values[kind].real for kind in kinds])
        lim = 1.05 * float(np.abs(real).max()) if real.size and np.any(real) else 1.0
        for kind in kinds:
            plot_spectrum(ax, values[kind], kind, lim)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=6, loc="upper left", frameon=False)
    save_png(fig, folder / "spectra.png")
    drawn.append(
        (
            "eigenvalues of the stored and the effective H (real parts, zeros left out)",
            "spectra.png",
        )
    )

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
    if result.depth is not None and result.depth.per_block:
        fig, axes = new_figure("full", 0.36, ncols=2)
        plot_depth(axes[0], axes[1], result.depth, bool(result.operator))
        save_png(fig, folder / "depth.png")
        drawn.append(("predicted against measured HFC/LFC over depth", "depth.png"))
    return drawn
