"""The depth step's mathematics (simulator.depth): |λ₂|, per-head growth, non-normality, products.

Hand-built matrices with known spectra pin each definition; property tests check them against the
dense spectrum of A and against Lemma 1's Kronecker spectrum on random attention.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from oversmooth.simulator.depth import (
    geometric_mean,
    head_growth,
    nonnormality,
    predicted_curve,
    quotient_spectrum,
    second_eigenvalue_modulus,
)
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.theory import kron_eigenvalues, perron_index
from oversmooth.simulator.tolerances import EIG_TOL, STEP_ATOL, STEP_RTOL
from tests.strategies import attention_params, build_attention, real_spectra, seeds


def _stochastic_with_spectrum(eigenvalues: list[float], seed: int = 0) -> np.ndarray:
    """A row-stochastic matrix with eigenvalues 1 and ``eigenvalues``: ``A = 𝟙πᵀ + Q diag Q⁻¹``
    on 𝟙^⊥, Q an orthonormal basis of 𝟙^⊥ (so A𝟙 = 𝟙; entries may be negative, which the
    definitions allow for the check; here they are kept small so that A stays nonnegative)."""
    n = len(eigenvalues) + 1
    basis = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, 1:]]))[0][:, 1:]
    rotation = np.linalg.qr(np.random.default_rng(seed).standard_normal((n - 1, n - 1)))[0]
    Q = basis @ rotation
    return np.full((n, n), 1.0 / n) + Q @ np.diag(eigenvalues) @ Q.T


def test_second_eigenvalue_of_a_hand_built_matrix() -> None:
    A = _stochastic_with_spectrum([0.3, -0.25, 0.1, 0.05], seed=3)
    assert np.all(A >= 0)
    assert_allclose(np.sort(quotient_spectrum(A).real), [-0.25, 0.05, 0.1, 0.3], atol=EIG_TOL)
    assert second_eigenvalue_modulus(A) == pytest.approx(0.3, rel=EIG_TOL)


def test_a_repeated_perron_root_is_reported_not_dropped() -> None:
    # the identity and a block-diagonal A: eigenvalue 1 twice; |λ₂| = 1 exactly
    assert second_eigenvalue_modulus(np.eye(5)) == pytest.approx(1.0, rel=STEP_RTOL)
    block = np.full((2, 2), 0.5)
    A = np.block([[block, np.zeros((2, 2))], [np.zeros((2, 2)), block]])
    assert second_eigenvalue_modulus(A) == pytest.approx(1.0, rel=STEP_RTOL)
    # a rank-one A (every row π): every other eigenvalue is 0
    assert second_eigenvalue_modulus(np.tile([0.1, 0.2, 0.7], (3, 1))) < STEP_ATOL


def test_a_conjugate_pair_counts_once_and_a_permutation_has_modulus_one() -> None:
    cycle = np.roll(np.eye(3), 1, axis=1)  # eigenvalues: the three cube roots of unity
    rest = quotient_spectrum(cycle)
    assert_allclose(np.sort(rest.imag), [-np.sqrt(3) / 2, np.sqrt(3) / 2], atol=EIG_TOL)
    assert second_eigenvalue_modulus(cycle) == pytest.approx(1.0, rel=EIG_TOL)


def test_one_token_has_no_second_eigenvalue() -> None:
    assert quotient_spectrum(np.ones((1, 1))).shape == (0,)
    assert np.isnan(second_eigenvalue_modulus(np.ones((1, 1))))
    rho_lfc, rho_q = head_growth(np.zeros(0), [0.5, -0.2])
    assert (rho_lfc, rho_q) == (pytest.approx(1.5), 0.0)


def test_refuses_a_matrix_that_is_not_stochastic() -> None:
    with pytest.raises(InputError, match="row-stochastic"):
        second_eigenvalue_modulus(np.array([[0.5, 0.6], [0.5, 0.5]]))


@given(attention_params(), st.integers(1, 3))
def test_quotient_spectrum_is_eig_a_less_its_perron_root(params: dict, batch: int) -> None:
    A = build_attention(params, batch=(batch,))
    full = np.linalg.eigvals(A)
    for k in range(batch):
        expected = np.delete(full[k], perron_index(full[k]))
        got = quotient_spectrum(A[k])
        # as multisets: sort by (real, imag) after rounding away the solvers' round-off
        key = lambda z: np.lexsort((np.round(z.imag, 6), np.round(z.real, 6)))  # noqa: E731
        assert_allclose(got[key(got)], expected[key(expected)], atol=1e-6)
        assert second_eigenvalue_modulus(A[k]) == pytest.approx(
            np.abs(expected).max(), rel=1e-6, abs=1e-9
        )
    assert second_eigenvalue_modulus(A).shape == (batch,)


@given(attention_params(n=(2, 8)), real_spectra(min_size=1, max_size=5))
def test_head_growth_splits_lemma_1_at_the_perron_row(params: dict, eig_H: list[float]) -> None:
    A = build_attention(params)
    eig_A = np.linalg.eigvals(A)
    mu = kron_eigenvalues(eig_A, np.asarray(eig_H, dtype=complex))  # (n, d): 1 + λ^H_j λ^A_i
    perron = perron_index(eig_A)
    rho_lfc, rho_q = head_growth(quotient_spectrum(A), eig_H)
    assert rho_lfc == pytest.approx(np.abs(mu[perron]).max(), rel=1e-9)
    assert rho_q == pytest.approx(np.abs(np.delete(mu, perron, axis=0)).max(), rel=1e-6, abs=1e-9)


def test_head_growth_by_hand() -> None:
    # A with eigenvalues 1, -0.5, 0.2; H with -1.5 and 0.4: LFC max(|-0.5|, 1.4) = 1.4,
    # HFC max |1 + λ^H λ| = |1 + (-1.5)(-0.5)| = 1.75
    A = _stochastic_with_spectrum([-0.5, 0.2])
    rho_lfc, rho_q = head_growth(quotient_spectrum(A), [-1.5, 0.4])
    assert rho_lfc == pytest.approx(1.4, rel=STEP_RTOL)
    assert rho_q == pytest.approx(1.75, rel=EIG_TOL)


def test_a_normal_matrix_has_ratio_one() -> None:
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((6, 6)))[0]
    symmetric = Q @ np.diag([2.0, -1.0, 0.5, 0.3, -0.2, 0.1]) @ Q.T
    ratio, asymmetry = nonnormality(symmetric, np.eye(6))
    assert ratio == pytest.approx(1.0, rel=1e-12)
    assert asymmetry == pytest.approx(0.0, abs=STEP_ATOL)
    rotation = np.array([[0.0, -2.0], [2.0, 0.0]])  # normal, skew-symmetric
    ratio, asymmetry = nonnormality(rotation, np.eye(2))
    assert ratio == pytest.approx(1.0, rel=1e-12)
    assert asymmetry == pytest.approx(2.0, rel=STEP_RTOL)


def test_a_jordan_block_is_far_from_normal() -> None:
    # J = [[λ, 1], [0, λ]]: ρ = λ and σ_max(J) > 1, so for λ = 0.01 the ratio exceeds 100
    lam = 0.01
    J = np.array([[lam, 1.0], [0.0, lam]])
    ratio, asymmetry = nonnormality(J, np.eye(2))
    assert ratio == pytest.approx(np.linalg.norm(J, 2) / lam, rel=1e-9)
    assert ratio > 99
    assert asymmetry == pytest.approx(np.sqrt(2) / np.linalg.norm(J), rel=STEP_RTOL)


def test_nilpotent_and_zero_products() -> None:
    ratio, _ = nonnormality(np.array([[0.0, 1.0], [0.0, 0.0]]), np.eye(2))
    assert ratio == np.inf
    ratio, asymmetry = nonnormality(np.zeros((3, 2)), np.zeros((2, 3)))
    assert (ratio, asymmetry) == (1.0, 0.0)


@given(st.integers(2, 7), st.integers(1, 4), seeds())
def test_factored_nonnormality_is_that_of_the_product(d: int, r: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    W_V, W_O = rng.standard_normal((2, d, r)), rng.standard_normal((2, r, d))
    ratio, asymmetry = nonnormality(W_V, W_O)
    M = W_V @ W_O
    rho = np.abs(np.linalg.eigvals(M)).max(axis=-1)
    dense_ratio = np.linalg.norm(M, 2, axis=(-2, -1)) / rho
    assert_allclose(ratio, np.maximum(dense_ratio, 1.0), rtol=1e-6)
    skew = np.linalg.norm(M - np.swapaxes(M, -1, -2), axis=(-2, -1))
    assert_allclose(asymmetry, skew / np.linalg.norm(M, axis=(-2, -1)), rtol=STEP_RTOL)
    assert np.all(ratio >= 1.0)
    assert np.all((asymmetry >= 0) & (asymmetry <= 2 * (1 + STEP_RTOL)))


def test_geometric_mean_and_the_product_over_depth() -> None:
    assert geometric_mean([2.0, 0.5, np.nan]) == pytest.approx(1.0, rel=STEP_RTOL)
    assert geometric_mean([4.0, 1.0]) == pytest.approx(2.0, rel=STEP_RTOL)
    assert geometric_mean([0.0, 3.0]) == 0.0
    assert np.isnan(geometric_mean([np.nan]))
    with pytest.raises(InputError):
        geometric_mean([-1.0])
    # by hand: 2 at layer 0, blocks growing ×3, ×0.5, ×2 -> 2, 6, 3, 6
    assert_allclose(predicted_curve(2.0, [3.0, 0.5, 2.0]), [2.0, 6.0, 3.0, 6.0], rtol=STEP_RTOL)
    curve = predicted_curve(1.0, [2.0, np.nan, 2.0])
    assert curve[1] == 2.0
    assert np.isnan(curve[2:]).all()
