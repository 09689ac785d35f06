"""Token statistics: every metric from the sufficient statistics equals the metric of the matrix."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import METRICS, all_metrics, hfc_lfc
from oversmooth.simulator.statistics import (
    SCALAR_FIELDS,
    SPECTRAL_METRICS,
    SPECTRAL_NORM_METRIC,
    TokenStatistics,
    centred_gram_top,
    metrics_from_statistics,
    token_statistics,
)
from oversmooth.simulator.tolerances import GRAM_ATOL, GRAM_RTOL

seeds = st.integers(min_value=0, max_value=2**32 - 1)
grams = st.sampled_from(["tokens", "features"])


def _masked_batch(batch: int, n: int, d: int, seed: int, smooth: float) -> tuple:
    """Random (batch, n, d) tokens pulled towards a shared row by ``smooth``, and a mask."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((batch, n, d)) + smooth * rng.standard_normal((batch, 1, d))
    X[:, rng.integers(n)] = 0.0  # a zero row (cosine leaves it out)
    mask = rng.random((batch, n)) < 0.8
    mask[:, :2] = True  # at least two counted tokens
    return X, mask


@given(
    batch=st.integers(1, 3),
    n=st.integers(2, 9),
    d=st.integers(1, 7),
    seed=seeds,
    gram=grams,
    smooth=st.sampled_from([0.0, 3.0, 1e3]),
)
def test_metrics_from_statistics_equal_the_metrics_of_the_counted_rows(
    batch: int, n: int, d: int, seed: int, gram: str, smooth: float
) -> None:
    X, mask = _masked_batch(batch, n, d, seed, smooth)
    got = metrics_from_statistics(token_statistics(X, mask, gram=gram))  # type: ignore[arg-type]
    for b in range(batch):
        expected = all_metrics(X[b][mask[b]])
        for name in METRICS:
            assert_allclose(
                got[name][b], expected[name], rtol=GRAM_RTOL, atol=GRAM_ATOL, err_msg=name
            )


def test_packed_statistics_round_trip_in_field_order() -> None:
    X, mask = _masked_batch(2, 6, 4, 0, 1.0)
    stats = token_statistics(X, mask)
    packed = np.stack([getattr(stats, name) for name in SCALAR_FIELDS], axis=-1)
    again = TokenStatistics.from_packed(packed, stats.gram_eigenvalues)
    for name in METRICS:
        assert_allclose(metrics_from_statistics(again)[name], metrics_from_statistics(stats)[name])


def test_degenerate_matrices_give_the_documented_values() -> None:
    zero = np.zeros((1, 4, 3))
    one_row = zero.copy()
    one_row[0, 0] = 1.0
    for X in (zero, one_row):
        got = metrics_from_statistics(token_statistics(X))
        expected = all_metrics(X[0])
        for name in METRICS:
            assert_allclose(got[name][0], expected[name], err_msg=name)


def test_round_off_gram_eigenvalues_add_no_effective_rank() -> None:
    # A rank-one matrix: its Gram has one eigenvalue and round-off; the effective rank is 1.
    u, v = np.arange(1.0, 9.0), np.linspace(-1.0, 2.0, 5)
    X = np.outer(u, v)[None] * 1e3
    got = metrics_from_statistics(token_statistics(X, gram="tokens"))
    assert got["effective_rank"][0] == pytest.approx(1.0, abs=GRAM_ATOL)
    assert got["sigma_ratio"][0] == pytest.approx(0.0, abs=GRAM_ATOL)


def test_fewer_than_two_tokens_and_missing_gram_are_refused() -> None:
    X = np.ones((1, 3, 2))
    with pytest.raises(InputError, match="at least 2 tokens"):
        metrics_from_statistics(token_statistics(X, np.array([[True, False, False]])))
    without_gram = token_statistics(X, gram="none")
    assert set(metrics_from_statistics(without_gram, ["hfc_lfc", "cosine", "dong_residual"]))
    for name in SPECTRAL_METRICS:
        with pytest.raises(InputError, match="gram_eigenvalues"):
            metrics_from_statistics(without_gram, [name])
    with pytest.raises(InputError, match="metric names"):
        metrics_from_statistics(without_gram, ["nope"])
    with pytest.raises(InputError, match="last axis of 8"):
        TokenStatistics.from_packed(np.zeros((2, 7)))
    with pytest.raises(InputError, match="mask"):
        token_statistics(X, np.ones((1, 2), dtype=bool))


@given(
    batch=st.integers(1, 3),
    n=st.integers(2, 9),
    d=st.integers(1, 7),
    seed=seeds,
    gram=grams,
    smooth=st.sampled_from([0.0, 3.0]),
)
def test_the_spectral_norm_hfc_lfc_from_either_gram_is_the_metric_of_the_counted_rows(
    batch: int, n: int, d: int, seed: int, gram: str, smooth: float
) -> None:
    """``hfc_top`` from the masked rows' Gram (with the weights, or with the rows' sum) gives
    simulator.metrics.hfc_lfc(X, norm="spectral") of the counted rows."""
    X, mask = _masked_batch(batch, n, d, seed, smooth)
    stats = token_statistics(X, mask, gram=gram)  # type: ignore[arg-type]
    Xm = X * mask[..., None]
    if gram == "tokens":
        top = centred_gram_top(Xm @ np.swapaxes(Xm, -1, -2), "tokens", weights=mask)
    else:
        top = centred_gram_top(
            np.swapaxes(Xm, -1, -2) @ Xm, "features", totals=Xm.sum(axis=1), n_tokens=mask.sum(1)
        )
    assert stats.hfc_top is not None
    assert_allclose(top, stats.hfc_top, rtol=GRAM_RTOL, atol=GRAM_ATOL * np.max(stats.hfc_top))
    got = metrics_from_statistics(dataclasses.replace(stats, hfc_top=top), [SPECTRAL_NORM_METRIC])[
        SPECTRAL_NORM_METRIC
    ]
    for b in range(batch):
        expected = hfc_lfc(X[b][mask[b]], norm="spectral")
        assert_allclose(got[b], expected, rtol=GRAM_RTOL, atol=GRAM_ATOL)
