"""The sweep's regime map (:mod:`oversmooth.figures.sweep_map`) on hand-made sweep rows: one cell
per (rule, H spectrum[, γ]), coloured by the median log10 HFC/LFC, labelled by the Perron share."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from numpy.testing import assert_allclose

from oversmooth.figures.sweep_map import HFC_LFC_FLOOR, plot_regime_map, save_regime_map


def _row(rule: str, params: str, h: str, ratio: float, kind: str, gamma=None) -> dict:
    return {
        "rule": rule,
        "params": params,
        "h_spectrum": h,
        "gamma": gamma,
        "final_hfc_lfc": ratio,
        "predicted_kind": kind,
    }


ROWS = [
    # linear on H+: two runs, 1e-4 and 1e-2 (median of the logs: -3), both Perron
    _row("linear", "", "positive", 1e-4, "perron"),
    _row("linear", "", "positive", 1e-2, "perron"),
    # linear on H-: one Perron run of 10, one non-Perron run that diverged (left out of the colour)
    _row("linear", "", "negative", 10.0, "perron"),
    _row("linear", "", "negative", math.inf, "non-perron"),
    # a second rule, below the floor on H+ (drawn at the floor), no finite run on H-
    _row("neutreno", "lam=0.6", "positive", 0.0, "perron"),
    _row("neutreno", "lam=0.6", "negative", math.nan, "non-perron"),
]


def test_cells_hold_the_median_log_ratio_and_texts_the_perron_share() -> None:
    fig = plot_regime_map(ROWS)
    try:
        ax = fig.axes[0]
        values = np.ma.filled(np.ma.masked_invalid(ax.images[0].get_array()), np.nan)
        floor = math.log10(HFC_LFC_FLOOR)
        assert_allclose(values, [[-3.0, 1.0], [floor, np.nan]])
        assert [t.get_text() for t in ax.get_xticklabels()] == ["positive", "negative"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["linear", "neutreno lam=0.6"]
        assert [t.get_text() for t in ax.texts] == ["100% P", "50% P", "100% P", "0% P"]
    finally:
        plt.close(fig)


def test_columns_name_gamma_only_when_it_varies() -> None:
    rows = [
        _row("linear", "", "positive", 0.1, "perron", gamma=1.0),
        _row("linear", "", "positive", 0.1, "non-perron", gamma=-1.0),
        _row("linear", "", "positive", 0.1, "perron", gamma=None),
    ]
    fig = plot_regime_map(rows)
    try:
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert labels == ["positive\nγ=1", "positive\nγ=-1", "positive\nγ=none"]
    finally:
        plt.close(fig)


def test_the_map_is_saved_as_a_png(tmp_path: Path) -> None:
    path = tmp_path / "regime_map.png"
    save_regime_map(ROWS, path)
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
