"""The checkable claims 1-30 and 34-35 (docs/theory.md §8) as data: draw an instance, run it, get a
margin.

Every :class:`Check` draws the parameters of one random instance (sizes, spectrum ranges, a scale
and a seed: a small dict of ints, floats and strings described by :attr:`Check.space`) and runs
it, returning a **margin**: ``>= 0`` when the claim held on that instance, negative for a
counterexample. Its unit is stated per check (:attr:`Check.unit`); the common ones are

- ``tolerance``: ``1 - violation / tolerance`` (1 is exact, 0 is the tolerance, > 1 strictly inside
  an inequality);
- ``decades``: ``log10(threshold / value)`` for a quantity that must fall below a threshold (capped
  at the float64 floor, so at most ``log10(threshold / eps)``);
- ``gap``: the relative modulus gap ``(|mu_a| - |mu_b|) / max |mu|`` between the eigenvalue kind
  that must dominate and the other kind, plus the tie allowance :data:`oversmooth.simulator.tolerances.TIE_RTOL`.

Where the paper's implication can fail outside its hypothesis (claim 11, claim 17's perturbed
balance) a check with ``counterexample=True`` asserts that it does fail; its margin measures the
failure. :func:`verify` runs every check on many drawn instances and returns
:class:`CheckResult` data; a failed claim is data, never an exception.

Claims 12-17 and 20 need long runs. Their instances are kept moderate (n, d <= 12, at most a few
thousand layers), and where a claim is only testable on well-separated spectra the check scans the
seeds ``[seed, 0], [seed, 1], ...`` for the first instance passing the filter the spec describes.

The checks live in submodules by claim group: :mod:`~oversmooth.simulator.checks.linear_algebra` (claims
1-11), :mod:`~oversmooth.simulator.checks.layer_dynamics` (12-20), :mod:`~oversmooth.simulator.checks.reparameterization`
(21-24), :mod:`~oversmooth.simulator.checks.related` (25-30) and :mod:`~oversmooth.simulator.checks.complements` (34-35,
S5 for complex value spectra and the LFC block of a multi-head layer); the machinery is in
:mod:`~oversmooth.simulator.checks.core` and the helpers they share in :mod:`~oversmooth.simulator.checks.shared`.
:data:`CHECKS` is their registries in claim order; the margin units and :data:`SEED` are
re-exported here. Tolerances live in :mod:`oversmooth.simulator.tolerances`, the one table the
checks and the tests share.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from oversmooth.simulator.checks import (
    complements,
    layer_dynamics,
    linear_algebra,
    related,
    reparameterization,
)
from oversmooth.simulator.checks.core import (
    DECADES as DECADES,
)
from oversmooth.simulator.checks.core import (
    DEFAULT_EXAMPLES,
    Check,
    CheckResult,
    Choice,
    FloatRange,
    IntRange,
    case_seeds,
    run_case,
    run_checks,
)
from oversmooth.simulator.checks.core import (
    GAP as GAP,
)
from oversmooth.simulator.checks.core import (
    MAX_LAYERS as MAX_LAYERS,
)
from oversmooth.simulator.checks.core import (
    SCAN_TRIES as SCAN_TRIES,
)
from oversmooth.simulator.checks.core import (
    SEED as SEED,
)
from oversmooth.simulator.checks.core import (
    TOLERANCE as TOLERANCE,
)
from oversmooth.simulator.checks.core import (
    ParamSpec as ParamSpec,
)
from oversmooth.simulator.checks.layer_dynamics import (
    ALTERNATION_LAYERS as ALTERNATION_LAYERS,
)
from oversmooth.simulator.checks.layer_dynamics import (
    BOUND_SLACK as BOUND_SLACK,
)
from oversmooth.simulator.checks.layer_dynamics import (
    DIVERGENCE_TARGET as DIVERGENCE_TARGET,
)
from oversmooth.simulator.checks.reparameterization import (
    PRE_LN_BATCH as PRE_LN_BATCH,
)
from oversmooth.simulator.checks.reparameterization import (
    PRE_LN_LAYERS as PRE_LN_LAYERS,
)
from oversmooth.simulator.checks.reparameterization import (
    TABLE1_BATCH as TABLE1_BATCH,
)

__all__ = [
    "CHECKS",
    "DEFAULT_EXAMPLES",
    "Check",
    "CheckResult",
    "Choice",
    "FloatRange",
    "IntRange",
    "case_seeds",
    "check_names",
    "run_case",
    "verify",
]

CHECKS: tuple[Check, ...] = (
    *linear_algebra.CHECKS,
    *layer_dynamics.CHECKS,
    *reparameterization.CHECKS,
    *related.CHECKS,
    *complements.CHECKS,
)


def check_names() -> tuple[str, ...]:
    """Names of every registered check, in registry order."""
    return tuple(check.name for check in CHECKS)


def verify(
    *,
    examples: int = DEFAULT_EXAMPLES,
    seed: int = 0,
    names: Iterable[str] | None = None,
    checks: Sequence[Check] | None = None,
) -> list[CheckResult]:
    """Run checks on ``examples`` drawn instances each and return one result per check.

    Parameters
    ----------
    examples : int
        Instances per check (positive).
    seed : int
        Seed of the whole run; each check draws its instances from ``case_seeds(name, seed, n)``.
    names : iterable of str, optional
        Run only these checks (default all); an unknown name is an InputError with a suggestion.
    checks : sequence of Check, optional
        The pool to choose from; default :data:`CHECKS`.

    Returns
    -------
    list of CheckResult
        In the order of ``names`` (or of the pool). A failed claim, or an instance that raised, is a
        result with ``passed=False``; it never raises.
    """
    pool = CHECKS if checks is None else checks
    return run_checks(pool, examples=examples, seed=seed, names=names)
