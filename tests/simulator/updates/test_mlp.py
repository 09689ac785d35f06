"""The feed-forward sub-block (simulator.updates.mlp): exact GELU and ReLU against hand-written
values, homogeneity, batched biases, and how a rule accepts and applies an MLP."""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates import MLP
from oversmooth.simulator.updates.mlp import check_mlp, with_mlp
from tests.simulator.updates.formulas import close, hand_mlp

#: Φ(1), the standard normal distribution at 1: GELU(1) = Φ(1), GELU(−1) = −(1 − Φ(1)).
PHI_1 = 0.8413447460685429


def test_mlp_relu_and_gelu(rng):
    W_1, W_2 = rng.standard_normal((4, 8)), rng.standard_normal((8, 4))
    b_1, b_2 = rng.standard_normal(8), rng.standard_normal(4)
    Y = rng.standard_normal((6, 4))
    close(MLP(W_1, b_1, W_2, b_2)(Y), hand_mlp(Y, W_1, b_1, W_2, b_2))
    relu = MLP(W_1, None, W_2, None, activation="relu")
    close(relu(Y), np.maximum(Y @ W_1, 0.0) @ W_2)
    assert relu.homogeneous
    assert not MLP(W_1, b_1, W_2, b_2, activation="relu").homogeneous
    assert not MLP(W_1, None, W_2, None).homogeneous


def test_gelu_at_hand_known_points() -> None:
    identity = MLP(np.eye(3), None, np.eye(3), None)
    close(identity(np.array([[0.0, 1.0, -1.0]])), [[0.0, PHI_1, PHI_1 - 1.0]])
    assert identity.d == 3


def test_biases_may_differ_per_system(rng: np.random.Generator) -> None:
    W_1, W_2 = rng.standard_normal((3, 5)), rng.standard_normal((5, 3))
    b_1, b_2 = rng.standard_normal((2, 5)), rng.standard_normal((2, 3))
    Y = rng.standard_normal((4, 3))
    out = MLP(W_1, b_1, W_2, b_2)(Y)
    assert out.shape == (2, 4, 3)
    for b in range(2):
        close(out[b], hand_mlp(Y, W_1, b_1[b], W_2, b_2[b]))


def test_the_second_weight_must_map_the_hidden_width_back() -> None:
    with pytest.raises(InputError, match=r"`W_2` must have shape \(\.\.\., 5, 3\); got \(4, 3\)"):
        MLP(np.ones((3, 5)), None, np.ones((4, 3)), None)


def test_a_rule_accepts_none_or_an_mlp_on_its_features() -> None:
    check_mlp(None, 3)
    check_mlp(MLP(np.eye(3), None, np.eye(3), None), 3)
    with pytest.raises(InputError, match="`mlp` must be an MLP or None; got function"):
        check_mlp(lambda Y: Y, 3)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="`mlp` must act on 4 features to match the block; got 3"):
        check_mlp(MLP(np.eye(3), None, np.eye(3), None), 4)


def test_with_mlp_adds_the_mlp_output_or_replaces_y_by_it() -> None:
    double = MLP(2.0 * np.eye(2), None, np.eye(2), None, "relu")  # ReLU(2Y): 2Y where Y ≥ 0
    Y = np.array([[1.0, -1.0], [0.5, 2.0]])
    assert with_mlp(Y, None, True) is Y
    close(with_mlp(Y, double, True), [[3.0, -1.0], [1.5, 6.0]])
    close(with_mlp(Y, double, False), [[2.0, 0.0], [1.0, 4.0]])
