"""The regime map (:mod:`oversmooth.figures.theory_regime_map`) on its quick grid: the kind is the
larger of |1 + λ^H| and |1 + λ^H λ^A_1|; non-Perron across the S5 band, Perron for λ^H > 0 (S6)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from oversmooth.figures import theory_regime_map as regime_map


@pytest.fixture(scope="module")
def quick_rows() -> list[dict]:
    return regime_map.compute(quick=True)[0]


def test_the_grid_covers_both_ranges(quick_rows) -> None:
    size = regime_map.QUICK_GRID
    assert len(quick_rows) == size * size
    assert {r["lambda_h"] for r in quick_rows} == set(np.linspace(*regime_map.LAMBDA_H, size))
    assert {r["lambda_a1"] for r in quick_rows} == set(np.linspace(*regime_map.LAMBDA_A1, size))


def test_the_kind_is_the_larger_modulus(quick_rows) -> None:
    for row in quick_rows:
        lam_h, lam_a1 = row["lambda_h"], row["lambda_a1"]
        perron, other = abs(1 + lam_h), abs(1 + lam_h * lam_a1)
        assert row["modulus_perron"] == pytest.approx(perron)
        assert row["modulus_non_perron"] == pytest.approx(other)
        assert (row["kind"] == "perron") == (perron > other * (1 + 1e-12)), row


def test_the_s5_band_is_never_perron_and_positive_h_always(quick_rows) -> None:
    band = [r["kind"] for r in quick_rows if -1 < r["lambda_h"] < 0]
    positive = [r["kind"] for r in quick_rows if r["lambda_h"] > 0]
    assert band
    assert set(band) == {"non-perron"}
    assert positive
    assert set(positive) == {"perron"}


def test_the_plot_colours_each_cell_by_its_kind(quick_rows) -> None:
    fig = regime_map.plot(quick_rows)
    try:
        (mesh,) = fig.axes[0].collections[:1]
        size = regime_map.QUICK_GRID
        codes = np.asarray(mesh.get_array()).reshape(size, size)
        expected = np.array([r["kind"] == "perron" for r in quick_rows]).reshape(size, size)
        assert np.array_equal(codes == 0, expected)
    finally:
        plt.close(fig)
