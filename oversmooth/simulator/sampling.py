"""How many inputs a share needs: bootstrap intervals over inputs and a stopping rule.

An audit counts cases — one per (input, block, head) — by class (perron, non-perron, ...). The
cases of one input share its hidden states, so they are not independent draws: the inputs are the
unit of sampling. :func:`share_intervals` resamples the inputs with replacement (a percentile
bootstrap) and gives each class share's central interval; :func:`inputs_needed` is the rule that
stops adding inputs once every share's interval is narrower than a stated width.

The rule looks at a fixed grid of input counts, ``first, first + every, ...`` (never at counts a
batch size or a shard boundary happens to give), and each look draws its resamples from a seed
that depends on the count alone, so the count it returns depends on the inputs and their order
only. Looking several times is optional stopping: the interval at the count the rule stops at
covers the share somewhat less often than its nominal level; the stated width is therefore a
precision target, not a guarantee of coverage (docs/theory.md §6.13).

Functions
---------
share_intervals  -- (low, high) of each class share over the inputs given
widest_interval  -- the widest of those intervals at one look of the rule
inputs_needed    -- the first grid count at which every interval is narrower than ``width``
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.validation import as_float_array, check_positive_int

__all__ = ["Stop", "inputs_needed", "share_intervals", "widest_interval"]

#: Bootstrap resamples per interval (the 2.5 % and 97.5 % percentiles of 2000 shares move by
#: about 0.002 between seeds at the widths the rule stops at).
RESAMPLES = 2000
#: Confidence level of the intervals.
LEVEL = 0.95


def share_intervals(
    counts: ArrayLike, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
) -> NDArray[np.float64]:
    """Percentile-bootstrap intervals over inputs of each class's share of the cases.

    Parameters
    ----------
    counts : (n_inputs, n_classes) array_like
        Cases of each class per input (non-negative, at least one case in all; an input without
        cases weighs nothing in the shares it is drawn into).
    resamples : int
        Bootstrap resamples.
    seed : int
        Seed of the resampling (the same counts and seed give the same intervals).
    level : float
        Central probability of each interval.

    Returns
    -------
    (n_classes, 2) float ndarray
        ``(low, high)`` per class: the ``(1 ∓ level)/2`` percentiles of the share
        ``Σ_i w_i c_ik / Σ_i w_i Σ_k c_ik`` over multinomial input weights ``w`` (n draws of n).
    """
    table = as_float_array(counts, "counts", min_ndim=2)
    check_positive_int(resamples, "resamples")
    n_inputs = table.shape[0]
    totals = table.sum(axis=1)
    if n_inputs == 0 or np.any(table < 0) or totals.sum() <= 0:
        raise InputError(
            f"`counts` must hold non-negative counts with at least one case; got {n_inputs} "
            f"inputs and {totals.sum():g} cases"
        )
    weights = np.random.default_rng(seed).multinomial(
        n_inputs, np.full(n_inputs, 1.0 / n_inputs), size=resamples
    )
    drawn = weights @ totals  # a resample of inputs without cases has no share: left out
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = (weights @ table) / drawn[:, None]  # (resamples, n_classes)
    tails = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    return np.nanpercentile(shares, tails, axis=0).T


@dataclass(frozen=True)
class Stop:
    """Where the stopping rule stopped.

    Attributes
    ----------
    inputs : int
        Inputs to use: the first grid count whose every interval is narrower than the width, or
        every input when none is (or when there are fewer than the grid's first count).
    width : float
        The widest of the class shares' intervals over those inputs (NaN when not computed: fewer
        inputs than the grid's first count, where every input is used without a look).
    met : bool
        Whether the width was reached (False: every input used and the target not met, or no look).
    """

    inputs: int
    width: float
    met: bool


def inputs_needed(
    counts: ArrayLike,
    width: float,
    *,
    first: int,
    every: int,
    seed: int = 0,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
) -> Stop:
    """The fewest inputs, on the grid ``first, first + every, ...``, whose class shares' intervals
    (:func:`share_intervals`) are all narrower than ``width``.

    Parameters
    ----------
    counts : (n_inputs, n_classes) array_like
        Cases of each class per input, in input order.
    width : float
        Target: every interval's ``high − low`` at most this.
    first, every : int
        The grid of input counts looked at.
    seed : int
        The look at n inputs resamples with ``default_rng([seed, n])``: its answer depends on the
        first n inputs only.

    Returns
    -------
    Stop
    """
    table = as_float_array(counts, "counts", min_ndim=2)
    check_positive_int(first, "first")
    check_positive_int(every, "every")
    n_inputs = table.shape[0]
    widest = float("nan")
    for n in range(first, n_inputs + 1, every):
        widest = widest_interval(table[:n], seed=seed, resamples=resamples, level=level)
        if widest <= width:
            return Stop(n, widest, True)
    if n_inputs >= first and (n_inputs - first) % every:  # the last inputs, off the grid
        widest = widest_interval(table, seed=seed, resamples=resamples, level=level)
    return Stop(n_inputs, widest, bool(widest <= width))


def widest_interval(
    counts: ArrayLike, *, seed: int = 0, resamples: int = RESAMPLES, level: float = LEVEL
) -> float:
    """The widest class-share interval over the inputs of ``counts`` (n, n_classes), resampled
    with the seed of a look at n inputs (a function of ``seed`` and n only); NaN where the inputs
    hold no case (no share, so never narrow enough)."""
    table = as_float_array(counts, "counts", min_ndim=2)
    if table.sum() == 0:
        return float("nan")
    look = int(np.random.SeedSequence([seed, table.shape[0]]).generate_state(1)[0])
    intervals = share_intervals(table, resamples=resamples, seed=look, level=level)
    return float(np.max(intervals[:, 1] - intervals[:, 0]))
