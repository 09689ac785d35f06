"""Fig. 2 (:mod:`oversmooth.figures.fig2_smoothing`): its variants and its plot, on made-up rows
(the audits themselves run in the quick run of ``test_figures.py``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from numpy.testing import assert_array_equal

from oversmooth.figures import _models, fig2_smoothing
from oversmooth.figures.audit_report import LAYER_PANELS


def _rows(keys: tuple[str, ...], layers: int) -> list[dict]:
    """Made-up smoothing rows: variant ``k`` has mean ``k + 1 + layer / 10`` in every metric."""
    return [
        {
            "model": _models.VARIANTS[key].model,
            "transform": _models.VARIANTS[key].transform,
            "layer": layer,
            "metric": metric,
            "mean": k + 1 + layer / 10,
            "std": 0.01,
        }
        for k, key in enumerate(keys)
        for layer in range(layers)
        for metric, _, _ in LAYER_PANELS
    ]


def test_every_key_is_a_variant_of_its_own_colour() -> None:
    assert set(fig2_smoothing.KEYS) <= set(_models.VARIANTS)
    assert len(set(fig2_smoothing.COLORS)) == len(fig2_smoothing.KEYS)
    assert fig2_smoothing.COLUMNS == _models.SMOOTHING_COLUMNS


def test_the_plot_draws_one_line_per_variant_on_every_panel() -> None:
    fig = fig2_smoothing.plot(_rows(fig2_smoothing.KEYS, 4))
    try:
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == [title for _, title, _ in LAYER_PANELS]
        for ax in axes:
            assert [line.get_label() for line in ax.get_lines()] == [
                _models.VARIANTS[key].label for key in fig2_smoothing.KEYS
            ]
            for k, line in enumerate(ax.get_lines()):
                assert_array_equal(line.get_xdata(), np.arange(4))
                assert_array_equal(line.get_ydata(), k + 1 + np.arange(4) / 10)
    finally:
        plt.close(fig)
