"""The effective per-head product C diag(γ) W_V^h W_O^h (NumPy only: runs without torch)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.simulator.errors import InputError
from oversmooth.training.effective import (
    effective_head_eigenvalues,
    effective_head_products,
    sign_shares,
    stored_head_eigenvalues,
)


def _qr_heads(rng: np.random.Generator, d: int, heads: int, lam: np.ndarray):
    """W_V = [V_1 … V_H], W_O = [Λ_1 V_1ᵀ; …] as the ⁺/⁻ parametrisation builds them."""
    k = d // heads
    blocks = [np.linalg.qr(rng.standard_normal((d, k)))[0] for _ in range(heads)]
    W_V = np.concatenate(blocks, axis=1)
    W_O = np.concatenate([lam[h][:, None] * V.T for h, V in enumerate(blocks)], axis=0)
    return W_V, W_O


def test_small_eigenvalues_are_the_nonzero_ones_of_the_d_by_d_product():
    rng = np.random.default_rng(3)
    d, heads = 8, 2
    W_V, W_O = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    gamma = rng.uniform(0.5, 2.0, d)
    small = effective_head_eigenvalues(W_V, W_O, heads, gamma)
    products = effective_head_products(W_V, W_O, heads, gamma)
    for h in range(heads):
        big = np.linalg.eigvals(products[h])
        big = big[np.argsort(-np.abs(big))][: d // heads]  # rank ≤ d_head: the rest are 0
        assert_allclose(np.sort_complex(big), np.sort_complex(small[h]), atol=1e-10)
    # the centring is in: every row of M_h sums to zero against 𝟙 on the left (𝟙ᵀ C = 0)
    assert_allclose(np.ones(d) @ products, 0.0, atol=1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_uniform_gamma_keeps_the_parametrised_signs(sign):
    """𝟙-uniform γ > 0: Vᵀ C V is positive definite, so the effective signs are Λ's (Sylvester)."""
    rng = np.random.default_rng(5)
    d, heads = 12, 3
    lam = sign * rng.uniform(0.1, 2.0, (heads, d // heads))
    W_V, W_O = _qr_heads(rng, d, heads, lam)
    stored = stored_head_eigenvalues(W_V, W_O, heads)
    assert_allclose(np.sort(stored.real, axis=1), np.sort(lam, axis=1), atol=1e-12)
    effective = effective_head_eigenvalues(W_V, W_O, heads, np.full(d, 0.7))
    assert np.all(sign * effective.real > 0)
    assert np.max(np.abs(effective.imag)) < 1e-10


def test_non_uniform_gamma_can_flip_an_effective_sign():
    """What the parametrisation does not guarantee: with γ far from uniform, C diag(γ) is not
    symmetric and some ⁺ head's effective spectrum leaves the positive half-line."""
    rng = np.random.default_rng(0)
    flipped = 0
    for _ in range(200):
        W_V, W_O = _qr_heads(rng, 8, 4, np.full((4, 2), 0.5))
        values = effective_head_eigenvalues(W_V, W_O, 4, np.exp(rng.uniform(-3, 3, 8)))
        flipped += bool(np.any(values.real <= 0) or np.any(np.abs(values.imag) > 1e-12))
    assert flipped > 0


def test_sign_shares_count_each_side():
    shares = sign_shares(np.array([1.0, -2.0, 0.0, 3.0 + 1j]), tol=1e-9)
    assert shares == {"positive": 0.5, "negative": 0.25, "zero": 0.25, "max_imag": 1.0}


def test_heads_that_do_not_split_are_refused():
    with pytest.raises(InputError, match="heads"):
        effective_head_eigenvalues(np.eye(6), np.eye(6), 4)
    with pytest.raises(InputError, match="gamma"):
        effective_head_eigenvalues(np.eye(6), np.eye(6), 2, np.ones(5))
