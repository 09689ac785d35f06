"""Rules by name (simulator.updates.registry): every registry class is an UpdateRule, each system
name builds its documented class with its documented defaults, and options are checked by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates import (
    RULE_OPTIONS,
    RULES,
    SYSTEM_RULES,
    AttnScaleRule,
    FeatScaleRule,
    LinearRule,
    NeuTRENORule,
    PostLNRule,
    PreLNRule,
    SimilarityRemovalRule,
    SoftmaxAttentionRule,
    UpdateRule,
    ValueResidualRule,
    rule_from_system,
)
from tests.simulator.updates.formulas import close, small_system

#: Per system rule name: its class and the attributes its defaults give (the docstring's values).
DOCUMENTED = {
    "linear": (LinearRule, {"skip": True, "mlp": None}),
    "no-skip": (LinearRule, {"skip": False}),
    "pre-ln": (PreLNRule, {"eps": 1e-5}),
    "post-ln": (PostLNRule, {"eps": 1e-5}),
    "neutreno": (NeuTRENORule, {"lam": 0.6}),
    "resformer": (ValueResidualRule, {"mode": "resformer", "weights": (0.5, 0.5)}),
    "svformer": (ValueResidualRule, {"mode": "svformer"}),
    "similarity-removal": (SimilarityRemovalRule, {"tau": 1.0}),
    "attnscale": (AttnScaleRule, {"omega": 0.5}),
    "featscale": (FeatScaleRule, {"s_d": 0.0, "s_h": 0.5, "code_faithful": False}),
}

#: A value other than the default for every option of RULE_OPTIONS.
OPTION_VALUES: dict[str, Any] = {
    "eps": 1e-3,
    "lam": 0.2,
    "weights": (0.3, 0.7),
    "tau": 0.5,
    "omega": 0.1,
    "s_d": 0.25,
    "s_h": -0.5,
    "code_faithful": True,
}


def test_registry_names_build_rules():
    A, W_V, W_proj, _, _ = small_system(4, 3, 3, 0)
    for name in SYSTEM_RULES:
        rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj, gamma=np.ones(3))
        assert isinstance(rule, tuple(RULES.values()))
    assert rule_from_system("neutreno", A=A, W_V=W_V, W_proj=W_proj, lam=0.4).lam == 0.4


def _one_of_each(cls: type, rng: np.random.Generator):
    """An instance of a registry class on a small system, with the arguments it requires."""
    A, W_V, W_proj, _, _ = small_system(4, 3, 2, 0)
    if cls is SoftmaxAttentionRule:
        W_Q, W_K, W_V = rng.standard_normal((3, 3, 4))
        return cls(W_Q, W_K, W_V, rng.standard_normal((4, 3)), n_heads=2, norm="pre")
    required = {AttnScaleRule: {"omega": 0.5}, FeatScaleRule: {"s_d": 0.1, "s_h": 0.2}}
    return cls(A, W_V, W_proj, **required.get(cls, {}))


@pytest.mark.parametrize("name", RULES)
def test_every_registry_rule_is_an_update_rule(name, rng):
    rule = _one_of_each(RULES[name], rng)
    assert isinstance(rule, UpdateRule)
    X = rule.check_tokens(rng.standard_normal((4, 3)))
    assert rule.batch_shape == ()
    assert isinstance(rule.homogeneous, bool)
    assert rule(X, 0, {}).shape == X.shape


@pytest.mark.parametrize("name", SYSTEM_RULES)
def test_each_system_name_builds_its_documented_rule(name: str) -> None:
    A, W_V, W_proj, _, _ = small_system(4, 3, 3, 0)
    rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj)
    cls, defaults = DOCUMENTED[name]
    assert type(rule) is cls
    for attribute, value in defaults.items():
        np.testing.assert_array_equal(getattr(rule, attribute), value)


@pytest.mark.parametrize("name", SYSTEM_RULES)
def test_every_listed_option_is_accepted_and_kept(name: str) -> None:
    A, W_V, W_proj, _, _ = small_system(4, 3, 3, 0)
    options = {option: OPTION_VALUES[option] for option in RULE_OPTIONS[name]}
    rule = rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj, **options)
    for option, value in options.items():
        np.testing.assert_array_equal(getattr(rule, option), value)


def test_the_options_table_covers_exactly_the_system_rules() -> None:
    assert tuple(RULE_OPTIONS) == SYSTEM_RULES
    assert set(DOCUMENTED) == set(SYSTEM_RULES)


def test_layer_norm_parameters_reach_only_the_layer_norm_rules(rng: np.random.Generator) -> None:
    A, W_V, W_proj, X, _ = small_system(4, 3, 3, 0)
    gamma, beta = rng.standard_normal(3), rng.standard_normal(3)
    pre = rule_from_system("pre-ln", A=A, W_V=W_V, W_proj=W_proj, gamma=gamma, beta=beta)
    close(pre(X, 0, {}), PreLNRule(A, W_V, W_proj, gamma=gamma, beta=beta)(X, 0, {}))
    linear = rule_from_system("linear", A=A, W_V=W_V, W_proj=W_proj, gamma=gamma, beta=beta)
    close(linear(X, 0, {}), LinearRule(A, W_V, W_proj)(X, 0, {}))


@pytest.mark.parametrize(
    ("name", "option", "accepted"),
    [
        ("linear", "lam", "none"),
        ("pre-ln", "tau", "eps"),
        ("featscale", "omega", "s_d, s_h, code_faithful"),
    ],
)
def test_an_option_the_rule_does_not_take_is_refused_listing_those_it_does(
    name: str, option: str, accepted: str
) -> None:
    A, W_V, W_proj, _, _ = small_system(4, 3, 3, 0)
    with pytest.raises(InputError) as info:
        rule_from_system(name, A=A, W_V=W_V, W_proj=W_proj, **{option: 1.0})
    assert str(info.value) == (
        f"rule option `{option}` is not accepted by rule {name!r} (accepted: {accepted})"
    )


def test_an_unknown_rule_name_lists_the_system_rules() -> None:
    A, W_V, W_proj, _, _ = small_system(4, 3, 3, 0)
    with pytest.raises(
        InputError,
        match=r"`rule` must be one of linear, no-skip, pre-ln, .*; got 'softmax-attention'",
    ):
        rule_from_system("softmax-attention", A=A, W_V=W_V, W_proj=W_proj)
