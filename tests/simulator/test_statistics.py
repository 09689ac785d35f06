"""Token statistics: every metric from the sufficient statistics equals the metric of the matrix."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.linalg
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
    redo_unconverged,
    token_statistics,
    unconverged,
)
from oversmooth.simulator.tolerances import EPS, GRAM_ATOL, GRAM_DEFECT_ULPS, GRAM_RTOL

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


def _gram(seed: int, k: int, rank: int, scale: float) -> np.ndarray:
    """A k×k Gram matrix X Xᵀ of rank ``rank`` (at most), entries of order ``scale``."""
    x = np.random.default_rng(seed).standard_normal((k, rank)) * np.sqrt(scale / rank)
    return x @ x.T


def _rotated_diagonal(gram: np.ndarray, angle: float, seed: int) -> np.ndarray:
    """What a Jacobi method stopped early returns: the diagonal of Qᵀ G Q for Q the eigenvectors
    turned by a random rotation of size ``angle``, sorted."""
    k = len(gram)
    skew = np.random.default_rng(seed).standard_normal((k, k))
    skew = (skew - skew.T) / np.linalg.norm(skew - skew.T, 2)
    _, vectors = np.linalg.eigh(gram)
    q = vectors @ scipy.linalg.expm(angle * skew)
    return np.sort(np.diag(q.T @ gram @ q))


@given(
    seed=seeds,
    k=st.sampled_from([2, 16, 257]),
    rank=st.integers(min_value=1, max_value=300),
    exponent=st.integers(min_value=-30, max_value=30),
)
def test_lapacks_own_spectra_pass_the_frobenius_check(
    seed: int, k: int, rank: int, exponent: int
) -> None:
    """No false alarm: LAPACK's eigenvalues of Grams of any rank and scale are kept."""
    gram = _gram(seed, k, rank, 10.0**exponent)
    assert not unconverged(gram, np.linalg.eigvalsh(gram)).any()


@given(seed=seeds, angle_exponent=st.floats(min_value=-12, max_value=-1))
def test_a_kept_spectrum_is_within_the_wielandt_hoffman_bound(
    seed: int, angle_exponent: float
) -> None:
    """Whatever a stopped Jacobi run returns, a spectrum the check keeps lies within
    sqrt(2 · GRAM_DEFECT_ULPS · k ε) ‖G‖_F of the eigenvalues (the factor 2 for the sums'
    round-off); comparing traces instead, which rotations keep, would keep every one of them."""
    k = 64
    gram = _gram(seed, k, rank=80, scale=1.0)
    stopped = _rotated_diagonal(gram, 10.0**angle_exponent, seed)
    if not unconverged(gram, stopped):
        error = np.linalg.norm(np.linalg.eigvalsh(gram) - stopped)
        assert error <= np.sqrt(2 * GRAM_DEFECT_ULPS * k * EPS) * np.linalg.norm(gram)


def test_a_stopped_solvers_spectra_are_recomputed_on_the_host_and_only_those() -> None:
    grams = np.stack([_gram(seed, 257, 384, 1.0) for seed in range(4)]).reshape(2, 2, 257, 257)
    exact = np.linalg.eigvalsh(grams)
    given_eig = exact.copy()
    given_eig[0, 1] = _rotated_diagonal(grams[0, 1], 1e-2, seed=1)  # stopped early
    given_eig[1, 1] = np.sort(np.diag(grams[1, 1]))  # stopped before any sweep
    given_eig[1, 0] *= 1 + 4 * EPS  # a round-off difference is kept as given
    assert unconverged(grams, given_eig).tolist() == [[False, True], [False, True]]
    redone = redo_unconverged(grams, given_eig)
    np.testing.assert_array_equal(redone[:, 1], exact[:, 1])
    np.testing.assert_array_equal(redone[:, 0], given_eig[:, 0])
    assert not np.shares_memory(redone, given_eig)
