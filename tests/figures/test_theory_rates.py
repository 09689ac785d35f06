"""The rates figure (:mod:`oversmooth.figures.theory_rates`) on its quick draw: fitted log-rates of
separated Perron-dominated systems match the predicted ones (S2, S9, claim 12)."""

from __future__ import annotations

import pytest

from oversmooth.figures import theory_rates


@pytest.fixture(scope="module")
def quick_rows() -> list[dict]:
    return theory_rates.compute(quick=True)[0]


def test_one_row_per_system_numbered_in_order(quick_rows) -> None:
    assert [row["system"] for row in quick_rows] == list(range(theory_rates.QUICK["systems"]))
    for row in quick_rows:
        assert set(row) == set(theory_rates.COLUMNS)
        assert 4 <= row["n"] <= 16
        assert 2 <= row["d"] <= 8


def test_the_relative_error_is_of_the_two_rates_and_small(quick_rows) -> None:
    for row in quick_rows:
        predicted, fitted = row["predicted_log_rate"], row["fitted_log_rate"]
        assert predicted < 0  # Perron dominance: HFC/LFC decays
        assert row["relative_error"] == pytest.approx(abs(fitted - predicted) / abs(predicted))
        assert row["relative_error"] < 1e-2
