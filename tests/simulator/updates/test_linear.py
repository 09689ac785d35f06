"""The fixed-attention rules (simulator.updates.linear) against their hand-written formulas:
the linear layer (claims 1 and 5), Pre-LN and Post-LN (claim 22), each with batched parameters."""

from __future__ import annotations

from math import comb

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.spectra import h_symmetric
from oversmooth.simulator.tolerances import CLOSED_FORM_RTOL
from oversmooth.simulator.updates import MLP, LinearRule, PostLNRule, PreLNRule
from tests.simulator.updates.formulas import (
    close,
    features,
    layer_norm_by_hand,
    seeds,
    sizes,
    small_system,
)


@given(n=sizes, d=features, d_v=features, seed=seeds)
def test_linear_rule_is_x_plus_a_x_wv_wproj(n, d, d_v, seed):
    A, W_V, W_proj, X, _ = small_system(n, d, d_v, seed)
    rule = LinearRule(A, W_V, W_proj)
    close(rule(X, 0, {}), X + A @ X @ W_V @ W_proj)
    close(LinearRule(A, W_V, W_proj, skip=False)(X, 0, {}), A @ X @ W_V @ W_proj)


@given(n=sizes, d=features, seed=seeds)
def test_claim1_vec_identity(n, d, seed):
    """vec(X + A X M) = (I + M^T ⊗ A) vec(X), column stacking (claim 1)."""
    A, W_V, W_proj, X, _ = small_system(n, d, d, seed)
    rule = LinearRule(A, W_V, W_proj)
    M = W_V @ W_proj
    lhs = rule(X, 0, {}).flatten(order="F")
    rhs = (np.eye(n * d) + np.kron(M.T, A)) @ X.flatten(order="F")
    close(lhs, rhs)
    np.testing.assert_array_equal(rule.H, M.T)


@given(n=sizes, d=features, seed=seeds, L=st.integers(min_value=1, max_value=30))
def test_claim5_closed_form(n, d, seed, L):
    """X_L = sum_k binom(L, k) A^k X_0 M^k for the linear rule (claim 5)."""
    A, _, _, X0, rng = small_system(n, d, d, seed)
    # A positive spectrum keeps the binomial sum free of cancellation (it is then well conditioned).
    W_V, W_proj = np.eye(d), h_symmetric(rng.uniform(0.05, 1.0, d), rng=rng)
    rule = LinearRule(A, W_V, W_proj)
    X = X0
    for layer in range(L):
        X = rule(X, layer, {})
    M = W_V @ W_proj
    closed = sum(
        comb(L, k) * np.linalg.matrix_power(A, k) @ X0 @ np.linalg.matrix_power(M, k)
        for k in range(L + 1)
    )
    assert np.linalg.norm(X - closed) <= CLOSED_FORM_RTOL * np.linalg.norm(closed)


def test_linear_rule_with_mlp(rng):
    A, W_V, W_proj, X, _ = small_system(5, 4, 4, 7)
    mlp = MLP(rng.standard_normal((4, 6)), None, rng.standard_normal((6, 4)), None, "relu")
    rule = LinearRule(A, W_V, W_proj, mlp=mlp)
    Y = X + A @ X @ W_V @ W_proj
    close(rule(X, 0, {}), Y + np.maximum(Y @ mlp.W_1, 0) @ mlp.W_2)
    assert rule.homogeneous


def test_layer_norm_rules_are_not_homogeneous():
    A, W_V, W_proj, X, _ = small_system(6, 4, 4, 1)
    for rule in (PreLNRule(A, W_V, W_proj), PostLNRule(A, W_V, W_proj)):
        assert not rule.homogeneous
        assert not np.allclose(rule(3.0 * X, 0, {}), 3.0 * rule(X, 0, {}))


@given(n=sizes, d=st.integers(min_value=2, max_value=6), seed=seeds)
def test_pre_and_post_ln_match_hand_formulas(n, d, seed):
    A, W_V, W_proj, X, rng = small_system(n, d, d, seed)
    gamma = rng.standard_normal(d)
    beta = rng.standard_normal(d)
    M = W_V @ W_proj
    pre = PreLNRule(A, W_V, W_proj, gamma=gamma, beta=beta)
    post = PostLNRule(A, W_V, W_proj, gamma=gamma, beta=beta)
    close(pre(X, 0, {}), X + A @ layer_norm_by_hand(X, gamma, beta) @ M)
    close(post(X, 0, {}), layer_norm_by_hand(X + A @ X @ M, gamma, beta))


@given(
    n=sizes,
    d=st.integers(min_value=2, max_value=6),
    seed=seeds,
    c=st.floats(min_value=0.1, max_value=5.0),
)
def test_claim22_post_ln_sign_flip_alternates_exactly(n, d, seed, c):
    """X_l(gamma = -c) = (-1)^l X_l(gamma = c) exactly when beta = 0 (claim 22)."""
    A, W_V, W_proj, X0, _ = small_system(n, d, d, seed)
    plus = PostLNRule(A, W_V, W_proj, gamma=c)
    minus = PostLNRule(A, W_V, W_proj, gamma=-c)
    X_plus, X_minus = X0, X0
    for layer in range(20):
        X_plus, X_minus = plus(X_plus, layer, {}), minus(X_minus, layer, {})
        np.testing.assert_array_equal(X_minus, (-1) ** (layer + 1) * X_plus)


def test_pre_ln_negative_gamma_flips_the_effective_product():
    """Pre-LN branch with gamma = -c equals the branch with gamma = c negated (claim 21 mechanism)."""
    A, W_V, W_proj, X, _ = small_system(6, 4, 4, 3)
    plus = PreLNRule(A, W_V, W_proj, gamma=2.0)
    minus = PreLNRule(A, W_V, W_proj, gamma=-2.0)
    close(minus(X, 0, {}) - X, -(plus(X, 0, {}) - X))


def test_without_skip_an_mlp_replaces_the_attention_output(rng: np.random.Generator) -> None:
    A, W_V, W_proj, X, _ = small_system(5, 4, 4, 7)
    W_1, W_2 = rng.standard_normal((4, 6)), rng.standard_normal((6, 4))
    b_1 = rng.standard_normal(6)
    rule = LinearRule(A, W_V, W_proj, skip=False, mlp=MLP(W_1, b_1, W_2, None, "relu"))
    Y = A @ X @ W_V @ W_proj
    close(rule(X, 0, {}), np.maximum(Y @ W_1 + b_1, 0.0) @ W_2)
    assert not rule.homogeneous  # a bias in the MLP


def test_per_system_layer_norm_parameters_batch_the_rule(rng: np.random.Generator) -> None:
    A, W_V, W_proj, X, _ = small_system(5, 3, 3, 2)
    gamma, beta = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    for cls in (PreLNRule, PostLNRule):
        batched = cls(A, W_V, W_proj, gamma=gamma, beta=beta)
        assert batched.batch_shape == (2,)
        out = batched(X, 0, {})
        assert out.shape == (2, 5, 3)
        for b in range(2):
            close(out[b], cls(A, W_V, W_proj, gamma=gamma[b], beta=beta[b])(X, 0, {}))


def test_layer_norm_eps_is_inside_the_square_root(rng: np.random.Generator) -> None:
    """A large eps shows where it enters: ``(X − mean) / sqrt(var + eps)``."""
    A, W_V, W_proj, X, _ = small_system(4, 3, 3, 5, scale=0.1)
    M = W_V @ W_proj
    eps = 0.5
    pre = PreLNRule(A, W_V, W_proj, eps=eps)
    post = PostLNRule(A, W_V, W_proj, gamma=2.0, beta=-1.0, eps=eps)
    close(pre(X, 0, {}), X + A @ layer_norm_by_hand(X, 1.0, 0.0, eps) @ M)
    close(post(X, 0, {}), layer_norm_by_hand(X + A @ X @ M, 2.0, -1.0, eps))
