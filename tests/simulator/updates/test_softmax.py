"""Softmax attention recomputed from X (simulator.updates.softmax) against the hand-written
multi-head block, with and without LayerNorm, MLP and residuals; uniform attention; batching."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.tolerances import STEP_ATOL
from oversmooth.simulator.updates import MLP, SoftmaxAttentionRule
from tests.simulator.updates.formulas import (
    close,
    hand_attention,
    hand_mlp,
    layer_norm_by_hand,
    seeds,
    sizes,
)


@given(
    n=sizes,
    heads=st.integers(min_value=1, max_value=3),
    d_head=st.integers(min_value=1, max_value=3),
    d=st.integers(min_value=2, max_value=6),
    norm=st.sampled_from([None, "pre", "post"]),
    with_mlp=st.booleans(),
    skip=st.booleans(),
    seed=seeds,
)
def test_softmax_attention_rule_matches_hand_formula(
    n, heads, d_head, d, norm, with_mlp, skip, seed
):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W_Q, W_K, W_V = (rng.standard_normal((d, heads * d_head)) for _ in range(3))
    W_proj = rng.standard_normal((heads * d_head, d)) / heads
    gamma, beta = rng.standard_normal(d), rng.standard_normal(d)
    W_1, b_1 = rng.standard_normal((d, 5)), rng.standard_normal(5)
    W_2, b_2 = rng.standard_normal((5, d)), rng.standard_normal(d)
    mlp = MLP(W_1, b_1, W_2, b_2) if with_mlp else None
    rule = SoftmaxAttentionRule(
        W_Q, W_K, W_V, W_proj, n_heads=heads, norm=norm, gamma=gamma, beta=beta, mlp=mlp, skip=skip
    )

    def attend(Z):
        return hand_attention(Z, W_Q, W_K, W_V, W_proj, heads)

    def ln(Z):
        return layer_norm_by_hand(Z, gamma, beta)

    r = 1.0 if skip else 0.0
    if norm == "pre":
        Y = r * X + attend(ln(X))
        expected = r * Y + hand_mlp(ln(Y), W_1, b_1, W_2, b_2) if with_mlp else Y
    elif norm == "post":
        Y = ln(r * X + attend(X))
        expected = ln(r * Y + hand_mlp(Y, W_1, b_1, W_2, b_2)) if with_mlp else Y
    else:
        Y = r * X + attend(X)
        expected = r * Y + hand_mlp(Y, W_1, b_1, W_2, b_2) if with_mlp else Y
    assert not rule.homogeneous
    close(rule(X, 0, {}), expected, scale=float(np.abs(expected).max()))


def test_softmax_attention_heads_are_stochastic_and_batched(rng):
    W = [rng.standard_normal((4, 6)) for _ in range(3)]
    rule = SoftmaxAttentionRule(*W, rng.standard_normal((6, 4)), n_heads=3)
    X = rng.standard_normal((5, 7, 4))
    P = rule.attention(X)
    assert P.shape == (5, 3, 7, 7)
    np.testing.assert_allclose(P.sum(axis=-1), 1.0, rtol=0, atol=STEP_ATOL)
    batched = rule(X, 0, {})
    for b in range(X.shape[0]):
        close(batched[b], rule(X[b], 0, {}))


def test_zero_queries_attend_uniformly(rng: np.random.Generator) -> None:
    """All scores 0: every head's attention is 𝟙𝟙ᵀ/n, and the branch is the token mean."""
    d, n = 4, 5
    W_V, W_proj = rng.standard_normal((d, 6)), rng.standard_normal((6, d))
    rule = SoftmaxAttentionRule(
        np.zeros((d, 6)), rng.standard_normal((d, 6)), W_V, W_proj, n_heads=2
    )
    X = rng.standard_normal((n, d))
    np.testing.assert_allclose(rule.attention(X), np.full((2, n, n), 1 / n), rtol=0, atol=STEP_ATOL)
    mean = X.mean(axis=0, keepdims=True)
    close(rule(X, 0, {}), X + np.repeat(mean @ W_V @ W_proj, n, axis=0))


def test_per_system_weights_batch_the_rule(rng: np.random.Generator) -> None:
    W_Q, W_K, W_V = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    W_proj = rng.standard_normal((4, 3))  # shared by both systems
    rule = SoftmaxAttentionRule(W_Q, W_K, W_V, W_proj, n_heads=2, norm="post")
    assert rule.batch_shape == (2,)
    X = rng.standard_normal((6, 3))
    out = rule(X, 0, {})
    for b in range(2):
        single = SoftmaxAttentionRule(W_Q[b], W_K[b], W_V[b], W_proj, n_heads=2, norm="post")
        close(out[b], single(X, 0, {}))


def test_pre_norm_without_residuals_with_an_mlp(rng: np.random.Generator) -> None:
    """SAN+MLP with a pre-norm: ``MLP(LN(Attn(LN(X))))``, every ``X +`` and ``Y +`` dropped."""
    d = 3
    W_Q, W_K, W_V = (rng.standard_normal((d, 2)) for _ in range(3))
    W_proj = rng.standard_normal((2, d))
    W_1, b_1, W_2, b_2 = (rng.standard_normal(s) for s in ((d, 4), 4, (4, d), d))
    rule = SoftmaxAttentionRule(
        W_Q, W_K, W_V, W_proj, norm="pre", mlp=MLP(W_1, b_1, W_2, b_2), skip=False
    )
    X = rng.standard_normal((5, d))
    Y = hand_attention(layer_norm_by_hand(X, 1.0, 0.0), W_Q, W_K, W_V, W_proj, 1)
    close(rule(X, 0, {}), hand_mlp(layer_norm_by_hand(Y, 1.0, 0.0), W_1, b_1, W_2, b_2))


@pytest.mark.parametrize("n_heads", [0, -1, True, 2.0, "2"])
def test_the_head_count_is_a_positive_integer(n_heads: object) -> None:
    with pytest.raises(InputError, match="`n_heads` must be a positive integer"):
        SoftmaxAttentionRule(np.eye(2), np.eye(2), np.eye(2), np.eye(2), n_heads=n_heads)  # type: ignore[arg-type]


def test_keys_must_match_the_queries_shape() -> None:
    with pytest.raises(InputError, match=r"`W_K` must have shape \(\.\.\., 2, 4\)"):
        SoftmaxAttentionRule(np.ones((2, 4)), np.ones((2, 2)), np.eye(2), np.eye(2))
