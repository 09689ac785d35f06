"""Fig. 5: eigenvalues of the value products pooled over layers, a vision model against language models.

Claim (docs/theory.md §6.5, Fig. 5 caption): "Vision models have distributions skewing to the negatives;
language models have symmetrically distributed eigenvalues." For each model the real parts of the
eigenvalues of the value-projection product are pooled over layers (and heads), per head (the d_head
possibly nonzero eigenvalues, claim 31) and per whole layer, for two H: the effective H (every
linear factor between the stream and the branch's contribution: pre-LayerNorm centring and γ,
W_V^h W_O^h, LayerScale; docs/theory.md §6.8), the operator the model applies, and the stored
W_V^h W_O^h (the paper's protocol). The MiniLMs are post-LN without LayerScale: their two H
coincide. Histograms are of Re λ / max |Re λ| over the eigenvalue's own layer (and kind), so that
layers and models of different scale share one axis (DINOv2's LayerScale differs by orders of
magnitude between layers: divided by the largest |Re λ| of the whole model, most of its effective
eigenvalues fell into the two bins around 0); the legend gives the share with negative real part (the caption's "skewing to the negatives") and the
share inside |1 + λ| < 1 (importers.value_spectra.summarize_spectra; the Fisher skewness is kept in
the CSV as a shape statistic). From the weights alone: quick and full runs give the same numbers.

Run: ``python -m oversmooth.figures.fig5_spectra [--quick] --out DIR``.

CSV columns: ``model,modality,kind,stat,bin_left,bin_right,value``: one row per summary statistic
(``count``, ``negative_fraction``, ``median_real``, ``inside_unit_disk``, ``skewness``,
``spectral_radius``, ``max_abs_real``; bins empty)
and one ``density`` row per histogram bin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from oversmooth.figures import _models
from oversmooth.figures._common import new_figure, run_script
from oversmooth.importers.value_spectra import summarize_spectra
from oversmooth.importers.zoo import file_sha256

NAME = "fig5_spectra"
#: Trained models: the vision model first, then the language models.
KEYS = ("dinov2-vits14", "minilm-l6-int8", "minilm-l3")
COLORS = {"dinov2-vits14": "C1", "minilm-l6-int8": "C0", "minilm-l3": "C2"}
#: Panels: title and the spectrum kinds drawn in it (importers.value_spectra.SPECTRUM_KINDS).
PANELS = (
    (r"effective H per head (solid) and layer (dashed)", ("head-effective", "layer-effective")),
    (r"stored $W_V^h W_O^h$ (solid) and $W_V W_O$ (dashed)", ("head", "layer")),
)
BINS = np.linspace(-1.0, 1.0, 41)
STATS = (
    "count",
    "negative_fraction",
    "median_real",
    "inside_unit_disk",
    "skewness",
    "spectral_radius",
    "max_abs_real",
)
COLUMNS = ("model", "modality", "kind", "stat", "bin_left", "bin_right", "value")


def per_layer_normalised(real: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """``real`` divided by the largest ``|real|`` of its own block (0 where a block's are all 0).

    Parameters
    ----------
    real, blocks : (n,) ndarray
        Real parts of eigenvalues and the block each belongs to.
    """
    scale = np.zeros_like(real)
    for block in np.unique(blocks):
        mine = blocks == block
        scale[mine] = np.max(np.abs(real[mine]))
    return np.divide(real, scale, out=np.zeros_like(real), where=scale > 0)


def _kind_rows(model: str, modality: str, kind: str, spectrum: Sequence[Any]) -> list[dict]:
    rows_of_kind = [row for row in spectrum if row.kind == kind]
    real = np.array([row.real for row in rows_of_kind])
    if real.size == 0:
        return []
    summary = vars(summarize_spectra(rows_of_kind)[kind])
    stats = {**summary, "max_abs_real": float(np.max(np.abs(real)))}
    base = {"model": model, "modality": modality, "kind": kind}
    rows = [{**base, "stat": stat, "value": float(stats[stat])} for stat in STATS]
    blocks = np.array([row.block for row in rows_of_kind])
    density, _ = np.histogram(per_layer_normalised(real, blocks), bins=BINS, density=True)
    rows.extend(
        {
            **base,
            "stat": "density",
            "bin_left": float(BINS[i]),
            "bin_right": float(BINS[i + 1]),
            "value": float(density[i]),
        }
        for i in range(density.size)
    )
    return rows


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Summary statistics and normalised histograms of every model's spectra (``quick`` unused)."""
    rows = []
    for key in KEYS:
        variant = _models.VARIANTS[key]
        spectrum = _models.spectra(key)
        for _, kinds in PANELS:
            for kind in kinds:
                rows.extend(_kind_rows(variant.model, variant.modality, kind, spectrum))
    config = {
        "models": {key: file_sha256(_models.variant_file(key)) for key in KEYS},
        "bins": {"low": float(BINS[0]), "high": float(BINS[-1]), "count": BINS.size - 1},
        "normalisation": "real part divided by the largest |real part| of (model, kind, layer)",
    }
    return rows, config


def _legend_label(rows: list[dict[str, Any]], model: str, kind: str, with_kind: bool) -> str:
    stats = {r["stat"]: r["value"] for r in _models.rows_of(rows, model=model, kind=kind)}
    name = _models.VARIANTS[model].label + (f" ({kind})" if with_kind else "")
    return (
        f"{name}: {100 * stats['negative_fraction']:.0f}% Re<0, "
        f"{100 * stats['inside_unit_disk']:.0f}% in |1+λ|<1"
    )


def plot(rows: list[dict[str, Any]]):
    """One panel per :data:`PANELS` entry: density of Re λ / max |Re λ| (per layer) per model."""
    fig, axes = new_figure("full", 0.5, ncols=len(PANELS), sharey=True)
    for ax, (title, kinds) in zip(axes, PANELS, strict=True):
        for key in KEYS:
            for style, kind in zip(("-", "--"), kinds, strict=False):
                bins = _models.rows_of(rows, model=key, kind=kind, stat="density")
                if not bins:
                    continue
                edges = [r["bin_left"] for r in bins] + [bins[-1]["bin_right"]]
                ax.stairs(
                    [r["value"] for r in bins],
                    edges,
                    color=COLORS[key],
                    linestyle=style,
                    label=_legend_label(rows, key, kind, len(kinds) > 1),
                )
        ax.axvline(0, color="0.5", lw=0.6)
        ax.set_title(title)
        ax.set_xlabel("Re λ / max |Re λ| of its layer")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    axes[0].set_ylabel("density")
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
