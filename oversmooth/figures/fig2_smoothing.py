"""Fig. 2: smoothing per layer in real pretrained Transformers, trained against random init.

Claim (docs/theory.md §6.6, from the paper's abstract): feature similarity grows with depth in some models
but "this is not inevitable, even for existing pre-trained models". Per layer ℓ = 0..L (the residual
stream entering block ℓ), HFC/LFC (Def. 1, log scale), the mean token cosine (Def. 2) and σ2/σ1
(Def. 3) of the hidden states, mean ± std over the bundled inputs, for DINOv2 ViT-S/14 (trained and
random init) and the MiniLM-L6 and MiniLM-L3 sentence encoders. The ViT's CLS token is left out.

Run: ``python -m oversmooth.figures.fig2_smoothing [--quick] --out DIR``.

CSV columns: ``model,transform,modality,layer,metric,mean,std,n`` (every metric of
simulator.metrics.METRICS, not only the three plotted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.ticker import MaxNLocator

from oversmooth.figures import _models
from oversmooth.figures._common import new_figure, run_script
from oversmooth.figures.audit_report import LAYER_PANELS, plot_layers

NAME = "fig2_smoothing"
#: Audited variants (keys of figures._models.VARIANTS), in legend order.
KEYS = ("dinov2-vits14", "dinov2-vits14:random-init", "minilm-l6-int8", "minilm-l3")
COLORS = ("C0", "C3", "C1", "C2")
COLUMNS = _models.SMOOTHING_COLUMNS


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-layer smoothing rows of every variant in :data:`KEYS`."""
    return _models.smoothing_rows(KEYS, quick), _models.provenance(KEYS, quick)


def plot(rows: list[dict[str, Any]]):
    """One panel per metric (LAYER_PANELS), one line per model, ± std band."""
    fig, axes = new_figure("full", 0.36, ncols=len(LAYER_PANELS))
    for key, color in zip(KEYS, COLORS, strict=True):
        variant = _models.VARIANTS[key]
        sel = _models.rows_of(rows, model=variant.model, transform=variant.transform)
        plot_layers(axes, sel, variant.label, color)
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(KEYS))
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
