"""The machinery of the checks: tolerances and margin units, parameter spaces, :class:`Check`,
:class:`CheckResult`, and running a pool of checks on drawn instances.
"""

from __future__ import annotations

import math
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from oversmooth.simulator.errors import InputError, NumericalFloorWarning
from oversmooth.simulator.validation import SeedLike, as_generator, check_positive_int

#: Seeds tried when a check keeps only instances passing a separation filter.
SCAN_TRIES = 256
#: Upper bound on the layers of any dynamic check.
MAX_LAYERS = 5000
#: Default number of drawn instances per check for ``oversmooth verify``.
DEFAULT_EXAMPLES = 50

TOLERANCE = "tolerance: 1 - violation/tolerance (0 at the tolerance, negative is a violation)"
DECADES = "decades: log10(threshold/value), worst over the listed quantities"
GAP = (
    "gap: (|mu| of the kind that must dominate - |mu| of the other kind) / max|mu|, + tie allowance"
)

# ----------------------------------------------------------------------------------------------
# parameter spaces
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntRange:
    """An integer parameter drawn uniformly from ``low .. high`` (inclusive)."""

    low: int
    high: int

    def sample(self, gen: np.random.Generator) -> int:
        """One value."""
        return int(gen.integers(self.low, self.high + 1))

    def contains(self, value: object) -> bool:
        """Whether ``value`` is an int in range."""
        return (
            isinstance(value, int | np.integer)
            and not isinstance(value, bool)
            and bool(self.low <= value <= self.high)
        )


@dataclass(frozen=True)
class FloatRange:
    """A float parameter drawn uniformly from ``[low, high]``."""

    low: float
    high: float

    def sample(self, gen: np.random.Generator) -> float:
        """One value."""
        return float(gen.uniform(self.low, self.high))

    def contains(self, value: object) -> bool:
        """Whether ``value`` is a real number in range."""
        return (
            isinstance(value, int | float | np.floating | np.integer)
            and not isinstance(value, bool)
            and self.low <= float(value) <= self.high
        )


@dataclass(frozen=True)
class Choice:
    """A parameter drawn uniformly from a few options."""

    options: tuple[Any, ...]

    def sample(self, gen: np.random.Generator) -> Any:
        """One value."""
        return self.options[int(gen.integers(len(self.options)))]

    def contains(self, value: object) -> bool:
        """Whether ``value`` is one of the options."""
        return value in self.options


ParamSpec = IntRange | FloatRange | Choice
#: Seeds of the random matrices of one instance.
SEED = IntRange(0, 2**32 - 1)


# ----------------------------------------------------------------------------------------------
# Check and CheckResult
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One checkable claim of docs/theory.md §8 as data.

    Attributes
    ----------
    name : str
        Short snake_case identifier (``oversmooth verify --only NAME``).
    claim : int
        The claim's number in docs/theory.md §8.
    statement : str
        One line: what holds on every instance.
    unit : str
        What the margin measures.
    space : mapping of str to IntRange, FloatRange or Choice
        The parameters one instance is drawn from.
    body : callable
        ``body(params) -> margin``.
    counterexample : bool
        True when the check asserts that an implication fails outside its hypothesis.
    """

    name: str
    claim: int
    statement: str
    unit: str
    space: Mapping[str, ParamSpec]
    body: Callable[[Mapping[str, Any]], float]
    counterexample: bool = False

    def draw(self, rng: SeedLike = None) -> dict[str, Any]:
        """Draw one instance's parameters (a small dict of ints, floats and strings)."""
        gen = as_generator(rng)
        return {key: spec.sample(gen) for key, spec in self.space.items()}

    def validate(self, params: Mapping[str, Any]) -> None:
        """Raise InputError unless ``params`` has exactly this check's keys, each in range."""
        if not isinstance(params, Mapping):
            raise InputError(f"`params` must be a mapping; got {type(params).__name__}")
        missing = sorted(set(self.space) - set(params))
        extra = sorted(set(params) - set(self.space))
        if missing or extra:
            raise InputError(
                f"`params` of check {self.name!r} must have keys {sorted(self.space)}; "
                f"got missing {missing} and unknown {extra}"
            )
        for key, spec in self.space.items():
            if not spec.contains(params[key]):
                raise InputError(f"`params[{key!r}]` must be in {spec}; got {params[key]!r}")

    def run(self, params: Mapping[str, Any]) -> float:
        """Run one instance and return its margin (``>= 0``: the claim held)."""
        self.validate(params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalFloorWarning)
            return float(self.body(params))


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check over many drawn instances.

    Attributes
    ----------
    name, claim, statement : as in :class:`Check`
    cases : int
        Instances run.
    passed : bool
        Every margin was ``>= 0`` and no instance raised.
    worst_margin : float
        The smallest margin (``-inf`` when an instance raised).
    failing_seed : int or None
        Seed of the worst failing instance; ``run_case(check, failing_seed)`` reproduces it.
    seconds : float
        Wall time of all the instances.
    error : str or None
        The exception of the first instance that raised, if any.
    """

    name: str
    claim: int
    statement: str
    cases: int
    passed: bool
    worst_margin: float
    failing_seed: int | None
    seconds: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (``worst_margin`` None when not finite) for JSON output."""
        out = asdict(self)
        out["worst_margin"] = self.worst_margin if math.isfinite(self.worst_margin) else None
        return out


# ----------------------------------------------------------------------------------------------
# running many instances
# ----------------------------------------------------------------------------------------------


def _select(names: Iterable[str] | None, checks: Sequence[Check]) -> list[Check]:
    pool = list(checks)
    if names is None:
        return pool
    if isinstance(names, str):
        names = (names,)
    by_name = {check.name: check for check in pool}
    selected = []
    for name in names:
        if name not in by_name:
            raise InputError(
                f"`names` must name registered checks; got {name!r}{_suggest(name, by_name)}"
            )
        selected.append(by_name[name])
    return selected


def _suggest(name: str, known: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def case_seeds(name: str, seed: int, examples: int) -> list[int]:
    """The per-instance seeds of check ``name`` for a run with ``seed`` (independent of the others).

    Parameters
    ----------
    name : str
    seed : int
        The run's seed (``oversmooth verify --seed``).
    examples : int

    Returns
    -------
    list of int
        ``run_case(check, s)`` reproduces the instance drawn from each.
    """
    sequence = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
    return [int(s) for s in sequence.generate_state(examples, dtype=np.uint32)]


def run_case(check: Check, seed: int) -> float:
    """Draw the instance of ``seed`` and return its margin (``>= 0``: the claim held)."""
    return check.run(check.draw(seed))


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InputError(f"`seed` must be a non-negative integer; got {seed!r}")
    return int(seed)


def _run_check(check: Check, seeds: list[int]) -> CheckResult:
    worst, failing, error = math.inf, None, None
    start = time.perf_counter()
    for case_seed in seeds:
        try:
            margin = run_case(check, case_seed)
        except Exception as err:  # a crash inside a check is a failed case, reported as data
            margin = -math.inf
            if error is None:
                frame = traceback.extract_tb(err.__traceback__)[-1]
                error = f"{type(err).__name__}: {err} (at {frame.name}, line {frame.lineno})"
        if math.isnan(margin):
            margin = -math.inf
        if margin < worst:
            worst = margin
            failing = case_seed if margin < 0 else None
    seconds = time.perf_counter() - start
    passed = worst >= 0
    return CheckResult(
        check.name,
        check.claim,
        check.statement,
        len(seeds),
        passed,
        worst,
        None if passed else failing,
        seconds,
        error,
    )


def run_checks(
    pool: Sequence[Check],
    *,
    examples: int,
    seed: int,
    names: Iterable[str] | None,
) -> list[CheckResult]:
    """Run the checks of ``pool`` (or those of it named) on ``examples`` drawn instances each.

    Parameters
    ----------
    pool : sequence of Check
        The checks to choose from (:func:`oversmooth.simulator.checks.verify` passes the registry).
    examples : int
        Instances per check (positive).
    seed : int
        Seed of the whole run; each check draws its instances from ``case_seeds(name, seed, n)``.
    names : iterable of str or None
        Run only these checks (None: all of ``pool``); an unknown name is an InputError.

    Returns
    -------
    list of CheckResult
        In the order of ``names`` (or of the pool); a failed claim is a result, never an exception.
    """
    examples = check_positive_int(examples, "examples")
    seed = _check_seed(seed)
    selected = _select(names, pool)
    return [_run_check(check, case_seeds(check.name, seed, examples)) for check in selected]
