"""Bootstrap intervals of class shares over inputs, and the rule that stops adding inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.sampling import inputs_needed, share_intervals, widest_interval


def _counts(n_inputs: int, share: float, spread: float, cases: int, seed: int) -> np.ndarray:
    """Two-class counts whose per-input share is Beta around ``share`` (input-level spread)."""
    rng = np.random.default_rng(seed)
    a = share * (1 - spread) / spread
    b = (1 - share) * (1 - spread) / spread
    hits = rng.binomial(cases, rng.beta(a, b, n_inputs))
    return np.stack([hits, cases - hits], axis=1).astype(float)


def test_identical_inputs_give_zero_width_intervals_at_the_share() -> None:
    counts = np.tile([3.0, 1.0], (10, 1))
    np.testing.assert_allclose(share_intervals(counts), [[0.75, 0.75], [0.25, 0.25]])


@given(st.integers(2, 40), st.floats(0.1, 0.9), st.integers(0, 2**31 - 1))
def test_the_interval_holds_the_pooled_share(n: int, share: float, seed: int) -> None:
    counts = _counts(n, share, 0.05, 20, seed)
    pooled = counts.sum(axis=0) / counts.sum()
    low, high = share_intervals(counts, seed=seed).T
    assert np.all(low <= pooled + 1e-12)
    assert np.all(pooled <= high + 1e-12)


def test_the_interval_narrows_like_one_over_root_n() -> None:
    counts = _counts(400, 0.6, 0.1, 50, seed=3)
    narrow, wide = widest_interval(counts), widest_interval(counts[:100])
    assert 1.5 < wide / narrow < 2.7  # √4 = 2


def test_an_input_without_cases_weighs_nothing() -> None:
    counts = _counts(30, 0.5, 0.05, 10, seed=1)
    empty = np.vstack([counts, np.zeros((1, 2))])
    low, high = share_intervals(empty).T
    assert np.all(np.isfinite(low))
    assert np.all(high >= low)


@pytest.mark.parametrize(
    "counts", [np.zeros((3, 2)), -np.ones((3, 2)), np.ones((0, 2)), np.array([[np.nan, 1.0]])]
)
def test_counts_that_are_no_counts_are_refused(counts: np.ndarray) -> None:
    with pytest.raises(InputError):
        share_intervals(counts)


def test_the_rule_stops_at_the_first_grid_count_narrow_enough() -> None:
    counts = _counts(300, 0.6, 0.1, 50, seed=4)
    stop = inputs_needed(counts, 0.06, first=32, every=16)
    assert stop.met
    assert (stop.inputs - 32) % 16 == 0
    assert stop.width <= 0.06
    earlier = [widest_interval(counts[:n]) for n in range(32, stop.inputs, 16)]
    assert all(width > 0.06 for width in earlier)


def test_the_rule_depends_on_the_first_inputs_only() -> None:
    """Inputs after the stop change nothing: the count a batch or a shard happens to reach is
    never looked at, and each look's resampling depends on its count alone."""
    counts = _counts(300, 0.6, 0.1, 50, seed=5)
    stop = inputs_needed(counts, 0.06, first=32, every=16)
    other = np.vstack([counts[: stop.inputs], _counts(100, 0.2, 0.3, 50, seed=6)])
    assert inputs_needed(other, 0.06, first=32, every=16) == stop


def test_fewer_inputs_than_the_first_look_all_count_without_a_look() -> None:
    stop = inputs_needed(_counts(10, 0.5, 0.1, 20, seed=7), 0.05, first=32, every=16)
    assert stop.inputs == 10
    assert not stop.met
    assert np.isnan(stop.width)


def test_a_target_never_met_uses_every_input_and_says_so() -> None:
    counts = _counts(70, 0.5, 0.4, 5, seed=8)
    stop = inputs_needed(counts, 0.001, first=32, every=16)
    assert stop.inputs == 70
    assert not stop.met
    assert stop.width == pytest.approx(widest_interval(counts))


def test_inputs_without_any_case_are_never_narrow_enough() -> None:
    """Looks over inputs that hold no case (a model whose dominance step found none) give no
    width: the rule uses every input and says the target was not met."""
    counts = np.zeros((40, 2))
    assert np.isnan(widest_interval(counts))
    stop = inputs_needed(counts, 0.05, first=32, every=16)
    assert stop.inputs == 40
    assert not stop.met
