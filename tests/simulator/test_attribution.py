"""Attribution of a block's change to its sublayer's parts (simulator.attribution).

The parts of :func:`attribute` are checked against a hand-worked example; the states of
:func:`sublayer_states` against the sublayer written out with dense NumPy (a pre-LN branch
``X + Σ_h A_h LN(X) W_V^h W_O^h s + b_O s``); :func:`relative_residual` against a 3-4-5 triangle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from numpy.testing import assert_allclose

from oversmooth.simulator.attribution import (
    PARTS,
    STATES,
    attribute,
    relative_residual,
    sublayer_states,
)
from oversmooth.simulator.metrics import cosine, hfc_lfc
from oversmooth.simulator.operating import token_inverse_scale
from oversmooth.simulator.operator import HeadFactors
from oversmooth.simulator.tolerances import STEP_ATOL, STEP_RTOL
from tests.simulator.test_operator import build_layer, layer_params

#: f at every state of the hand-worked example (no post-LN norm).
VALUES = {
    "x": 1.0,
    "linear": 3.0,
    "scaled": 4.0,
    "linear_bias": 6.0,
    "model": 10.0,
    "graph": 11.0,
    "output": 15.0,
}


@settings(max_examples=60, deadline=None)
@given(layer_params(n=(2, 6), d=(2, 5)))
def test_attribution_parts_sum_to_the_observed_change(p: dict[str, Any]) -> None:
    """Both splits sum to f(output) − f(x) (a telescoping identity: plumbing), and the rebuilt
    pre-LN sublayer is the branch written out: X + A LN(X) W_V W_O s + b_O s."""
    A, W_V, W_O = build_layer(p)
    gen = np.random.default_rng(p["seed"] + 11)
    n, d = A.shape[-1], W_V.shape[1]
    X = gen.standard_normal((n, d)) * 2 + 0.5
    gamma, beta, s, b_O = (gen.standard_normal(d) for _ in range(4))
    centre = np.eye(d) - 1.0 / d
    M = np.stack(
        [centre @ np.diag(gamma) @ V @ O @ np.diag(s) for V, O in zip(W_V, W_O, strict=True)]
    )
    c = sum(beta @ V @ O for V, O in zip(W_V, W_O, strict=True)) * s + b_O * s
    states = sublayer_states(A, M, X, token_inverse_scale(X, "layernorm", 1e-5), c)
    normed = (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5) * gamma + beta
    branch = sum(Ah @ normed @ V @ O for Ah, V, O in zip(A, W_V, W_O, strict=True)) * s + b_O * s
    assert_allclose(states.model, X + branch, rtol=1e-9, atol=1e-9)
    assert relative_residual(X + branch, states.model) < 1e-12
    output = states.model + gen.standard_normal((n, d))
    for f in (hfc_lfc, cosine):
        values = {
            name: float(f(getattr(states, name)))
            for name in ("x", "linear", "scaled", "linear_bias", "model")
        }
        values |= {"graph": float(f(X + branch)), "output": float(f(output))}
        parts = attribute(values)
        total = values["output"] - values["x"]
        assert_allclose(sum(shapley for shapley, _ in parts.values()), total, atol=1e-12)
        assert_allclose(sum(seq for _, seq in parts.values()), total, atol=1e-12)
        assert parts["norm"] == (0.0, 0.0)


def test_the_parts_of_a_hand_worked_example() -> None:
    """scale: ½[(4 − 3) + (10 − 6)] = 2.5, first 1; bias: ½[(6 − 3) + (10 − 4)] = 4.5, second 6."""
    parts = attribute(VALUES)
    assert list(parts) == list(PARTS)
    assert parts == {
        "linear": (2.0, 2.0),
        "scale": (2.5, 1.0),
        "bias": (4.5, 6.0),
        "norm": (0.0, 0.0),
        "reconstruction": (1.0, 1.0),
        "mlp": (4.0, 4.0),
    }


def test_a_post_norm_block_has_a_norm_part_and_the_reconstruction_is_against_it() -> None:
    parts = attribute(VALUES | {"normed": 12.5})
    assert parts["norm"] == (2.5, 2.5)  # 12.5 − 10
    assert parts["reconstruction"] == (-1.5, -1.5)  # 11 − 12.5
    assert parts["mlp"] == (4.0, 4.0)
    assert set(VALUES) | {"normed"} == set(STATES)


def test_without_scale_and_bias_every_state_is_the_linear_one(rng: np.random.Generator) -> None:
    A = rng.random((2, 4, 4))
    A /= A.sum(axis=-1, keepdims=True)
    M = rng.standard_normal((2, 3, 3))
    X = rng.standard_normal((4, 3))
    states = sublayer_states(A, M, X, None, np.zeros(3))
    linear = X + A[0] @ X @ M[0] + A[1] @ X @ M[1]
    assert_allclose(states.linear, linear, rtol=STEP_RTOL, atol=STEP_ATOL)
    assert states.scaled is states.linear
    np.testing.assert_array_equal(states.x, X)
    np.testing.assert_array_equal(states.linear_bias, states.linear)
    np.testing.assert_array_equal(states.model, states.linear)


def test_the_token_scale_multiplies_the_branch_input_and_the_bias_is_added_to_every_row(
    rng: np.random.Generator,
) -> None:
    A = rng.random((1, 5, 5))
    A /= A.sum(axis=-1, keepdims=True)
    W_V, W_O = rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 2, 3))
    X = rng.standard_normal((5, 3))
    scale = rng.uniform(0.5, 2.0, 5)
    c = np.array([1.0, -2.0, 0.5])
    states = sublayer_states(A, HeadFactors(W_V, W_O), X, scale, c)
    scaled = X + A[0] @ np.diag(scale) @ X @ W_V[0] @ W_O[0]
    assert_allclose(states.scaled, scaled, rtol=STEP_RTOL, atol=STEP_ATOL)
    assert_allclose(states.model - states.scaled, np.tile(c, (5, 1)), rtol=0, atol=STEP_ATOL)
    assert_allclose(states.linear_bias - states.linear, np.tile(c, (5, 1)), rtol=0, atol=STEP_ATOL)


def test_the_relative_residual_of_a_three_four_five_triangle() -> None:
    assert relative_residual([[3.0, 4.0]], [[3.0, 0.0]]) == pytest.approx(0.8, rel=STEP_RTOL)
    assert relative_residual([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert np.isnan(relative_residual(np.zeros(3), np.ones(3)))  # no scale to be relative to
