"""Small systems, and the hand-written formulas the update rules are checked against (shared by
the tests of :mod:`oversmooth.simulator.updates`)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from oversmooth.simulator.spectra import attention_symmetric_scores
from oversmooth.simulator.tolerances import STEP_ATOL, STEP_RTOL

__all__ = [
    "close",
    "features",
    "hand_attention",
    "hand_mlp",
    "layer_norm_by_hand",
    "seeds",
    "sizes",
    "small_system",
    "softmax_rows",
]

#: Token counts, feature counts and seeds that hypothesis draws.
sizes = st.integers(min_value=2, max_value=7)
features = st.integers(min_value=1, max_value=6)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


def small_system(n: int, d: int, d_v: int, seed: int, scale: float = 1.0):
    """A row-stochastic A, value and projection weights of norm ~1, and tokens."""
    rng = np.random.default_rng(seed)
    A = attention_symmetric_scores(n, rng=rng)
    W_V = rng.standard_normal((d, d_v)) / np.sqrt(d)
    W_proj = rng.standard_normal((d_v, d)) / np.sqrt(d_v)
    X = scale * rng.standard_normal((n, d))
    return A, W_V, W_proj, X, rng


def close(actual, expected, scale: float = 1.0) -> None:
    """``actual`` equals ``expected`` to a few float64 flops (STEP_RTOL, STEP_ATOL · scale)."""
    np.testing.assert_allclose(actual, expected, rtol=STEP_RTOL, atol=STEP_ATOL * scale)


def layer_norm_by_hand(X, gamma, beta, eps=1e-5):
    """LayerNorm written out: biased variance, eps inside the square root."""
    mean = X.sum(axis=-1, keepdims=True) / X.shape[-1]
    var = ((X - mean) ** 2).sum(axis=-1, keepdims=True) / X.shape[-1]
    return (X - mean) / np.sqrt(var + eps) * gamma + beta


def softmax_rows(S):
    """The softmax of each row of S."""
    E = np.exp(S - S.max(axis=-1, keepdims=True))
    return E / E.sum(axis=-1, keepdims=True)


def hand_attention(Z, W_Q, W_K, W_V, W_proj, heads):
    """Multi-head softmax attention, one head (contiguous column block) at a time."""
    k = W_Q.shape[1] // heads
    v = W_V.shape[1] // heads
    out = np.zeros_like(Z)
    for h in range(heads):
        q = Z @ W_Q[:, h * k : (h + 1) * k]
        key = Z @ W_K[:, h * k : (h + 1) * k]
        P = softmax_rows(q @ key.T / math.sqrt(k))
        out += P @ Z @ W_V[:, h * v : (h + 1) * v] @ W_proj[h * v : (h + 1) * v, :]
    return out


def hand_mlp(Y, W_1, b_1, W_2, b_2):
    """The GELU MLP, with GELU from ``math.erf`` element by element."""
    Z = Y @ W_1 + b_1
    gelu = 0.5 * Z * (1.0 + np.vectorize(math.erf)(Z / math.sqrt(2.0)))
    return gelu @ W_2 + b_2
