"""The claim modules' shared helpers (:mod:`oversmooth.simulator.checks.shared`): the margin units on
hand-worked values, the builders' invariants, the matching error and the seed scan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.simulator.checks import MAX_LAYERS, SCAN_TRIES, shared
from oversmooth.simulator.tolerances import EPS, SMOOTH_THRESHOLD, TIE_RTOL


@pytest.mark.parametrize(
    ("violation", "tolerance", "margin"),
    [(0.0, 1e-8, 1.0), (1e-8, 1e-8, 0.0), (3e-8, 1e-8, -2.0), (math.nan, 1.0, -math.inf)],
)
def test_tolerance_margin_is_one_minus_the_violation_in_tolerances(
    violation: float, tolerance: float, margin: float
) -> None:
    assert shared.tolerance_margin(violation, tolerance) == pytest.approx(margin)


def test_decades_below_counts_decades_under_the_threshold_down_to_eps() -> None:
    assert shared.decades_below(1e-3, threshold=1e-1) == pytest.approx(2.0)
    assert shared.decades_below(-1e-3, threshold=1e-1) == pytest.approx(2.0)  # |value|
    assert shared.decades_below(10.0, threshold=1.0) == pytest.approx(-1.0)
    assert shared.decades_below(0.0) == pytest.approx(math.log10(SMOOTH_THRESHOLD / EPS))
    assert shared.decades_below(math.inf) == -math.inf
    assert shared.decades_below(math.nan) == -math.inf


def test_decades_above_counts_decades_over_the_threshold() -> None:
    assert shared.decades_above(1e4, 10.0) == pytest.approx(3.0)
    assert shared.decades_above(1.0, 10.0) == pytest.approx(-1.0)
    for bad in (0.0, -1.0, math.nan):
        assert shared.decades_above(bad, 10.0) == -math.inf


def test_relative_floors_the_scale_and_max_abs_is_the_largest_modulus() -> None:
    assert shared.relative(2.0, 4.0) == 0.5
    assert shared.relative(0.0, 0.0) == 0.0
    assert shared.relative(1.0, 0.0) == 1.0 / np.finfo(np.float64).tiny
    assert shared.max_abs([[1.0, -3.0], [2.0, 0.5]]) == 3.0


def test_matched_error_pairs_the_multisets_not_the_positions() -> None:
    assert shared.matched_error([1, 2, 3j], [3j, 1, 2]) == 0.0
    # the best matching pairs 0 with 0.1 and 5 with 5.5, worst distance 0.5 (not 4.9 in order)
    assert shared.matched_error([0.0, 5.0], [5.5, 0.1]) == pytest.approx(0.5)


def test_orthogonal_is_orthogonal_and_uniform_spectrum_starts_at_low() -> None:
    gen = np.random.default_rng(1)
    Q = shared.orthogonal(5, gen)
    assert_allclose(Q @ Q.T, np.eye(5), atol=1e-12)
    values = shared.uniform_spectrum(gen, 6, 0.5, -0.25)
    assert values[0] == 0.5
    assert np.all((values >= -0.25) & (values <= 0.5))


def test_linear_rule_applies_x_plus_a_x_h_transposed() -> None:
    gen = np.random.default_rng(2)
    A = shared.attention("symmetric", 4, 1.0, gen)
    H = gen.standard_normal((3, 3))
    X = gen.standard_normal((4, 3))
    assert_allclose(shared.linear_rule(A, H)(X, 0, {}), X + A @ X @ H.T, atol=1e-12)
    assert_allclose(shared.linear_rule(A, H, skip=False)(X, 0, {}), A @ X @ H.T, atol=1e-12)


@pytest.mark.parametrize("kind", ["symmetric", "general"])
def test_attention_is_row_stochastic(kind: str) -> None:
    A = shared.attention(kind, 5, 1.0, np.random.default_rng(3))
    assert A.shape == (5, 5)
    assert np.all(A >= 0)
    assert_allclose(A.sum(axis=1), 1.0, atol=1e-12)
    if kind == "symmetric":  # symmetric scores: a real spectrum
        assert_allclose(shared.eig(A).imag, 0.0, atol=1e-10)


def test_modulus_gap_and_kind_margin_on_a_two_token_system() -> None:
    # spec(A) = {1, 0.5}; H = [0.6]: Perron |1.6| against |1.3|, gap 0.3 / 1.6
    eig_A, eig_H = np.array([1.0, 0.5]), np.array([0.6])
    gap = 0.3 / 1.6
    assert shared.modulus_gap(eig_A, eig_H, perron=True) == pytest.approx(gap + TIE_RTOL)
    assert shared.modulus_gap(eig_A, eig_H, perron=False) == pytest.approx(-gap + TIE_RTOL)
    assert shared.kind_margin(eig_A, eig_H, perron=True) == pytest.approx(gap + TIE_RTOL)
    # asking for the kind that does not dominate: the (negative) gap, dominance_kinds agreeing
    assert shared.kind_margin(eig_A, eig_H, perron=False) == pytest.approx(-gap + TIE_RTOL)
    # H = [-0.5] is in S5's band: |0.5| against |0.75|, non-Perron
    assert shared.kind_margin(eig_A, [-0.5], perron=False) == pytest.approx(0.25 / 0.75 + TIE_RTOL)


def test_rows_rate_is_the_next_rows_largest_modulus_over_the_top() -> None:
    A = np.array([[0.75, 0.25], [0.25, 0.75]])  # spec {1, 0.5}
    H = np.diag([0.6, 0.2])
    system = shared.LinearSystem(A, H, np.zeros((2, 2)))
    rate, i_star = shared.rows_rate(system)
    # mu = 1 + lam_A lam_H: row of 1 gives 1.6, 1.2; row of 0.5 gives 1.3, 1.1
    assert rate == pytest.approx(1.3 / 1.6)
    assert shared.eig(A)[i_star] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("rate", "target", "layers"),
    [(0.5, 1e-3, 10 + 10), (0.0, 1e-3, 10), (-0.1, 1e-3, 10), (1.0, 1e-3, MAX_LAYERS)],
)
def test_layers_for_counts_the_halvings_and_caps(rate: float, target: float, layers: int) -> None:
    assert shared.layers_for(rate, target) == layers
    assert shared.layers_for(1 - 1e-9, 1e-3) == MAX_LAYERS


def test_scan_returns_the_first_accepted_seed_and_gives_up_after_the_tries() -> None:
    tried = []

    def build(gen: np.random.Generator) -> float:
        tried.append(gen)
        return len(tried)

    assert shared.scan(7, build, lambda k: k == 3) == 3
    assert len(tried) == 3
    # the k-th try draws from default_rng([seed, k])
    assert shared.scan(7, lambda gen: gen.random(), lambda _: True) == (
        np.random.default_rng([7, 0]).random()
    )
    with pytest.raises(RuntimeError, match=f"{SCAN_TRIES} seeds"):
        shared.scan(7, lambda gen: 0, lambda _: False)


def test_dense_system_is_reproducible_from_its_seed() -> None:
    p = {"seed": 4, "n": 5, "d": 3}
    A, W_V, W_proj, X0 = shared.dense_system(p)
    assert (A.shape, W_V.shape, W_proj.shape, X0.shape) == ((5, 5), (3, 3), (3, 3), (5, 3))
    for first, again in zip((A, W_V, W_proj, X0), shared.dense_system(p), strict=True):
        assert np.array_equal(first, again)
    assert not np.array_equal(X0, shared.dense_system({**p, "seed": 5})[3])
