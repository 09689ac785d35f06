"""oversmooth.simulator.spectra: every generator's invariants, seeds, batch shapes and input errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose, assert_array_equal
from scipy.optimize import linear_sum_assignment

from oversmooth.simulator import spectra
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.errors import InputError
from tests.strategies import (
    attention_params,
    build_attention,
    complex_spectra,
    real_spectra,
    seeds,
)


def _matched_distance(a: np.ndarray, b: np.ndarray) -> float:
    cost = np.abs(np.ravel(a)[:, None] - np.ravel(b)[None, :])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


def _assert_positive_row_stochastic(A: np.ndarray) -> None:
    assert np.all(A > 0)
    assert_allclose(A.sum(axis=-1), 1.0, rtol=0, atol=tol.STEP_ATOL)


def _stationary(A: np.ndarray) -> np.ndarray:
    lam, W = np.linalg.eig(A.T)
    pi = np.real(W[:, np.argmin(np.abs(lam - 1))])
    return pi / pi.sum()


# ----------------------------------------------------------------------------------------------
# attention matrices
# ----------------------------------------------------------------------------------------------


@given(params=attention_params(scale=(0.1, 3.0)))
def test_every_attention_generator_is_positive_and_row_stochastic(params: dict) -> None:
    A = build_attention(params)
    assert A.shape == (params["n"], params["n"])
    _assert_positive_row_stochastic(A)


@given(params=attention_params(kinds=("symmetric", "psd"), scale=(0.1, 2.0)))
def test_symmetric_scores_give_a_reversible_a_with_real_spectrum(params: dict) -> None:
    A = build_attention(params)
    lam = np.linalg.eigvals(A)
    assert np.abs(lam.imag).max() <= tol.EIG_TOL
    # A = D^{-1} E with E symmetric is reversible: pi_i A_ij = pi_j A_ji (similar to symmetric).
    flow = _stationary(A)[:, None] * A
    assert_allclose(flow, flow.T, rtol=0, atol=tol.EIG_TOL * flow.max())


@given(
    n=st.integers(2, 12),
    scale=st.floats(0.1, 3.0),
    rank=st.integers(1, 12),
    seed=seeds(),
)
def test_psd_scores_give_a_spectrum_in_0_1(n: int, scale: float, rank: int, seed: int) -> None:
    A = spectra.attention_symmetric_scores(n, scale=scale, scores="psd", rank=rank, rng=seed)
    lam = np.linalg.eigvals(A).real
    assert lam.min() >= -tol.EIG_TOL
    assert lam.max() <= 1 + tol.EIG_TOL


def test_indefinite_scores_reach_negative_eigenvalues() -> None:
    smallest = [
        np.linalg.eigvals(spectra.attention_symmetric_scores(8, scale=1.5, rng=s)).real.min()
        for s in range(10)
    ]
    assert min(smallest) < -0.05


@given(params=attention_params(kinds=("doubly-stochastic",), scale=(0.1, 3.0)))
def test_doubly_stochastic_is_symmetric_with_mean_free_eigenvectors(params: dict) -> None:
    A = build_attention(params)
    assert_allclose(A, A.T, rtol=0, atol=tol.STEP_ATOL)
    assert_allclose(A.sum(axis=0), 1.0, rtol=0, atol=tol.STEP_ATOL)
    lam, U = np.linalg.eigh(A)
    assert lam[-1] == pytest.approx(1.0, abs=tol.EIG_TOL)
    # Every non-Perron eigenvector is orthogonal to 1 (claim 13).
    assert np.abs(U[:, :-1].sum(axis=0)).max() <= tol.EIG_TOL


def test_general_attention_reaches_complex_spectra() -> None:
    imaginary = [
        np.abs(np.linalg.eigvals(spectra.attention_general(6, rng=s)).imag).max() for s in range(10)
    ]
    assert max(imaginary) > 0.01


# ----------------------------------------------------------------------------------------------
# value-projection matrices H
# ----------------------------------------------------------------------------------------------


@given(lam=real_spectra(max_size=10, low=-3.0, high=3.0), seed=seeds())
def test_h_symmetric_has_exactly_the_prescribed_spectrum(lam: list[float], seed: int) -> None:
    H = spectra.h_symmetric(lam, rng=seed)
    assert_allclose(H, H.T, rtol=0, atol=tol.STEP_ATOL)
    assert_allclose(
        np.linalg.eigvalsh(H), np.sort(lam), rtol=0, atol=tol.EIG_TOL * (1 + max(map(abs, lam)))
    )


@given(lam=real_spectra(min_size=1, max_size=8), seed=seeds())
def test_h_nonsymmetric_real_spectrum(lam: list[float], seed: int) -> None:
    H = spectra.h_nonsymmetric(lam, rng=seed)
    assert H.dtype == np.float64
    scale = 1 + max(map(abs, lam))
    assert _matched_distance(np.linalg.eigvals(H), np.asarray(lam)) <= tol.EIG_TOL * scale


@given(lam=complex_spectra(), condition=st.floats(1.0, 100.0), seed=seeds())
def test_h_nonsymmetric_complex_pairs(lam: list[complex], condition: float, seed: int) -> None:
    H = spectra.h_nonsymmetric(lam, condition=condition, rng=seed)
    assert np.isrealobj(H)
    scale = condition * (1 + max(map(abs, lam)))
    assert _matched_distance(np.linalg.eigvals(H), np.asarray(lam)) <= tol.EIG_TOL * scale


def test_h_nonsymmetric_is_not_symmetric() -> None:
    H = spectra.h_nonsymmetric([0.5, -0.3, 1.0], rng=0)
    assert np.abs(H - H.T).max() > 0.01


# ----------------------------------------------------------------------------------------------
# the reparameterization (claim 23)
# ----------------------------------------------------------------------------------------------


@given(
    d=st.integers(1, 10),
    sign=st.sampled_from(["plus", "minus"]),
    psi_scale=st.floats(0.1, 3.0),
    seed=seeds(),
)
def test_reparameterize_builds_h_with_spectrum_lambda(
    d: int, sign: str, psi_scale: float, seed: int
) -> None:
    gen = np.random.default_rng(seed)
    Theta, psi = gen.standard_normal((d, d)), psi_scale * gen.standard_normal(d)
    r = spectra.reparameterize(Theta, psi, sign)
    expected = psi**2 if sign == "plus" else np.clip(-(psi**2), -1.0, 0.0)
    assert_array_equal(r.eigenvalues, expected)
    if sign == "minus":
        assert np.all((-1 <= r.eigenvalues) & (r.eigenvalues <= 0))
    else:
        assert np.all(r.eigenvalues >= 0)
    scale = 1 + np.abs(expected).max()
    assert_allclose(r.H, r.H.T, rtol=0, atol=tol.STEP_ATOL * scale)
    assert_allclose(np.linalg.eigvalsh(r.H), np.sort(expected), rtol=0, atol=tol.EIG_TOL * scale)
    assert_allclose(r.W_V @ r.W_proj, r.H, rtol=0, atol=tol.STEP_ATOL * scale)
    assert_allclose(r.V.T @ r.V, np.eye(d), rtol=0, atol=tol.STEP_ATOL)


# ----------------------------------------------------------------------------------------------
# seeds and batches
# ----------------------------------------------------------------------------------------------

GENERATORS = {
    "symmetric": lambda rng, batch: spectra.attention_symmetric_scores(5, batch=batch, rng=rng),
    "doubly-stochastic": lambda rng, batch: spectra.attention_doubly_stochastic(
        5, batch=batch, rng=rng
    ),
    "general": lambda rng, batch: spectra.attention_general(5, batch=batch, rng=rng),
    "h_symmetric": lambda rng, batch: spectra.h_symmetric([1.0, -0.5, 0.2], batch=batch, rng=rng),
    "tokens": lambda rng, batch: spectra.random_tokens(5, 3, batch=batch, rng=rng),
}


@pytest.mark.parametrize("name", GENERATORS)
def test_generators_are_reproducible_from_a_seed(name: str) -> None:
    make = GENERATORS[name]
    assert_array_equal(make(7, ()), make(7, ()))
    assert_array_equal(make(7, ()), make(np.random.default_rng(7), ()))
    assert not np.array_equal(make(7, ()), make(8, ()))


@pytest.mark.parametrize("name", GENERATORS)
@pytest.mark.parametrize("batch", [(), 4, (2, 3)])
def test_generators_prepend_the_batch_shape(name: str, batch: tuple[int, ...] | int) -> None:
    out = GENERATORS[name](0, batch)
    leading = (batch,) if isinstance(batch, int) else batch
    assert out.shape[: len(leading)] == leading
    assert out.ndim == len(leading) + 2


def test_h_symmetric_takes_one_spectrum_per_system() -> None:
    lam = np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, 3.0]])
    H = spectra.h_symmetric(lam, rng=0)
    assert H.shape == (3, 2, 2)
    assert_allclose(np.linalg.eigvalsh(H), np.sort(lam, axis=-1), rtol=0, atol=tol.EIG_TOL)


def test_batched_attention_systems_are_independent() -> None:
    A = spectra.attention_general(4, batch=3, rng=0)
    assert not np.array_equal(A[0], A[1])
    _assert_positive_row_stochastic(A)


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda: spectra.attention_symmetric_scores(1), r"`n` must be an integer >= 2"),
        (lambda: spectra.attention_doubly_stochastic(2.5), r"`n` must be an integer >= 2"),
        (lambda: spectra.attention_general(0), r"`n` must be an integer >= 2"),
        (lambda: spectra.random_tokens(1, 3), r"`n` must be an integer >= 2"),
        (
            lambda: spectra.attention_symmetric_scores(4, scores="positive"),
            r"`scores` must be one of psd, indefinite",
        ),
        (lambda: spectra.attention_general(4, rng=-1), r"`seed` must be a non-negative integer"),
        (lambda: spectra.h_symmetric([1.0, np.nan]), r"`eigenvalues` must be finite"),
        (lambda: spectra.h_symmetric(2.0), r"`eigenvalues` must have at least 1 axes"),
        (lambda: spectra.h_nonsymmetric([[1.0]]), r"`eigenvalues` must be one-dimensional"),
        (lambda: spectra.h_nonsymmetric([1 + 1j, 0.5]), r"conjugate pairs"),
        (
            lambda: spectra.reparameterize(np.eye(3), np.ones(2), "plus"),
            r"`Theta` must be \(d, d\) and `psi` \(d,\)",
        ),
        (
            lambda: spectra.reparameterize(np.eye(2), np.ones(2), "neutral"),
            r"`sign` must be one of",
        ),
    ],
)
def test_generators_reject_bad_input(call, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        call()


def test_doubly_stochastic_balances_nearly_decomposable_kernels_exactly():
    # A 2x2 kernel close to a permutation: the damped Sinkhorn iteration stalls near 1e-8, so
    # Newton's method finishes the balancing (found by the randomized hypothesis profile).
    A = spectra.attention_doubly_stochastic(2, scale=3.0, rng=51655953)
    np.testing.assert_allclose(A, A.T, rtol=0, atol=1e-15)
    np.testing.assert_allclose(A.sum(axis=0), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(A.sum(axis=1), 1.0, rtol=0, atol=1e-14)
