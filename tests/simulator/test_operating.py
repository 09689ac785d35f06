"""The operating-point operator (simulator.operating) against dense eig of the nd×nd T_D.

``T_D = I + Σ_h kron(M_hᵀ, A_h D)`` (column-major vec) is formed here with ``np.kron``; its
dominating eigenvalue and eigenvector, found by ``np.linalg.eig`` on that matrix, are the
reference for the module's matrix-free operator, its kind (the dominating eigenvector's place
against L = 𝟙 ⊗ R^d), its HFC share and its limit ρ*, which power iteration must reach. With
D = I the kind must be :func:`oversmooth.simulator.operator.operator_dominance`'s: a plumbing check (both
rest on the same block-triangular split), not evidence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import hfc_lfc
from oversmooth.simulator.operating import (
    limit_range,
    operating_dominance,
    operating_matrix,
    repetition_direction,
    token_inverse_scale,
)
from oversmooth.simulator.operator import HeadFactors, apply_layer, operator_dominance
from tests.simulator.test_operator import build_layer, layer_params
from tests.strategies import seeds

#: A dense relative gap |μ₂|/|μ₁| this far below 1 separates the top beyond round-off.
CLEAR_GAP = 1e-3
#: The module's numbers against the dense reference (relative).
REFERENCE_RTOL = 1e-7


def scale_for(p: dict[str, Any]) -> np.ndarray:
    """A per-token scale like a LayerNorm's 1/σ: positive, spread over a decade."""
    return np.exp(np.random.default_rng(p["seed"] + 7).uniform(-1.2, 1.2, p["n"]))


def dense_T_D(A: np.ndarray, M: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``I + Σ_h kron(M_hᵀ, A_h D)``: the operator on column-major vec(X)."""
    n, d = A.shape[-1], M.shape[-1]
    AD = A * scale[None, None, :]
    return np.eye(n * d) + sum(np.kron(Mh.T, Ah) for Ah, Mh in zip(AD, M, strict=True))


def dense_top(T: np.ndarray, n: int, d: int) -> tuple[complex, np.ndarray, float]:
    """Top eigenvalue, its eigenvector as an n×d matrix (from column-major vec), and |μ₂/μ₁|."""
    values, vectors = np.linalg.eig(T)
    order = np.argsort(-np.abs(values))
    V = vectors[:, order[0]].reshape(d, n).T
    return complex(values[order[0]]), V, float(abs(values[order[1]]) / abs(values[order[0]]))


#: The least relative spread of every head's row sums ``A_h D 𝟙`` for L to count as not invariant.
RATIO_SPREAD = 0.1


def layer_with_scale(p: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    A, W_V, W_O = build_layer(p)
    return A, W_V @ W_O, scale_for(p)


@settings(max_examples=60, deadline=None)
@given(layer_params(n=(2, 6), d=(1, 4)))
def test_matrix_is_the_kronecker_operator(p: dict[str, Any]) -> None:
    A, M, scale = layer_with_scale(p)
    n, d = A.shape[-1], M.shape[-1]
    row_major = operating_matrix(A, M, scale)
    # column-major vec = a permutation of the row-major one
    perm = np.arange(n * d).reshape(n, d).T.reshape(-1)
    assert_allclose(row_major[np.ix_(perm, perm)], dense_T_D(A, M, scale), atol=1e-12)
    X = np.random.default_rng(p["seed"]).standard_normal((n, d))
    expected = X + sum(Ah @ (scale[:, None] * X) @ Mh for Ah, Mh in zip(A, M, strict=True))
    assert_allclose(apply_layer(A, M, X, scale=scale), expected, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(layer_params(n=(2, 6), d=(1, 4)), st.sampled_from(["dense", "arpack"]))
def test_dominance_against_dense_eig(p: dict[str, Any], method: str) -> None:
    """ρ, the HFC share and ρ* of the top eigenvector, against eig of the Kronecker matrix."""
    A, M, scale = layer_with_scale(p)
    n, d = A.shape[-1], M.shape[-1]
    assume(method == "dense" or n * d >= 10)
    mu, V, gap = dense_top(dense_T_D(A, M, scale), n, d)
    assume(gap < 1 - CLEAR_GAP)
    found = operating_dominance(A, M, scale, method=method)  # type: ignore[arg-type]
    assert found.dominating == 1
    assert_allclose(found.rho, abs(mu), rtol=REFERENCE_RTOL)
    share = np.linalg.norm(V - V.mean(axis=0)) ** 2 / np.linalg.norm(V) ** 2
    assert_allclose(found.hfc_share, share, rtol=1e-5, atol=1e-9)
    if abs(mu.imag) <= 1e-12 * abs(mu):
        real = (V * np.conj(V[np.unravel_index(np.argmax(np.abs(V)), V.shape)])).real
        assert_allclose(found.limit_low, hfc_lfc(real), rtol=1e-5, atol=1e-9)
        assert_allclose(found.limit_high, found.limit_low, rtol=1e-9, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(layer_params(n=(2, 6), d=(1, 4)))
def test_power_iteration_reaches_the_limit(p: dict[str, Any]) -> None:
    """The derivation: HFC/LFC of T_D^k X tends to ρ* when the top is real, simple and clear."""
    A, M, scale = layer_with_scale(p)
    n, d = A.shape[-1], M.shape[-1]
    mu, _, gap = dense_top(dense_T_D(A, M, scale), n, d)
    assume(mu.imag == 0 and gap < 0.7)
    found = operating_dominance(A, M, scale, method="dense")
    X = np.random.default_rng(p["seed"] + 3).standard_normal((n, d))
    for _ in range(int(np.ceil(np.log(1e-12) / np.log(gap))) + 5):
        X = apply_layer(A, M, X, scale=scale)
        X /= np.linalg.norm(X)
    assume(np.isfinite(found.limit_low) and found.limit_low < 1e6)
    assert_allclose(hfc_lfc(X), found.limit_low, rtol=1e-6, atol=1e-9)


@settings(max_examples=80, deadline=None)
@given(layer_params(n=(2, 7), d=(1, 5)))
def test_identity_scale_reduces_to_the_exact_operator(p: dict[str, Any]) -> None:
    """D = I: the kind is operator_dominance's (plumbing: L invariant, the same split)."""
    A, W_V, W_O = build_layer(p)
    exact = operator_dominance(A, HeadFactors(W_V, W_O))
    gap = abs(exact.rho_lfc - exact.rho_quotient) / max(exact.rho_lfc, exact.rho_quotient)
    assume(gap > CLEAR_GAP)
    found = operating_dominance(A, HeadFactors(W_V, W_O), np.ones(A.shape[-1]), method="dense")
    assert found.kind == exact.kind
    assert_allclose(found.rho, max(exact.rho_lfc, exact.rho_quotient), rtol=1e-8)
    if exact.kind == "perron":
        assert found.limit_high <= 1e-6
        assert found.hfc_share <= 1e-12
    else:
        assert found.limit_low > 0


@settings(max_examples=60, deadline=None)
@given(layer_params(n=(2, 6), d=(1, 4)), st.floats(0.1, 10.0))
def test_constant_scale_is_the_operator_with_scaled_products(p: dict[str, Any], c: float) -> None:
    """D = c I keeps L invariant: the exact operator of c M_h, kind and radius."""
    A, M, _ = layer_with_scale(p)
    exact = operator_dominance(A, c * M)
    gap = abs(exact.rho_lfc - exact.rho_quotient) / max(exact.rho_lfc, exact.rho_quotient)
    assume(gap > CLEAR_GAP)
    found = operating_dominance(A, M, np.full(A.shape[-1], c), method="dense")
    assert found.kind == exact.kind


@settings(max_examples=60, deadline=None)
@given(layer_params(n=(3, 6), d=(1, 4)))
def test_a_varying_scale_leaves_l(p: dict[str, Any]) -> None:
    """With a D that varies over the tokens, a perron kind needs an eigenvector inside L, which
    the random layers never have once L is not invariant: the operating point's kind is
    non-perron, ρ* > 0. L stays invariant, whatever D, where every head's ``A_h D 𝟙`` is
    constant (a near-uniform A, as a high power of a symmetric one is): such layers are left
    out (``RATIO_SPREAD``)."""
    A, M, scale = layer_with_scale(p)
    n, d = A.shape[-1], M.shape[-1]
    _, _, gap = dense_top(dense_T_D(A, M, scale), n, d)
    rows = A @ scale  # (heads, n): the row sums of A_h D
    spread = np.ptp(rows, axis=-1) / np.abs(rows).mean(axis=-1)
    assume(gap < 1 - CLEAR_GAP and np.ptp(scale) > 0.1 and spread.min() > RATIO_SPREAD)
    found = operating_dominance(A, M, scale, method="dense")
    assert found.kind == "non-perron"
    assert found.limit_low > 0


def test_a_tie_across_l_is_balanced() -> None:
    """Two heads on one token pair: the LFC eigenvalue and a quotient eigenvalue equal by
    construction (|1 + m| = |1 − m'| with A's second eigenvalue −1): balanced, never broken."""
    A = np.array([[[0.0, 1.0], [1.0, 0.0]]])  # λ(A) = 1, −1
    M = np.array([[[1.0]]])  # LFC: 1 + 1 = 2; quotient: 1 − 1 = 0 → not a tie
    assert operating_dominance(A, M, method="dense").kind == "perron"
    M = np.array([[[-2.0]]])  # LFC: 1 − 2 = −1; quotient: 1 + 2 = 3
    assert operating_dominance(A, M, method="dense").kind == "non-perron"
    A2 = np.stack([np.eye(2), np.array([[0.0, 1.0], [1.0, 0.0]])])
    M2 = np.array([[[1.0]], [[1.0]]])  # LFC 1 + 2 = 3, quotient 1 + 1 − 1 = 1
    assert operating_dominance(A2, M2, method="dense").kind == "perron"
    M3 = np.array([[[-3.0]], [[1.0]]])  # LFC 1 − 2 = −1, quotient 1 − 3 − 1 = −3
    assert operating_dominance(A2, M3, method="dense").kind == "non-perron"
    M4 = np.array([[[-1.0]], [[-1.0]]])  # LFC 1 − 2 = −1, quotient 1 − 1 + 1 = 1: a tie
    assert operating_dominance(A2, M4, method="dense").kind == "balanced"


def test_limit_range_of_a_rotation() -> None:
    """A complex eigenvector whose real states alternate between pure LFC and pure HFC."""
    V = np.array([[1.0 + 1.0j], [1.0 - 1.0j]])  # Re: (1, 1) (LFC only); Im: (1, −1) (HFC only)
    low, high = limit_range(V)
    assert low == pytest.approx(0.0, abs=1e-12)
    assert high == np.inf
    low, high = limit_range(np.array([[1.0], [3.0]]))
    assert low == pytest.approx(hfc_lfc(np.array([[1.0], [3.0]])))
    assert high == pytest.approx(low)


def test_direction_and_ties() -> None:
    assert repetition_direction(0.1, 0.2, 0.5) == "smoothing"
    assert repetition_direction(0.6, 0.7, 0.5) == "no smoothing"
    assert repetition_direction(0.4, 0.6, 0.5) == "tie"


@given(seeds())
def test_token_inverse_scale_is_the_norm_s(seed: int) -> None:
    X = np.random.default_rng(seed).standard_normal((5, 7)) * 3 + 1
    sigma = np.sqrt(X.var(axis=1) + 1e-5)
    assert_allclose(token_inverse_scale(X, "layernorm", 1e-5), 1 / sigma, rtol=1e-12)
    rms = np.sqrt((X**2).mean(axis=1) + 1e-6)
    assert_allclose(token_inverse_scale(X, "rmsnorm", 1e-6), 1 / rms, rtol=1e-12)


def test_bad_scale_is_refused() -> None:
    A = np.full((1, 3, 3), 1 / 3)
    with pytest.raises(InputError, match="scale"):
        operating_dominance(A, np.eye(2)[None], np.array([1.0, -1.0, 1.0]))
    with pytest.raises(InputError, match="scale"):
        operating_dominance(A, np.eye(2)[None], np.ones(2))
