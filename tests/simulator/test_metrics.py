"""Smoothing metrics: the frequency split (claim 6), invariances (claim 7), Def. 3 vs Dong's residual
(claim 30), documented degenerate values, batching and the spectral-norm option."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import (
    METRICS,
    all_metrics,
    cosine,
    dong_residual,
    effective_rank,
    hfc_lfc,
    hfc_lfc_limit,
    lfc_hfc_split,
    rank1_residual,
    sigma_ratio,
)
from oversmooth.simulator.tolerances import FLOOR, STEP_ATOL, STEP_RTOL

sizes = st.integers(min_value=2, max_value=8)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
scales = st.floats(min_value=1e-3, max_value=1e3).flatmap(lambda c: st.sampled_from([c, -c]))


def _tokens(n, d, seed):
    return np.random.default_rng(seed).standard_normal((n, d))


def _orthogonal(d, seed):
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return Q


@given(n=sizes, d=sizes, seed=seeds)
def test_claim6_frequency_split(n, d, seed):
    X = _tokens(n, d, seed)
    lfc, hfc = lfc_hfc_split(X)
    np.testing.assert_allclose(lfc + hfc, X, rtol=STEP_RTOL, atol=STEP_ATOL)
    np.testing.assert_allclose(
        np.sum(X**2), np.sum(lfc**2) + np.sum(hfc**2), rtol=STEP_RTOL, atol=STEP_ATOL
    )
    assert np.linalg.matrix_rank(lfc) <= 1
    np.testing.assert_allclose(
        np.linalg.norm(lfc, 2), np.linalg.norm(lfc, "fro"), rtol=STEP_RTOL, atol=STEP_ATOL
    )
    np.testing.assert_allclose(hfc.sum(axis=0), 0.0, atol=STEP_ATOL * n)
    ratio = np.linalg.norm(hfc) / np.linalg.norm(lfc)
    np.testing.assert_allclose(hfc_lfc(X), ratio, rtol=STEP_RTOL)


@given(n=sizes, d=sizes, seed=seeds, c=scales)
def test_claim7_scale_invariance(n, d, seed, c):
    X = _tokens(n, d, seed)
    for metric in (hfc_lfc, cosine, sigma_ratio):
        np.testing.assert_allclose(metric(c * X), metric(X), rtol=STEP_RTOL, atol=STEP_ATOL)


@given(n=sizes, d=sizes, seed=seeds)
def test_claim7_right_orthogonal_invariance(n, d, seed):
    X = _tokens(n, d, seed)
    Q = _orthogonal(d, seed + 1)
    for metric in (hfc_lfc, sigma_ratio):
        np.testing.assert_allclose(metric(X @ Q), metric(X), rtol=STEP_RTOL, atol=STEP_ATOL)


@given(n=sizes, d=sizes, seed=seeds)
def test_claim30_rank_one_is_not_dong_collapse(n, d, seed):
    """X = u v^T with u not parallel to 1: rank-1 residual 0, Dong's mean residual > 0."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(n)
    u[0] += 1.0 + abs(u).max()  # u is not a multiple of 1
    v = rng.standard_normal(d)
    X = np.outer(u, v)
    assert rank1_residual(X) <= FLOOR
    assert sigma_ratio(X) <= FLOOR
    assert dong_residual(X) > FLOOR
    np.testing.assert_allclose(hfc_lfc(X), hfc_lfc_limit(u), rtol=STEP_RTOL)


def test_dong_residual_vanishes_for_identical_rows(rng):
    X = np.tile(rng.standard_normal(4), (5, 1))
    assert dong_residual(X) <= FLOOR
    assert hfc_lfc(X) <= FLOOR
    np.testing.assert_allclose(cosine(X), 1.0, rtol=STEP_RTOL)


# ---------------------------------------------------------------------------------------------
# documented degenerate values
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(METRICS))
def test_one_token_is_an_input_error(name):
    with pytest.raises(InputError, match="at least 2 tokens"):
        METRICS[name](np.ones((1, 3)))


@pytest.mark.parametrize("name", list(METRICS))
def test_zero_matrix_is_nan(name):
    assert np.isnan(METRICS[name](np.zeros((4, 3))))


def test_zero_rows_are_left_out_of_the_cosine(rng):
    X = rng.standard_normal((4, 3))
    padded = np.vstack([X, np.zeros((2, 3))])
    np.testing.assert_allclose(cosine(padded), cosine(X), rtol=STEP_RTOL)
    one_row = np.vstack([X[:1], np.zeros((3, 3))])
    assert np.isnan(cosine(one_row))


def test_hfc_lfc_is_inf_when_the_token_mean_is_zero(rng):
    x = rng.standard_normal(3)
    X = np.vstack([x, -x])
    assert hfc_lfc(X) == np.inf
    assert hfc_lfc_limit(np.array([1.0, -1.0])) == np.inf


def test_cosine_of_opposite_tokens(rng):
    x = rng.standard_normal(3)
    X = np.vstack([x, -x, x, -x])
    # pairs: 4 of cos +1 ((0,2),(1,3) both orders) and 8 of cos -1, over 12 ordered pairs
    np.testing.assert_allclose(cosine(X), (4 - 8) / 12, rtol=STEP_RTOL)
    np.testing.assert_allclose(cosine(X, absolute=True), 1.0, rtol=STEP_RTOL)


# ---------------------------------------------------------------------------------------------
# batching, options, ranges
# ---------------------------------------------------------------------------------------------


@given(n=sizes, d=sizes, seed=seeds, batch=st.integers(1, 4))
def test_batching_equals_looping(n, d, seed, batch):
    X = np.random.default_rng(seed).standard_normal((batch, 2, n, d))
    batched = all_metrics(X)
    for name, values in batched.items():
        assert values.shape == (batch, 2)
        for index in np.ndindex(batch, 2):
            np.testing.assert_allclose(
                values[index], METRICS[name](X[index]), rtol=STEP_RTOL, atol=STEP_ATOL
            )


@given(n=sizes, d=sizes, seed=seeds)
def test_spectral_norm_option(n, d, seed):
    X = _tokens(n, d, seed)
    lfc, hfc = lfc_hfc_split(X)
    expected = np.linalg.norm(hfc, 2) / np.linalg.norm(lfc, 2)
    np.testing.assert_allclose(hfc_lfc(X, norm="spectral"), expected, rtol=STEP_RTOL)
    assert hfc_lfc(X, norm="spectral") <= hfc_lfc(X) * (1 + STEP_RTOL)
    with pytest.raises(InputError, match="`norm`"):
        hfc_lfc(X, norm="nuclear")


@given(n=sizes, d=sizes, seed=seeds)
def test_metric_ranges(n, d, seed):
    X = _tokens(n, d, seed)
    assert -1.0 - STEP_ATOL <= cosine(X) <= 1.0 + STEP_ATOL
    assert cosine(X) <= cosine(X, absolute=True) + STEP_ATOL
    assert 0.0 <= sigma_ratio(X) <= 1.0
    assert 0.0 <= rank1_residual(X) <= 1.0
    assert sigma_ratio(X) <= rank1_residual(X) * np.sqrt(min(n, d)) + STEP_ATOL
    assert 1.0 - STEP_ATOL <= effective_rank(X) <= min(n, d) + STEP_ATOL


def test_metrics_reject_non_finite_input():
    X = np.ones((3, 2))
    X[1, 1] = np.inf
    with pytest.raises(InputError, match="finite"):
        hfc_lfc(X)
