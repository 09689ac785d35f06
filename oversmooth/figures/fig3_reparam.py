"""Fig. 3: smoothing per layer after the ± reparameterisation, next to the trained model.

Claim (docs/theory.md §5, S5, S6; poster ViT-Ti⁺ / ViT-Ti⁻): making every head's W_V^h W_O^h = Q Λ Q^T
with Λ > 0 (⁺) gives Perron-type dominance and smoothing; Λ in [-1, 0) (⁻) never does, and the
non-Perron regime sharpens. The paper *trains* ViT-Ti⁺/⁻ under the constraint; here the trained
weights are replaced post hoc by the nearest such product (importers.transform.reparameterize, no
retraining), for DINOv2 ViT-S/14 (pre-LN) and MiniLM-L3 (post-LN, where the theory's update is exact
up to the MLP). Metrics as in Fig. 2: HFC/LFC, mean token cosine, σ2/σ1 per layer, mean ± std over
the bundled inputs.

Run: ``python -m oversmooth.figures.fig3_reparam [--quick] --out DIR``.

CSV columns: ``model,transform,modality,layer,metric,mean,std,n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.ticker import MaxNLocator

from oversmooth.figures import _models
from oversmooth.figures._common import new_figure, run_script
from oversmooth.figures.audit_report import LAYER_PANELS, plot_layers

NAME = "fig3_reparam"
#: One figure row per model: the trained model and its two reparameterisations.
MODELS = ("dinov2-vits14", "minilm-l3")
TRANSFORMS = ("trained", "plus", "minus")
COLORS = {"trained": "C0", "plus": "C1", "minus": "C2"}
KEYS = tuple(m if t == "trained" else f"{m}:{t}" for m in MODELS for t in TRANSFORMS)
COLUMNS = _models.SMOOTHING_COLUMNS


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-layer smoothing rows of every variant in :data:`KEYS`."""
    return _models.smoothing_rows(KEYS, quick), _models.provenance(KEYS, quick)


def plot(rows: list[dict[str, Any]]):
    """A row of metric panels per model; trained, ⁺ and ⁻ as three lines."""
    fig, axes = new_figure("full", 0.62, nrows=len(MODELS), ncols=len(LAYER_PANELS))
    for ax_row, model in zip(axes, MODELS, strict=True):
        for transform in TRANSFORMS:
            key = model if transform == "trained" else f"{model}:{transform}"
            sel = _models.rows_of(rows, model=model, transform=transform)
            plot_layers(ax_row, sel, _models.VARIANTS[key].label, COLORS[transform])
        for ax in ax_row:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_row[0].set_ylabel(_models.VARIANTS[model].label)
        ax_row[0].legend(loc="best")
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
