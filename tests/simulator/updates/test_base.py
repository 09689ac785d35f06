"""What every update rule shares (simulator.updates.base): the UpdateRule protocol, the input
check, the validation helpers and LayerNorm with batched parameters, the short repr."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates import MLP, LinearRule, UpdateRule
from oversmooth.simulator.updates.base import (
    SCALED,
    ShortRepr,
    apply_layer_norm,
    as_eps,
    as_feature_vector,
    as_matrix,
    broadcast_batch,
    set_frozen,
)
from tests.simulator.updates.formulas import close, layer_norm_by_hand, small_system


class Doubling:
    """Not a rule class: an object with the protocol's members (``2 X`` at every layer)."""

    homogeneous = True
    batch_shape = ()

    def check_tokens(self, X, name="X"):  # type: ignore[no-untyped-def]
        return np.asarray(X, dtype=float)

    def __call__(self, X, layer, cache):  # type: ignore[no-untyped-def]
        return 2.0 * X


@dataclass(frozen=True, repr=False, init=False)
class Frozen(ShortRepr):
    """A frozen dataclass built with :func:`set_frozen`, shown by :class:`ShortRepr`."""

    weights: np.ndarray
    scale: np.ndarray
    label: str

    def __init__(self, weights: np.ndarray, scale: float, label: str) -> None:
        set_frozen(self, weights=weights, scale=np.asarray(scale), label=label)


def test_update_rule_check_can_fail(rng):
    """The protocol check itself can fail: an MLP is callable but is not a rule."""
    assert not isinstance(MLP(np.eye(3), None, np.eye(3), None), UpdateRule)
    assert not isinstance(lambda X, layer, cache: X, UpdateRule)


def test_check_tokens_names_the_mismatch():
    A, W_V, W_proj, X, _ = small_system(4, 3, 2, 0)
    rule = LinearRule(A, W_V, W_proj)
    with pytest.raises(InputError, match="4 tokens"):
        rule.check_tokens(X[:3], "X0")
    with pytest.raises(InputError, match="3 features"):
        rule.check_tokens(X[:, :2], "X0")
    np.testing.assert_array_equal(rule.check_tokens(X), X)


def test_any_object_with_the_protocols_members_is_an_update_rule() -> None:
    assert isinstance(Doubling(), UpdateRule)
    A, W_V, W_proj, _, _ = small_system(4, 3, 2, 0)
    assert isinstance(LinearRule(A, W_V, W_proj), UpdateRule)


def test_check_tokens_refuses_a_batch_that_does_not_broadcast_with_the_rules() -> None:
    A, W_V, W_proj, X, _ = small_system(4, 3, 2, 0)
    rule = LinearRule(np.stack([A, A]), W_V, W_proj)  # two systems
    assert rule.check_tokens(np.stack([X] * 2)).shape == (2, 4, 3)
    assert rule.check_tokens(X).shape == (4, 3)  # one input broadcasts over both
    with pytest.raises(InputError, match=r"`X0` \(3,\), `the rule's matrices` \(2,\)"):
        rule.check_tokens(np.stack([X] * 3), "X0")


def test_the_scaled_cache_key() -> None:
    """The key the module docstring documents for arrays that scale with X."""
    assert SCALED == "scaled"


# -- validation helpers ----------------------------------------------------------------------------


def test_batch_shapes_broadcast_or_are_all_named() -> None:
    assert broadcast_batch({"A": (2, 1), "W_V": (3,), "W_proj": ()}) == (2, 3)
    with pytest.raises(InputError) as info:
        broadcast_batch({"A": (2,), "W_V": (3,)})
    assert str(info.value) == (
        "the leading batch axes must broadcast together; got `A` (2,), `W_V` (3,)"
    )


def test_a_matrix_has_the_sizes_asked_for_and_k_marks_a_free_one() -> None:
    assert as_matrix(np.zeros((5, 2, 3)), "W", 2, None).shape == (5, 2, 3)
    with pytest.raises(InputError, match=r"`W` must have shape \(\.\.\., k, 4\); got \(2, 3\)"):
        as_matrix(np.zeros((2, 3)), "W", None, 4)
    with pytest.raises(InputError, match="at least 2 axes"):
        as_matrix(np.zeros(3), "W", None, None)


def test_a_feature_vector_defaults_broadcasts_a_scalar_and_checks_its_length() -> None:
    np.testing.assert_array_equal(as_feature_vector(None, "gamma", 3, 1.0), np.ones(3))
    np.testing.assert_array_equal(as_feature_vector(-2, "gamma", 3, 1.0), [-2.0, -2.0, -2.0])
    batched = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(as_feature_vector(batched, "gamma", 3, 1.0), batched)
    with pytest.raises(
        InputError, match=r"`beta` must have shape \(\.\.\., 3\) \(one per feature\)"
    ):
        as_feature_vector(np.ones(4), "beta", 3, 0.0)


@pytest.mark.parametrize("eps", [0.0, -1e-5, True, "1e-5", float("nan")])
def test_eps_is_a_positive_number(eps: object) -> None:
    with pytest.raises(InputError, match="`eps` must be a positive number"):
        as_eps(eps)  # type: ignore[arg-type]


def test_an_integer_eps_is_a_float() -> None:
    value = as_eps(1)
    assert value == 1.0
    assert type(value) is float


def test_layer_norm_takes_per_system_gamma_and_beta(rng: np.random.Generator) -> None:
    X = rng.standard_normal((2, 5, 3))
    gamma, beta = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    out = apply_layer_norm(X, gamma, beta, 1e-5)
    for b in range(2):
        close(out[b], layer_norm_by_hand(X[b], gamma[b], beta[b]))


# -- frozen rules and their repr -----------------------------------------------------------------


def test_set_frozen_sets_what_a_frozen_dataclass_refuses_to_assign() -> None:
    frozen = Frozen(np.zeros((2, 3)), 0.5, "w")
    assert frozen.label == "w"
    with pytest.raises(AttributeError):
        frozen.label = "v"  # type: ignore[misc]


def test_the_short_repr_shows_arrays_as_their_shapes() -> None:
    assert (
        repr(Frozen(np.zeros((2, 3)), 0.5, "w"))
        == "Frozen(weights=array(2, 3), scale=0.5, label='w')"
    )
    A, W_V, W_proj, _, _ = small_system(4, 3, 2, 0)
    assert repr(LinearRule(A, W_V, W_proj)) == (
        "LinearRule(A=array(4, 4), W_V=array(3, 2), W_proj=array(2, 3), skip=True, mlp=None)"
    )
