"""oversmooth.simulator.effective: the pre-norm's left factor C diag(γ) applied to W_V."""

from __future__ import annotations

import numpy as np
from numpy.testing import assert_allclose

from oversmooth.simulator.effective import prenorm_left


def test_it_is_the_centring_times_the_scale_times_w_v() -> None:
    rng = np.random.default_rng(0)
    d, k = 7, 3
    W_V, gamma = rng.normal(size=(d, k)), rng.normal(size=d)
    C = np.eye(d) - np.full((d, d), 1.0 / d)
    assert_allclose(prenorm_left(W_V, gamma, centred=True), C @ np.diag(gamma) @ W_V, atol=1e-14)
    assert_allclose(prenorm_left(W_V, gamma), np.diag(gamma) @ W_V, atol=1e-14)
    np.testing.assert_array_equal(prenorm_left(W_V), W_V)


def test_heads_on_a_leading_axis_are_each_folded() -> None:
    rng = np.random.default_rng(1)
    W_V, gamma = rng.normal(size=(4, 6, 2)), rng.normal(size=6)
    stacked = prenorm_left(W_V, gamma, centred=True)
    for head in range(4):
        np.testing.assert_array_equal(stacked[head], prenorm_left(W_V[head], gamma, centred=True))
    # a centred factor's output has zero column means: 𝟙ᵀ C = 0
    assert_allclose(stacked.sum(axis=-2), 0.0, atol=1e-13)
