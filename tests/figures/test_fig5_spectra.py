"""Fig. 5's per-layer normalisation: each layer's eigenvalues on one axis, signs kept."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from oversmooth.figures.fig5_spectra import per_layer_normalised
from oversmooth.simulator import tolerances as tol
from tests.figures.quick import QuickRun, csv_rows, script_output


def test_each_layer_is_divided_by_its_own_largest_modulus() -> None:
    # two layers 1000× apart in scale, as DINOv2's LayerScale makes them
    real = np.array([-2.0, 1.0, 0.5, -0.004, 0.001, 0.002])
    blocks = np.array([0, 0, 0, 1, 1, 1])
    normalised = per_layer_normalised(real, blocks)
    assert_array_equal(normalised, [-1.0, 0.5, 0.25, -1.0, 0.25, 0.5])
    assert_array_equal(np.sign(normalised), np.sign(real))


def test_a_layer_of_zeros_stays_zero() -> None:
    normalised = per_layer_normalised(np.array([0.0, 0.0, 3.0]), np.array([2, 2, 5]))
    assert_array_equal(normalised, [0.0, 0.0, 1.0])


# Moved from tests/figures/test_figures.py.
@pytest.mark.figures
@pytest.mark.realmodel
def test_spectra_histograms_are_densities(quick_run: QuickRun) -> None:
    rows = csv_rows(script_output(quick_run, "fig5_spectra") / "fig5_spectra.csv")
    groups = {(r["model"], r["kind"]) for r in rows}
    assert {kind for _, kind in groups} >= {"head", "layer", "head-effective", "layer-effective"}
    for model, kind in groups:
        sel = [r for r in rows if (r["model"], r["kind"]) == (model, kind)]
        bins = [r for r in sel if r["stat"] == "density"]
        width = np.array([float(r["bin_right"]) - float(r["bin_left"]) for r in bins])
        mass = float(np.sum(width * np.array([float(r["value"]) for r in bins])))
        assert_allclose(mass, 1.0, rtol=tol.STEP_RTOL, err_msg=f"{model} {kind}")
        stats = {r["stat"]: float(r["value"]) for r in sel if r["stat"] != "density"}
        assert 0 <= stats["negative_fraction"] <= 1
        assert stats["max_abs_real"] <= stats["spectral_radius"]
