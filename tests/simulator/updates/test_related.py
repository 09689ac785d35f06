"""The mitigations of related work (simulator.updates.related) against their hand-written layers
(claims 25-29), the cache of first-layer values and its scaling protocol, per-system and
per-feature parameters, and the parameters each method refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.spectra import attention_doubly_stochastic
from oversmooth.simulator.tolerances import EIG_TOL, STEP_ATOL
from oversmooth.simulator.updates import (
    SCALED,
    AttnScaleRule,
    FeatScaleRule,
    LinearRule,
    NeuTRENORule,
    SimilarityRemovalRule,
    ValueResidualRule,
)
from tests.simulator.updates.formulas import close, features, seeds, sizes, small_system


@given(n=sizes, d=features, d_v=features, seed=seeds, lam=st.floats(0.0, 1.0))
def test_neutreno_layers(n, d, d_v, seed, lam):
    """Layer 0 is standard; later layers add lam (V_0 - V_l) before W_proj (§7.3)."""
    A, W_V, W_proj, X0, _rng = small_system(n, d, d_v, seed)
    rule = NeuTRENORule(A, W_V, W_proj, lam=lam)
    cache: dict = {}
    X1 = rule(X0, 0, cache)
    close(X1, X0 + A @ X0 @ W_V @ W_proj)
    X2 = rule(X1, 1, cache)
    V0, V1 = X0 @ W_V, X1 @ W_V
    close(X2, X1 + (A @ V1 + lam * (V0 - V1)) @ W_proj, scale=float(np.abs(X2).max()))


@given(n=sizes, d=features, d_v=features, seed=seeds, w=st.tuples(st.floats(0, 2), st.floats(0, 2)))
def test_claim28_resformer_and_svformer(n, d, d_v, seed, w):
    A, W_V, W_proj, X0, rng = small_system(n, d, d_v, seed)
    X1 = rng.standard_normal(X0.shape)
    V1, Vn = X0 @ W_V, X1 @ W_V
    standard = X0 + A @ V1 @ W_proj
    res = ValueResidualRule(A, W_V, W_proj, mode="resformer", weights=w)
    sv = ValueResidualRule(A, W_V, W_proj, mode="svformer")
    res_cache, sv_cache = {}, {}
    close(res(X0, 0, res_cache), standard)
    close(sv(X0, 0, sv_cache), standard)
    close(res(X1, 1, res_cache), X1 + A @ (w[0] * V1 + w[1] * Vn) @ W_proj, scale=3.0)
    close(sv(X1, 1, sv_cache), X1 + A @ V1 @ W_proj)


@given(n=sizes, d=features, seed=seeds, tau=st.floats(0.0, 2.0))
def test_claim29_similarity_removal(n, d, seed, tau):
    """The branch's LFC is scaled by (1 - tau) and its HFC is kept."""
    A, W_V, W_proj, X, _ = small_system(n, d, d, seed)
    branch = SimilarityRemovalRule(A, W_V, W_proj, tau=tau)(X, 0, {}) - X
    plain = A @ X @ W_V @ W_proj
    mean = plain.mean(axis=0)
    close(branch.mean(axis=0), (1 - tau) * mean)
    close(branch - branch.mean(axis=0), plain - mean)


@given(n=sizes, d=features, seed=seeds, omega=st.floats(-0.9, 3.0))
def test_claim25_attnscale(n, d, seed, omega):
    rng = np.random.default_rng(seed)
    A = attention_doubly_stochastic(n, rng=rng)
    W_V, W_proj = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    rule = AttnScaleRule(A, W_V, W_proj, omega)
    close(rule.A_hat.sum(axis=1), np.ones(n))
    expected = np.sort(np.linalg.eigvalsh(A))[:-1] * (1 + omega)
    got = np.sort(np.linalg.eigvalsh(0.5 * (rule.A_hat + rule.A_hat.T)))
    mask = np.abs(got - 1.0) > EIG_TOL
    np.testing.assert_allclose(np.sort(got[mask])[: n - 1], np.sort(expected), atol=EIG_TOL)
    X = rng.standard_normal((n, d))
    close(rule(X, 0, {}), X + rule.A_hat @ X @ W_V @ W_proj, scale=10.0)
    identity = AttnScaleRule(A, W_V, W_proj, 0.0)
    close(identity.A_hat, A)


@given(n=sizes, d=features, seed=seeds)
def test_claim26_featscale(n, d, seed):
    A, W_V, W_proj, X, rng = small_system(n, d, d, seed)
    s_d, s_h = rng.standard_normal(d), rng.standard_normal(d)
    Y = A @ X @ W_V @ W_proj
    dc = np.broadcast_to(Y.mean(axis=0), Y.shape)
    hc = Y - dc
    paper = FeatScaleRule(A, W_V, W_proj, s_d, s_h)
    code = FeatScaleRule(A, W_V, W_proj, s_d, s_h, code_faithful=True)
    close(paper(X, 0, {}), X + Y + s_d * dc + s_h * hc)
    close(code(X, 0, {}), FeatScaleRule(A, W_V, W_proj, 2 * s_d, 2 * s_h)(X, 0, {}))
    close(FeatScaleRule(A, W_V, W_proj, 0.0, 0.0)(X, 0, {}), LinearRule(A, W_V, W_proj)(X, 0, {}))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda A, W: NeuTRENORule(A, W, W, lam=-0.1), "`lam` must be at least 0"),
        (lambda A, W: AttnScaleRule(A, W, W, omega=-1.5), "`omega` must be at least -1"),
    ],
    ids=["neutreno-lam", "attnscale-omega"],
)
def test_rule_parameters_outside_the_methods_domain_are_refused(build, message) -> None:
    A = np.full((3, 3), 1 / 3)
    with pytest.raises(InputError, match=message):
        build(A, np.eye(2))


def test_similarity_removal_accepts_any_real_tau() -> None:
    """Stated, not refused: the (1 - tau) scaling of the token mean holds for every real tau."""
    A = np.full((3, 3), 1 / 3)
    X = np.arange(6.0).reshape(3, 2)
    for tau in (-5.0, 0.0, 1.0, 2.5):
        Y = SimilarityRemovalRule(A, np.eye(2), np.eye(2), tau=tau)(X, 0, {}) - X
        branch = LinearRule(A, np.eye(2), np.eye(2))(X, 0, {}) - X
        np.testing.assert_allclose(Y.mean(axis=0), (1 - tau) * branch.mean(axis=0), atol=STEP_ATOL)


# -- the cache of first-layer values -------------------------------------------------------------


def _value_rules(A, W_V, W_proj) -> list[Any]:  # type: ignore[no-untyped-def]
    """The rules that keep the first layer's values in the cache."""
    return [
        NeuTRENORule(A, W_V, W_proj, lam=0.3),
        ValueResidualRule(A, W_V, W_proj, mode="resformer", weights=(0.7, 0.2)),
        ValueResidualRule(A, W_V, W_proj, mode="svformer"),
    ]


def test_the_first_values_are_kept_under_the_scaled_key() -> None:
    A, W_V, W_proj, X0, _ = small_system(5, 3, 2, 4)
    for rule in _value_rules(A, W_V, W_proj):
        cache: dict = {}
        rule(X0, 0, cache)
        (kept,) = cache[SCALED].values()
        close(kept, X0 @ W_V)


def test_rules_with_cached_values_are_homogeneous_jointly_with_the_cache(
    rng: np.random.Generator,
) -> None:
    """Scaling X and ``cache["scaled"]`` by c scales the next layer by c (the cache protocol)."""
    A, W_V, W_proj, X0, _ = small_system(5, 3, 2, 4)
    X1, c = rng.standard_normal(X0.shape), 3.5
    for rule in _value_rules(A, W_V, W_proj):
        assert rule.homogeneous
        cache: dict = {}
        rule(X0, 0, cache)
        scaled = {SCALED: {key: c * value for key, value in cache[SCALED].items()}}
        close(rule(c * X1, 1, scaled), c * rule(X1, 1, cache), scale=c)


def test_values_first_seen_at_a_later_layer_make_it_a_standard_layer() -> None:
    A, W_V, W_proj, X, _ = small_system(5, 3, 2, 6)
    standard = LinearRule(A, W_V, W_proj)(X, 0, {})
    for rule in _value_rules(A, W_V, W_proj):
        close(rule(X, 4, {}), standard)


# -- per-system and per-feature parameters --------------------------------------------------------


def test_attnscale_takes_one_omega_per_system() -> None:
    n = 4
    A = attention_doubly_stochastic(n, rng=2)
    W = np.eye(2)
    rule = AttnScaleRule(A, W, W, omega=[0.0, 1.0, -1.0])
    assert rule.batch_shape == (3,)
    close(rule.A_hat[0], A)
    close(rule.A_hat[1], 2.0 * A - 1.0 / n)  # 1/n + 2 (A − 1/n)
    close(rule.A_hat[2], np.full((n, n), 1.0 / n))  # ω = −1: the uniform matrix


def test_featscale_scales_each_feature_by_its_own_factor() -> None:
    A, W_V, W_proj, X, _ = small_system(5, 3, 3, 1)
    s_d, s_h = np.array([1.0, 0.0, -2.0]), np.array([0.0, 0.5, 0.0])
    Y = A @ X @ W_V @ W_proj
    dc = Y.mean(axis=0)
    hc = Y - dc
    expected = X + Y + dc * s_d + hc * s_h  # column j: s_d[j] · DC + s_h[j] · HC
    close(FeatScaleRule(A, W_V, W_proj, s_d, s_h)(X, 0, {}), expected)


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda A, W: NeuTRENORule(A, W, W, lam="big"), "`lam` must be a real number; got 'big'"),
        (lambda A, W: SimilarityRemovalRule(A, W, W, tau=np.nan), "`tau` must be finite"),
        (lambda A, W: ValueResidualRule(A, W, W, weights=(1.0,)), "`weights` must be a pair"),
        (lambda A, W: ValueResidualRule(A, W, W, weights=0.5), "`weights` must be a pair"),
        (
            lambda A, W: ValueResidualRule(A, W, W, weights=(1.0, np.inf)),
            "`weights\\[1\\]` must be finite",
        ),
        (lambda A, W: AttnScaleRule(A, W, W, omega=[0.0, -2.0]), "`omega` must be at least -1"),
    ],
    ids=["lam-text", "tau-nan", "weights-one", "weights-scalar", "weights-inf", "omega-one-system"],
)
def test_parameters_that_are_not_real_numbers_or_pairs_are_refused(build, message) -> None:
    A = np.full((3, 3), 1 / 3)
    with pytest.raises(InputError, match=message):
        build(A, np.eye(2))
