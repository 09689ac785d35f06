"""The audit's own figures (figures.audit_report): what is drawn, and where the legend goes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from oversmooth.figures._common import new_figure
from oversmooth.figures.audit_report import (
    SPECTRA_PANELS,
    nonzero_eigenvalues,
    plot_dominance,
    plot_spectrum,
    render,
)
from tests.importers.audited import audited


def test_null_space_zeros_are_left_out_and_counted() -> None:
    values = np.array([2.7, -1.0 + 0.5j, 1e-17, 0.0, 0.3])
    kept, zeros = nonzero_eigenvalues(values)
    assert zeros == 2
    assert kept.tolist() == [2.7, -1.0 + 0.5j, 0.3]


def test_spectra_panels_name_what_they_plot() -> None:
    labels = [xlabel for _, xlabel, _ in SPECTRA_PANELS]
    assert labels == ["Re λ of W_V W_O", "Re λ of the effective H"]


def test_the_dominance_legend_sits_outside_the_bars() -> None:
    fig, ax = new_figure("column", 0.75)
    plot_dominance(ax, [0, 1, 2], [1.0, 0.5, 0.2], [0.0, 0.2, 0.3])
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the axes: no bar beneath it


def test_render_draws_the_depth_figure(model_dir: Path, tmp_path: Path) -> None:
    result = audited(model_dir, "vit_prenorm_layerscale")
    drawn = [name for _, name in render(result, tmp_path)]
    assert drawn == ["layers.png", "spectra.png", "dominance.png", "depth.png"]
    assert all((tmp_path / name).stat().st_size > 0 for name in drawn)


def test_spectrum_limits_come_from_the_data() -> None:
    # an outlier at 2.74 is inside the axis, not clipped to a quantile
    values = np.concatenate([np.linspace(-0.1, 0.1, 200), [2.74, 0.0]]).astype(complex)
    fig, ax = new_figure("column", 0.75)
    lim = 1.05 * float(np.abs(values.real).max())
    plot_spectrum(ax, values, "head-effective", lim)
    assert ax.get_xlim() == pytest.approx((-lim, lim))
    (label,) = [text.get_text() for text in ax.legend().get_texts()]
    assert label.endswith("1 zero left out")
    plt.close(fig)
