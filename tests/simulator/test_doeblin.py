"""The certified non-Perron bound (simulator.doeblin) against dense eigenvalues and hand-worked cases.

The bound must never be below the largest non-Perron ``|λ − α|`` that ``np.linalg.eigvals`` finds,
on random row-stochastic matrices of several sizes and sharpness. Two hand-worked families have a
known answer: the walk round a cycle ``(1 − t)/n 𝟙𝟙ᵀ + t P`` (P a cyclic shift), whose non-Perron
eigenvalues are ``t ω^m`` and whose ergodicity coefficient is exactly t at every power, so the
bound is tight; and the lazy walk ``(1 − t)/n 𝟙𝟙ᵀ + t I``, whose non-Perron eigenvalues are all t,
so the disk about α = t has radius 0. A float matrix whose rows sum to ``1 − η`` (within
STOCHASTIC_ATOL) has a Doeblin coefficient η·t below the true one of its row normalisation: only
the counted rounding errors keep the bound above it, which the last tests prove by removing them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

from oversmooth.simulator import doeblin
from oversmooth.simulator.doeblin import (
    HOPELESS_SQUARINGS,
    MAX_SQUARINGS,
    as_float64,
    nonperron_radius,
    radius_bounds,
)
from oversmooth.simulator.tolerances import BOUND_RTOL, EIG_TOL, STOCHASTIC_ATOL
from tests.simulator.stochastic import nonperron_moduli, sharpened
from tests.strategies import attention_params, build_attention

HEADS = 3


def cyclic_walk(n: int, t: float) -> np.ndarray:
    """``(1 − t)/n 𝟙𝟙ᵀ + t P``, P the cyclic shift: non-Perron eigenvalues ``t ω^m``, ``τ(A^k) = t^k``."""
    return (1.0 - t) / n * np.ones((n, n)) + t * np.roll(np.eye(n), 1, axis=1)


def lazy_walk(n: int, t: float) -> np.ndarray:
    """``(1 − t)/n 𝟙𝟙ᵀ + t I``: every non-Perron eigenvalue is t."""
    return (1.0 - t) / n * np.ones((n, n)) + t * np.eye(n)


def row_scaled_case() -> tuple[np.ndarray, float]:
    """A cyclic walk with every row scaled by ``1 − η`` (η just inside STOCHASTIC_ATOL), and the
    largest non-Perron ``|λ|`` of its exact row normalisation (dense eigenvalues; about t).

    Its float Doeblin coefficient is ``(1 − η) t``: η·t (4.5e-9) below the true modulus, more than
    EIG_TOL, so only the normalisation and squaring error terms keep the bound above it.
    """
    Ahat = (1.0 - 0.9 * STOCHASTIC_ATOL) * cyclic_walk(5, 0.5)[None]
    normalised = Ahat / Ahat.sum(axis=-1, keepdims=True)
    return Ahat, float(nonperron_moduli(normalised)[0])


@pytest.fixture
def squarings_done(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of heads of every squaring the test makes (``doeblin._squared`` recorded)."""
    squared = doeblin._squared
    calls: list[int] = []

    def counting(state):  # type: ignore[no-untyped-def]
        calls.append(state.B.shape[0])
        return squared(state)

    monkeypatch.setattr(doeblin, "_squared", counting)
    return calls


# -- the bound against dense eigenvalues -------------------------------------------------------------


@given(
    attention_params(n=(2, 30), scale=(0.2, 8.0)),
    st.sampled_from([1.0, 4.0, 20.0]),
    st.integers(0, 8),
)
@example(params={"kind": "symmetric", "n": 2, "scale": 0.2, "seed": 0}, power=1.0, squarings=8)
def test_the_bound_is_never_below_a_nonperron_eigenvalue(params, power, squarings) -> None:
    A = sharpened(build_attention(params, batch=(HEADS,)), power)
    bound = nonperron_radius(A, squarings=squarings)
    # The dense eigenvalues carry round-off; the bound must hold up to that.
    assert (bound >= nonperron_moduli(A) - EIG_TOL).all()
    for shift in (0.25, 0.5):
        shifted = nonperron_radius(A, squarings=squarings, shift=shift)
        assert (shifted >= nonperron_moduli(A, centre=shift) - EIG_TOL).all()


@pytest.mark.parametrize(("n", "t"), [(2, 0.5), (5, 0.5), (7, 0.3), (16, 0.9)])
@pytest.mark.parametrize("squarings", [0, 1, 4, MAX_SQUARINGS])
def test_the_bound_on_a_walk_round_a_cycle_is_tight(n: int, t: float, squarings: int) -> None:
    """``τ(A^k)^{1/k} = t`` for every k: the bound is t up to the counted round-off, never below."""
    bound = nonperron_radius(cyclic_walk(n, t)[None], squarings=squarings)[0]
    assert t <= bound <= t * (1.0 + BOUND_RTOL)


def test_more_squarings_never_loosen_the_bound(rng: np.random.Generator) -> None:
    """The bound is the least over the powers tried, and tends to the largest non-Perron |λ|."""
    A = sharpened(rng.random((HEADS, 12, 12)), 4.0)
    bounds = np.stack([nonperron_radius(A, squarings=s) for s in range(MAX_SQUARINGS + 1)])
    assert (np.diff(bounds, axis=0) <= 0).all()
    exact = nonperron_moduli(A)
    assert (bounds[-1] >= exact - EIG_TOL).all()
    assert (bounds[-1] < bounds[0]).all()
    assert_allclose(bounds[-1], exact, rtol=0.05)  # (C ρ^256)^(1/256): within a few percent


def test_a_rank_one_matrix_has_a_vanishing_residual_and_stops(squarings_done: list[int]) -> None:
    """``𝟙pᵀ`` has only 0 besides its Perron root: the deflated matrix is 0 exactly, squaring stops."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    A = np.tile(p, (4, 1))[None]
    bound = nonperron_radius(A, squarings=MAX_SQUARINGS)
    assert bound[0] < 1e-14
    assert squarings_done == []


# -- the shifted disk ------------------------------------------------------------------------------


def test_the_disk_about_the_repeated_eigenvalue_of_a_lazy_walk_has_radius_zero() -> None:
    t = 0.6
    A = np.stack([lazy_walk(6, t), cyclic_walk(6, t)])
    unshifted = nonperron_radius(A)
    assert (unshifted >= t).all()
    assert unshifted[0] <= t * (1.0 + BOUND_RTOL)
    # one centre per head: the lazy walk's disk about t shrinks to round-off, the cycle's about 0
    # keeps its radius t
    shifted = nonperron_radius(A, shift=[t, 0.0])
    assert shifted[0] < 1e-14
    assert shifted[1] == unshifted[1]
    # another centre: |t − α|, tight again
    assert 0.5 <= nonperron_radius(A[:1], shift=0.1)[0] <= 0.5 * (1.0 + BOUND_RTOL)


# -- refusals --------------------------------------------------------------------------------------


def _spoiled(kind: str) -> np.ndarray:
    """A 4×4 cyclic walk spoiled one way (see the parametrisation)."""
    A = cyclic_walk(4, 0.5)
    if kind == "nan":
        A[1, 2] = np.nan
    elif kind == "inf":
        A[0, 0] = np.inf
    elif kind == "negative":  # rows still sum to 1
        A[2, :2] += [-0.2, 0.2]
    else:  # a row sum off by more than STOCHASTIC_ATOL
        A[3] *= 1.0 + 2.0 * STOCHASTIC_ATOL
    return A


@pytest.mark.parametrize("kind", ["nan", "inf", "negative", "loose"])
def test_matrices_that_are_not_row_stochastic_get_no_bound(kind: str) -> None:
    with np.errstate(all="raise"):  # and no warning on the way
        bound = nonperron_radius(np.stack([_spoiled(kind), cyclic_walk(4, 0.5)]))
    assert np.isinf(bound[0])
    assert 0.5 <= bound[1] < 1.0


def test_row_sums_within_the_stochastic_tolerance_qualify() -> None:
    A = cyclic_walk(4, 0.5)
    A[3] *= 1.0 + 0.5 * STOCHASTIC_ATOL
    assert np.isfinite(nonperron_radius(A[None])).all()


def test_a_head_gets_the_same_bound_in_any_stack() -> None:
    """Heads are squared in chunks and unqualified ones dropped on the way: a stack of 11 mixed
    heads (diffuse, nearly reducible, not stochastic) gives each head exactly its bound alone."""
    rng = np.random.default_rng(11)
    n = 20
    heads = [sharpened(rng.random((n, n)), power) for power in (1.0, 6.0, 20.0) for _ in range(3)]
    negative = heads[0].copy()
    negative[0, :2] += [-0.5, 0.5]
    minus_inf = np.full((n, n), np.nan)
    minus_inf[:, 0] = -np.inf  # no warning either
    stack = np.stack([*heads[:4], negative, *heads[4:], minus_inf])
    shifts = rng.uniform(0.0, 0.5, len(stack))
    for squarings in (0, 1, 3):
        for shift in (np.zeros(len(stack)), shifts):
            together = nonperron_radius(stack, squarings=squarings, shift=shift)
            alone = [
                nonperron_radius(stack[i : i + 1], squarings=squarings, shift=shift[i : i + 1])[0]
                for i in range(len(stack))
            ]
            np.testing.assert_array_equal(together, alone)
            assert np.isinf(together[[4, 10]]).all()
            assert np.isfinite(np.delete(together, [4, 10])).all()


def test_as_float64_converts_host_data() -> None:
    converted = as_float64([[1, 0], [0, 1]])
    assert isinstance(converted, np.ndarray)
    assert converted.dtype == np.float64
    np.testing.assert_array_equal(converted, np.eye(2))


# -- rounding errors: the certificate is for the exact row normalisation ------------------------


@pytest.mark.parametrize("squarings", [0, 1, 2, 4])
def test_rows_summing_below_one_are_bounded_for_their_normalisation(squarings: int) -> None:
    Ahat, exact = row_scaled_case()
    bound = nonperron_radius(Ahat, squarings=squarings)[0]
    assert bound >= exact
    assert bound <= exact + 2.0 * STOCHASTIC_ATOL  # the error terms are no larger than needed


def _without_first_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the error bound of the first residual (normalisation, shift and deflation)."""
    first = doeblin._first_residual

    def uncounted(A, heads, shift):  # type: ignore[no-untyped-def]
        qualifies, state = first(A, heads, shift)
        return qualifies, state._replace(error=np.zeros_like(state.error))

    monkeypatch.setattr(doeblin, "_first_residual", uncounted)


def _without_squared_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop the error bound of every squaring (products, deflation, and the error carried)."""
    monkeypatch.setattr(doeblin, "_squared_error", lambda b, e, norm, n: np.zeros_like(b))


@pytest.mark.parametrize(
    ("drop", "squarings"), [(_without_first_error, 0), (_without_squared_error, 2)]
)
def test_the_bound_falls_below_the_true_modulus_without_its_error_terms(
    monkeypatch: pytest.MonkeyPatch, drop, squarings: int
) -> None:
    """The check above can fail: uncounted, the float coefficient (1 − η) t is the bound."""
    Ahat, exact = row_scaled_case()
    drop(monkeypatch)
    assert nonperron_radius(Ahat, squarings=squarings)[0] < exact - EIG_TOL


# -- radius_bounds: stopping rules -----------------------------------------------------------------


def _mixed_stack(rng: np.random.Generator) -> np.ndarray:
    """A diffuse head, a cyclic walk (t = 1/2) and a pure cycle (|λ| = 1: never below 1)."""
    return np.stack(
        [sharpened(rng.random((8, 8)), 1.0), cyclic_walk(8, 0.5), np.roll(np.eye(8), 1, axis=1)]
    )


def test_radius_bounds_skips_negative_radii_and_stops_below_each_target(
    rng: np.random.Generator,
) -> None:
    A = _mixed_stack(rng)
    no_shift = np.zeros(3)
    first = nonperron_radius(A, squarings=0)
    full = nonperron_radius(A, squarings=MAX_SQUARINGS)
    # head 0 aims at 0 (squares to the end), head 1 at its first bound (stops at once), head 2 skipped
    radius = np.array([0.0, first[1] * 1.5, -1.0])
    bounds = radius_bounds(A, radius, no_shift, MAX_SQUARINGS, give_up=False)
    assert bounds[0] == full[0]
    assert bounds[1] == first[1]
    assert np.isinf(bounds[2])


def test_radius_bounds_gives_up_on_a_head_that_stalls(
    rng: np.random.Generator, squarings_done: list[int]
) -> None:
    """A pure cycle's bound stays at 1 above a target of 1/2: with ``give_up`` it stops early."""
    A = _mixed_stack(rng)[2:]
    target, no_shift = np.array([0.5]), np.zeros(1)
    kept = radius_bounds(A, target, no_shift, MAX_SQUARINGS, give_up=False)
    assert len(squarings_done) == MAX_SQUARINGS
    squarings_done.clear()
    given_up = radius_bounds(A, target, no_shift, MAX_SQUARINGS, give_up=True)
    assert 0 < len(squarings_done) < MAX_SQUARINGS
    assert kept[0] >= 1.0
    assert given_up[0] >= 1.0


def test_radius_bounds_asks_triage_about_the_heads_still_squaring(
    rng: np.random.Generator,
) -> None:
    A = _mixed_stack(rng)
    asked: list[list[int]] = []

    def none_go_on(heads: np.ndarray) -> np.ndarray:
        asked.append(heads.tolist())
        return np.zeros(heads.size, dtype=bool)

    radius = np.array([0.0, 1.0, 0.0])  # head 1 is below 1 at once
    bounds = radius_bounds(A, radius, np.zeros(3), MAX_SQUARINGS, give_up=False, triage=none_go_on)
    assert asked == [[0, 2]]
    stopped = nonperron_radius(A, squarings=HOPELESS_SQUARINGS)
    np.testing.assert_array_equal(bounds[[0, 2]], stopped[[0, 2]])


# -- the estimate that orders the work ---------------------------------------------------------------


def test_the_schedule_estimate_finds_the_largest_nonperron_modulus() -> None:
    """The estimate that picks a head's disk (a heuristic, not a bound) is close to the largest
    non-Perron ``|λ − α|`` when that eigenvalue is well separated, with and without a shift."""
    from oversmooth.simulator.doeblin import nonperron_estimate as _nonperron_estimate

    rng = np.random.default_rng(7)
    n = 40
    # Two clusters barely connected: λ_2 close to 1, far from the rest (as in early layers).
    blocks = np.zeros((n, n))
    half = n // 2
    blocks[:half, :half] = rng.random((half, half))
    blocks[half:, half:] = rng.random((n - half, n - half))
    A = 0.95 * blocks / blocks.sum(axis=1, keepdims=True) + 0.05 / n
    stack = np.stack([A, sharpened(rng.random((n, n)), 1.0)])
    for shift in (0.0, 0.4):
        shifts = np.full(2, shift)
        expected = nonperron_moduli(stack, centre=shift)
        assert_allclose(_nonperron_estimate(stack, shifts), expected, rtol=0.1)


def test_a_head_gets_the_same_estimate_in_any_stack() -> None:
    """The estimate runs a few heads at a time (cache): each head of a stack of 11, with its own
    shift, gets bit for bit the estimate it gets alone."""
    from oversmooth.simulator.doeblin import nonperron_estimate as _nonperron_estimate

    rng = np.random.default_rng(12)
    n = 24
    stack = np.stack(
        [sharpened(rng.random((n, n)), power) for power in (1.0, 6.0, 20.0) for _ in range(4)][:11]
    )
    shifts = rng.uniform(0.0, 0.5, len(stack))
    together = _nonperron_estimate(stack, shifts)
    alone = [_nonperron_estimate(stack[i : i + 1], shifts[i : i + 1])[0] for i in range(11)]
    np.testing.assert_array_equal(together, alone)
    assert len(set(together.tolist())) == 11  # the heads differ, so a mix-up would show
