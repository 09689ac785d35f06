"""Fig. 4 (:mod:`oversmooth.figures.fig4_layernorm`) on its quick grid: the sign of the LayerNorm
weights swaps the regimes under Pre-LN only (docs/theory.md §4, claims 21-22)."""

from __future__ import annotations

import pytest
from numpy.testing import assert_allclose

from oversmooth.figures import fig4_layernorm as fig4


@pytest.fixture(scope="module")
def quick_rows() -> dict[tuple[str, str, str], list[dict]]:
    """The quick run's rows by (H spectrum, norm, gamma sign), in layer order."""
    rows, _ = fig4.compute(quick=True)
    curves: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        curves.setdefault((row["h_spectrum"], row["norm"], row["gamma_sign"]), []).append(row)
    return curves


def test_one_curve_per_spectrum_norm_and_sign_of_every_layer(quick_rows) -> None:
    assert set(quick_rows) == {
        (h, norm, sign) for h in fig4.H_SPECTRA for norm in fig4.NORMS for sign in "+-"
    }
    for curve in quick_rows.values():
        assert [row["layer"] for row in curve] == list(range(fig4.QUICK["layers"] + 1))
        assert all(row["q25"] <= row["median"] <= row["q75"] for row in curve)
        assert set(curve[0]) == set(fig4.COLUMNS)


@pytest.mark.parametrize("norm", ["none", "post"])
@pytest.mark.parametrize("h_spectrum", ["positive", "negative"])
def test_without_ln_or_with_post_ln_the_sign_of_gamma_changes_nothing(
    quick_rows, h_spectrum: str, norm: str
) -> None:
    plus, minus = (quick_rows[h_spectrum, norm, sign] for sign in "+-")
    for column in ("median", "q25", "q75"):
        assert_allclose([r[column] for r in minus], [r[column] for r in plus], rtol=1e-9)


def test_pre_ln_with_negative_gamma_swaps_smoothing_and_growth(quick_rows) -> None:
    def final_over_first(key: tuple[str, str, str]) -> float:
        curve = quick_rows[key]
        return curve[-1]["median"] / curve[0]["median"]

    # H⁺ smooths and H⁻ does not with γ = +1; γ = −1 swaps them
    assert (
        final_over_first(("positive", "pre", "+")) < 1 < final_over_first(("positive", "pre", "-"))
    )
    assert (
        final_over_first(("negative", "pre", "-")) < 1 < final_over_first(("negative", "pre", "+"))
    )
