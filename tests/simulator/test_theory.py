"""oversmooth.simulator.theory: Lemma 1, the corner theorem, dominance kinds, value spectra and predictions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose
from scipy.optimize import linear_sum_assignment

from oversmooth.simulator import dynamics, metrics, spectra, theory, updates
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.errors import InputError, NumericalFloorWarning
from tests.strategies import (
    attention_params,
    build_attention,
    build_h,
    complex_spectra,
    h_params,
    real_spectra,
    seeds,
)


def _matched_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Largest distance between two complex multisets under the best one-to-one matching."""
    cost = np.abs(np.ravel(a)[:, None] - np.ravel(b)[None, :])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


def _linear_rule(A: np.ndarray, H: np.ndarray) -> updates.LinearRule:
    return updates.LinearRule(A, H.T, np.eye(H.shape[0]))


# ----------------------------------------------------------------------------------------------
# Lemma 1 (claim 2) against the dense nd x nd eigensolver
# ----------------------------------------------------------------------------------------------


@given(a=attention_params(n=(2, 6)), h=h_params(d=(1, 5), symmetric=False))
def test_lemma1_real_h_matches_dense_eig(a: dict, h: dict) -> None:
    A, H = build_attention(a), build_h(h)
    dense = np.linalg.eigvals(np.eye(A.shape[0] * H.shape[0]) + np.kron(H, A))
    mu = theory.kron_eigenvalues(np.linalg.eigvals(A), np.linalg.eigvals(H))
    assert mu.shape == (A.shape[0], H.shape[0])
    assert _matched_distance(dense, mu) <= tol.EIG_TOL * (1 + np.abs(mu).max())


@given(a=attention_params(n=(2, 5)), lam=complex_spectra(max_pairs=2, max_real=2), seed=seeds())
def test_lemma1_complex_h_matches_dense_eig(a: dict, lam: list[complex], seed: int) -> None:
    A = build_attention(a)
    H = spectra.h_nonsymmetric(lam, rng=seed)
    dense = np.linalg.eigvals(np.eye(A.shape[0] * H.shape[0]) + np.kron(H, A))
    mu = theory.kron_eigenvalues(np.linalg.eigvals(A), lam)
    assert _matched_distance(dense, mu) <= tol.EIG_TOL * (1 + np.abs(mu).max())


def test_kron_eigenvalues_broadcasts_batches() -> None:
    eig_A = np.array([[1.0, 0.5], [1.0, -0.2]])
    eig_H = np.array([2.0, -1.0, 0.5])
    mu = theory.kron_eigenvalues(eig_A, eig_H)
    assert mu.shape == (2, 2, 3)
    assert_allclose(mu[1, 1], 1 + (-0.2) * eig_H, rtol=tol.STEP_RTOL)


# ----------------------------------------------------------------------------------------------
# the corner theorem S1 (claim 8) and dominance
# ----------------------------------------------------------------------------------------------


@given(
    a=attention_params(kinds=("symmetric", "psd", "doubly-stochastic"), scale=(0.5, 3.0)),
    h=h_params(d=(1, 8), low=-3.0, high=3.0),
)
def test_the_dominating_modulus_is_a_corner_value(a: dict, h: dict) -> None:
    A = build_attention(a)
    dom = theory.dominance(A, build_h(h))
    lam_A = np.sort(dom.eig_A.real)
    lam_H = np.sort(dom.eig_H.real)
    corners = [abs(1 + x * y) for x in (lam_H[0], lam_H[-1]) for y in (lam_A[0], lam_A[-1])]
    assert dom.modulus == pytest.approx(max(corners), rel=tol.STEP_RTOL)
    mu = theory.kron_eigenvalues(dom.eig_A, dom.eig_H)
    for i, j in dom.modes:  # the tie criterion itself: within TIE_RTOL of the top, inclusive
        assert dom.modulus * (1 - theory.TIE_RTOL) <= abs(mu[i, j]) <= dom.modulus


@given(a=attention_params(scale=(0.5, 2.0)), h=h_params(low=0.05, high=2.0))
def test_positive_h_is_perron_dominated(a: dict, h: dict) -> None:
    dom = theory.dominance(build_attention(a), build_h(h))
    assert dom.kind == "perron"
    assert all(i == dom.perron for i, _ in dom.modes)
    assert dom.mu.real == pytest.approx(1 + max(h["eigenvalues"]), rel=tol.BOUND_RTOL)


@given(a=attention_params(scale=(0.5, 2.0)), h=h_params(low=-1.0, high=-0.05))
def test_negative_h_is_never_perron_dominated(a: dict, h: dict) -> None:
    dom = theory.dominance(build_attention(a), build_h(h))
    assert dom.kind in ("non-perron", "balanced")
    assert all(i != dom.perron for i, _ in dom.modes)


@settings(max_examples=20)
@given(a=attention_params(kinds=("symmetric",), n=(4, 10), scale=(1.0, 2.0)), seed=seeds())
def test_balanced_s4_construction_is_a_balanced_tie(a: dict, seed: int) -> None:
    A = build_attention(a)
    lam_1 = float(np.min(np.linalg.eigvals(A).real))
    assume(lam_1 <= -0.05)  # S4 needs a clearly negative lambda^A_1
    H = spectra.h_symmetric([-lam_1, -1.0, 0.01], rng=seed)
    dom = theory.dominance(A, H)
    assert dom.kind == "balanced"
    assert len(dom.modes) == 2
    (i1, j1), (i2, j2) = dom.modes
    assert i1 != i2
    assert j1 != j2
    # Moving the balanced eigenvalue breaks the tie in either direction.
    for shift in (1e-3, -1e-3):
        kind = theory.dominance(A, spectra.h_symmetric([-lam_1 + shift, -1.0, 0.01], rng=seed))
        assert kind.kind != "balanced"


@settings(max_examples=20)
@given(a=attention_params(kinds=("symmetric",), n=(4, 10), scale=(1.0, 2.0)), seed=seeds())
def test_balanced_rate_counts_the_other_modes_of_the_dominating_rows(a: dict, seed: int) -> None:
    A = build_attention(a)
    lam_A = np.sort(np.linalg.eigvals(A).real)
    assume(lam_A[0] <= -0.05)
    # The third H eigenvalue puts a slow correction in the Perron row itself: the limit is rank two
    # (S4), so that mode still moves sigma2/sigma1 and may set the rate.
    dom = theory.dominance(A, spectra.h_symmetric([-lam_A[0], -1.0, -0.95 * lam_A[0]], rng=seed))
    assume(dom.kind == "balanced")
    mu = np.abs(theory.kron_eigenvalues(dom.eig_A, dom.eig_H))
    dominating = np.zeros(mu.shape, dtype=bool)
    dominating[tuple(np.array(dom.modes).T)] = True
    slowest = np.unravel_index(np.argmax(np.where(dominating, -np.inf, mu)), mu.shape)
    assume(any(slowest[0] == i for i, _ in dom.modes))  # the slowest mode shares a dominating row
    assert dom.rate == pytest.approx(mu[slowest] / dom.modulus, rel=tol.STEP_RTOL)


def test_a_tie_within_one_h_eigenvector_is_not_balanced() -> None:
    # A = 11^T/2 has eigenvalues {0, 1}; with lambda^H = -2 both rows give |mu| = 1 in one column.
    A = np.full((2, 2), 0.5)
    dom = theory.dominance(A, [[-2.0]])
    assert len(dom.modes) == 2
    assert dom.kind == "non-perron"


def test_a_tie_within_one_a_eigenvector_is_not_balanced() -> None:
    A = spectra.attention_symmetric_scores(5, rng=3)
    dom = theory.dominance(A, np.diag([0.5, 0.5, 0.1]))
    assert len(dom.modes) == 2
    assert dom.kind == "perron"


@given(
    a=attention_params(n=(2, 8)),
    lam=st.lists(real_spectra(min_size=3, max_size=3, low=-2.0, high=2.0), min_size=4, max_size=4),
)
def test_dominance_kinds_batch_equals_one_at_a_time(a: dict, lam: list[list[float]]) -> None:
    A = build_attention(a, batch=(4,))
    eig_A = np.linalg.eigvals(A)
    eig_H = np.asarray(lam)
    kinds = theory.dominance_kinds(eig_A, eig_H)
    assert kinds.shape == (4,)
    for k in range(4):
        single = theory.dominance(A[k], np.diag(eig_H[k]))
        assert theory.KINDS[kinds[k]] == single.kind


def test_perron_index_picks_the_eigenvalue_closest_to_one() -> None:
    assert theory.perron_index([0.3, 0.999, -0.9, 0.5]) == 1
    assert theory.perron_index(np.array([[1.0, 0.2], [0.1, 1.0 - 1e-15]])).tolist() == [0, 1]


@given(a=attention_params(kinds=("symmetric", "general"), scale=(0.5, 1.5)))
def test_perron_rate_is_the_largest_non_perron_modulus_ratio(a: dict) -> None:
    A = build_attention(a)
    lam_H = [0.2, 0.7]
    dom = theory.dominance(A, np.diag(lam_H))
    mu = np.abs(theory.kron_eigenvalues(dom.eig_A, lam_H))
    expected = np.delete(mu, dom.perron, axis=0).max() / 1.7
    assert dom.rate == pytest.approx(expected, rel=tol.STEP_RTOL)


@given(a=attention_params(kinds=("symmetric",), scale=(0.5, 1.5)))
def test_non_perron_rate_ignores_modes_sharing_the_dominating_a_eigenvector(a: dict) -> None:
    A = build_attention(a)
    lam_H = [-0.9, -0.3]  # the dominating row i = argmin lambda^A also holds the -0.3 mode
    dom = theory.dominance(A, np.diag(lam_H))
    assert dom.kind == "non-perron"
    mu = np.abs(theory.kron_eigenvalues(dom.eig_A, lam_H))
    rows = {i for i, _ in dom.modes}
    expected = np.delete(mu, sorted(rows), axis=0).max() / dom.modulus
    assert dom.rate == pytest.approx(expected, rel=tol.STEP_RTOL)


# ----------------------------------------------------------------------------------------------
# value_spectrum (claim 31's analogue in float64)
# ----------------------------------------------------------------------------------------------


@given(d=st.integers(2, 8), d_v=st.integers(1, 8), seed=seeds())
def test_value_spectrum_equals_the_dense_product_spectrum(d: int, d_v: int, seed: int) -> None:
    gen = np.random.default_rng(seed)
    W_V = gen.standard_normal((d, d_v))
    W_proj = gen.standard_normal((d_v, d))
    got = theory.value_spectrum(W_V, W_proj)
    assert got.shape == (d,)
    dense = np.linalg.eigvals(W_V @ W_proj)
    assert _matched_distance(got, dense) <= tol.EIG_TOL * (1 + np.abs(dense).max())
    if d_v < d:
        assert np.count_nonzero(got == 0) >= d - d_v
        small = np.linalg.eigvals(W_proj @ W_V)
        assert _matched_distance(got[:d_v], small) <= tol.STEP_ATOL * (1 + np.abs(small).max())


def test_value_spectrum_keeps_batch_axes() -> None:
    gen = np.random.default_rng(0)
    got = theory.value_spectrum(gen.standard_normal((3, 6, 2)), gen.standard_normal((3, 2, 6)))
    assert got.shape == (3, 6)
    assert np.all(got[:, 2:] == 0)


# ----------------------------------------------------------------------------------------------
# predict against iterated metrics (claims 12, 14, 15, 16)
# ----------------------------------------------------------------------------------------------


def _final_state(A: np.ndarray, H: np.ndarray, seed: int, layers: int) -> np.ndarray:
    X0 = spectra.random_tokens(A.shape[0], H.shape[0], rng=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalFloorWarning)
        return dynamics.iterate(_linear_rule(A, H), X0, layers, metrics=("hfc_lfc",)).final


def _other_rows_rate(A: np.ndarray, H: np.ndarray) -> float:
    """Convergence factor of the metrics: max |mu| outside the dominating A-eigenvector's row."""
    mu = np.abs(theory.kron_eigenvalues(np.linalg.eigvals(A), np.linalg.eigvals(H)))
    i_star = np.unravel_index(np.argmax(mu), mu.shape)[0]
    return float(np.delete(mu, i_star, axis=0).max() / mu.max())


def _layers(rate: float) -> int:
    return int(np.ceil(np.log(1e-9) / np.log(rate))) + 10


@settings(max_examples=15)
@given(
    a=attention_params(kinds=("symmetric",), n=(4, 10), scale=(0.5, 2.0)),
    h=h_params(d=(2, 6), low=-1.0, high=-0.3),
)
def test_predicted_non_perron_limits_match_iteration(a: dict, h: dict) -> None:
    A, H = build_attention(a), build_h(h)
    prediction = theory.predict(A, H)
    rate = _other_rows_rate(A, H)
    assume(prediction.hfc_lfc_limit is not None and rate <= 0.9)
    assert not prediction.input_convergence
    assert not prediction.angle_convergence
    assert prediction.rank_collapse
    assert 0 < prediction.hfc_lfc_limit < np.inf
    assert prediction.cosine_limit < 1
    X = _final_state(A, H, a["seed"], _layers(rate))
    assert metrics.hfc_lfc(X) == pytest.approx(prediction.hfc_lfc_limit, rel=tol.LIMIT_RTOL)
    assert metrics.cosine(X) == pytest.approx(prediction.cosine_limit, abs=tol.LIMIT_RTOL)
    assert metrics.sigma_ratio(X) < tol.LIMIT_RTOL


@settings(max_examples=15)
@given(
    a=attention_params(kinds=("symmetric", "general"), n=(3, 10), scale=(0.5, 1.5)),
    h=h_params(d=(1, 6), low=0.3, high=1.0),
)
def test_predicted_perron_limits_match_iteration(a: dict, h: dict) -> None:
    A, H = build_attention(a), build_h(h)
    prediction = theory.predict(A, H)
    assert prediction.input_convergence
    assert prediction.angle_convergence
    assert prediction.rank_collapse
    assert prediction.hfc_lfc_limit == 0
    assert prediction.cosine_limit == 1
    X = _final_state(A, H, a["seed"], min(_layers(prediction.rate), 3000))
    assert metrics.hfc_lfc(X) < tol.LIMIT_RTOL
    assert metrics.cosine(X) == pytest.approx(1.0, abs=tol.LIMIT_RTOL)


def test_a_balanced_prediction_has_no_rank_collapse() -> None:
    A = spectra.attention_symmetric_scores(6, scale=1.5, rng=1)
    lam_1 = float(np.min(np.linalg.eigvals(A).real))
    assert lam_1 < 0
    prediction = theory.predict(A, spectra.h_symmetric([-lam_1, -1.0, 0.05], rng=2))
    assert prediction.dominance.kind == "balanced"
    assert not prediction.rank_collapse
    assert prediction.hfc_lfc_limit is None
    assert prediction.cosine_limit is None


def test_a_complex_dominating_pair_has_no_single_limit() -> None:
    n = 3
    cycle = np.roll(np.eye(n), 1, axis=1)
    A = (0.05 * np.ones((n, n)) + 0.1 * np.eye(n) + 0.9 * cycle) / 1.15
    prediction = theory.predict(A, [[-1.0]])
    assert abs(prediction.dominance.mu.imag) > 0.1
    assert prediction.hfc_lfc_limit is None
    assert prediction.cosine_limit is None


# ----------------------------------------------------------------------------------------------
# input validation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("A", "H", "pattern"),
    [
        ([[0.5, 0.6], [0.5, 0.5]], [[1.0]], "`A` must be row-stochastic"),
        ([[1.2, -0.2], [0.5, 0.5]], [[1.0]], "nonnegative entries"),
        ([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]], [[1.0]], "`A` must be square"),
        ([[0.5, 0.5], [0.5, 0.5]], [[1.0, 2.0]], "`H` must be square"),
        ([[0.5, 0.5], [0.5, 0.5]], [[np.nan]], "`H` must be finite"),
        (np.full((2, 2, 2), 0.5), [[1.0]], "single matrices"),
        ("not a matrix", [[1.0]], "`A` must be a real numeric array"),
    ],
)
def test_dominance_and_predict_reject_bad_input(A, H, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        theory.dominance(A, H)
    with pytest.raises(InputError, match=pattern):
        theory.predict(A, H)


def test_value_spectrum_rejects_mismatched_shapes() -> None:
    with pytest.raises(InputError, match="`W_proj` must have shape \\(2, 3\\)"):
        theory.value_spectrum(np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(InputError, match="`W_V` must have at least 2 axes"):
        theory.value_spectrum(np.ones(3), np.ones((3, 3)))
