"""How many inputs the dominance step uses: a fixed number, every one, or until its shares are
precise enough (``--dominance-inputs N|all|auto``).

The layer metrics cover every input; the dominance step — a spectrum per (input, block, head),
most of an audit's host work — need not: its result is a handful of shares (perron, non-perron,
balanced, contracting), whose precision stops improving in any way that matters long before a
large input set is exhausted. With ``"auto"`` (the default) the step uses the first inputs whose
shares all have a 95 % bootstrap interval over inputs narrower than :data:`AUTO_WIDTH`, looked at
after :data:`AUTO_FIRST` inputs and every :data:`AUTO_EVERY` after that
(:func:`oversmooth.simulator.sampling.inputs_needed`); fewer than :data:`AUTO_FIRST` inputs (the default six
photographs) all count.

The count depends on the inputs and their order only, never on the batch size or the shards:
:func:`dominance_stop` decides it from the cases of the first inputs when the result is assembled,
and the cases of later inputs are dropped. :class:`DominanceBudget` is the saving: while a local
audit runs, it makes the same decision as soon as the cases of enough inputs are in, and the
batches after that skip their spectra (onnxruntime still returns every batch's attention). A
batch's cases are cut at every look not yet decided that falls inside it
(:meth:`DominanceBudget.looks_inside`), and a part whose inputs lie at or past such a look is held
until that look is decided, so no spectrum is computed for inputs a look then drops, whatever the
batch size; a sharded audit computes every input's cases and drops the same ones at the merge.

Public API
----------
DominanceInputs
    The option's type: a positive int, ``"all"`` or ``"auto"``.
AUTO_WIDTH, AUTO_FIRST, AUTO_EVERY
    The rule's target width and its grid of looks.
dominance_stop
    The inputs the dominance step uses, and the widest interval there.
DominanceBudget
    The same decision made while the audit runs.
HeldCases
    A batch's dominance cases, in parts cut at the undecided looks; each part started at once or
    when the budget releases it, and taken in, in order, as it finishes or when waited for.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from oversmooth.importers.audit.cases import DominanceCase
from oversmooth.importers.audit.dominance import DominanceProblem, PendingCases
from oversmooth.importers.defaults import AUTO_EVERY, AUTO_FIRST, AUTO_WIDTH
from oversmooth.importers.errors import ImporterInputError
from oversmooth.simulator.sampling import Stop, inputs_needed, widest_interval

__all__ = [
    "AUTO_EVERY",
    "AUTO_FIRST",
    "AUTO_WIDTH",
    "DominanceBudget",
    "DominanceInputs",
    "HeldCases",
    "check_dominance_inputs",
    "dominance_stop",
]

#: ``--dominance-inputs``: a positive number of inputs, every input, or the stopping rule.
DominanceInputs = int | Literal["all", "auto"]
#: The classes whose shares the report gives (balanced also counts as non-perron there).
KINDS = ("perron", "non-perron", "balanced", "contracting")


def check_dominance_inputs(value: object) -> DominanceInputs:
    """``value`` as a :data:`DominanceInputs`, else :class:`ImporterInputError` (one line)."""
    if value in ("all", "auto"):
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ImporterInputError(
            f"`dominance_inputs` must be a positive integer, 'all' or 'auto'; got {value!r}"
        )
    return int(value)


def _kind_counts(cases: Sequence[DominanceCase], n_inputs: int) -> np.ndarray:
    """(n_inputs, 4) cases per input and :data:`KINDS` class (balanced apart from non-perron);
    cases of later inputs are left out."""
    column = {kind: k for k, kind in enumerate(KINDS)}
    items = np.fromiter((case.input for case in cases), dtype=np.int64, count=len(cases))
    kinds = np.fromiter((column[case.kind] for case in cases), dtype=np.int64, count=len(cases))
    kept = items < n_inputs
    flat = np.bincount(items[kept] * len(KINDS) + kinds[kept], minlength=n_inputs * len(KINDS))
    return flat.reshape(n_inputs, len(KINDS)).astype(np.float64)


def dominance_stop(cases: Sequence[DominanceCase], mode: DominanceInputs, n_inputs: int) -> Stop:
    """The inputs the dominance step uses (the first ``inputs`` of the audit) and the widest
    class-share interval over them.

    Parameters
    ----------
    cases : sequence of DominanceCase
        Every case computed (cases of inputs past a decision already made may be missing).
    mode : DominanceInputs
    n_inputs : int
        The audit's inputs.

    Returns
    -------
    Stop
        ``inputs``; ``width`` the widest 95 % interval of the four shares over them (NaN without
        cases); ``met`` whether it is within :data:`AUTO_WIDTH`.
    """
    if mode == "auto":
        stop = inputs_needed(
            _kind_counts(cases, n_inputs), AUTO_WIDTH, first=AUTO_FIRST, every=AUTO_EVERY
        )
        if not np.isnan(stop.width):
            return stop
        used = n_inputs  # fewer than the first look: every input, its width said all the same
    else:
        used = n_inputs if mode == "all" else min(int(mode), n_inputs)
    counts = _kind_counts(cases, used)
    if counts.sum() == 0:
        return Stop(used, float("nan"), False)
    width = widest_interval(counts)
    return Stop(used, width, bool(width <= AUTO_WIDTH))


class DominanceBudget:
    """Which inputs still need their dominance cases while a local audit runs.

    Parameters
    ----------
    mode : DominanceInputs
    first_input : int
        The number of the first input this run measures among the audit's (a shard's start).
    stop_early : bool
        Decide ``"auto"`` while running (a local audit); False computes every input's cases (a
        shard, which sees only its own inputs).
    """

    def __init__(self, mode: DominanceInputs, first_input: int = 0, stop_early: bool = True):
        self.first_input = first_input
        self.limit: int | None = mode if isinstance(mode, int) else None
        self.auto = mode == "auto" and stop_early
        self._looked = AUTO_FIRST - AUTO_EVERY  # the last grid count looked at
        self._counts = np.zeros((0, len(KINDS)))  # cases per input and class so far
        self._held: list[tuple[int, Callable[[], object]]] = []  # (first item, release)

    def wants(self, item: int) -> bool:
        """Whether input ``item`` (counted from this run's first) needs its dominance cases."""
        return self.limit is None or self.first_input + item < self.limit

    def _undecided(self) -> int | None:
        """The next grid count not yet looked at while the rule may still stop; else None."""
        return self._looked + AUTO_EVERY if self.auto and self.limit is None else None

    def looks_inside(self, first_item: int, end_item: int) -> list[int]:
        """The looks not yet decided strictly inside the items ``[first_item, end_item)`` (counted
        from this run's first), in order: where a batch's cases are cut, so that each part waits
        only for the looks before it (empty once the rule has stopped, or without it)."""
        look = self._undecided()
        if look is None:
            return []
        start, end = self.first_input + first_item, self.first_input + end_item
        return [g - self.first_input for g in range(look, end, AUTO_EVERY) if g > start]

    def holds(self, first_item: int) -> bool:
        """Whether a batch's part whose first input is ``first_item`` (counted from this run's
        first) waits: every input of it lies at or past a look not yet decided, which may drop
        them."""
        look = self._undecided()
        return look is not None and self.first_input + first_item >= look

    def hold(self, first_item: int, release: Callable[[], object]) -> None:
        """Keep a held part's ``release`` (it starts the part's wanted cases) until the looks
        before ``first_item`` are decided (:meth:`observe` calls it then)."""
        self._held.append((first_item, release))

    def observe(self, cases: Sequence[DominanceCase], complete: int) -> None:
        """Add a part's ``cases`` to the counts and look at every new grid count up to
        ``complete`` inputs whose cases are all in; the first count whose intervals are narrow
        enough becomes the limit. Held parts that no undecided look stands before are then
        released, whether or not they are still wanted (:meth:`wants` filters their inputs)."""
        if self._undecided() is not None:
            self._look(cases, complete)
        held, self._held = self._held, []
        for first, release in held:
            if self.holds(first):
                self._held.append((first, release))
            else:
                release()

    def _look(self, cases: Sequence[DominanceCase], complete: int) -> None:
        last = max((case.input + 1 for case in cases), default=0)
        grown = max(last, complete, len(self._counts))  # inputs without cases count as such
        counts = np.zeros((grown, len(KINDS)))
        counts[: len(self._counts)] = self._counts
        self._counts = counts + _kind_counts(cases, grown)
        while self._looked + AUTO_EVERY <= complete:
            self._looked += AUTO_EVERY
            if widest_interval(self._counts[: self._looked]) <= AUTO_WIDTH:
                self.limit = self._looked
                return


class _Part:
    """The problems of one part of a batch (their indices in the batch's problems), the items it
    covers, and its cases once started (the indices of the problems it was given)."""

    def __init__(self, first: int, end: int, indices: list[int]) -> None:
        self.first, self.end, self.indices = first, end, indices
        self.started: list[int] = []
        self.pending: PendingCases | None = None


class HeldCases:
    """A batch's dominance cases, cut at the looks the budget has not decided that fall inside
    the batch (:meth:`DominanceBudget.looks_inside`): the part before the first such look starts
    at once, each later part when the budget has decided the looks before it
    (:meth:`DominanceBudget.hold`); a part of a batch lying wholly past an undecided look waits too.

    Parameters
    ----------
    problems : sequence of DominanceProblem
        The batch's problems, in the order its cases are returned in.
    start : callable
        Starts the cases of the problems it is given (a :class:`PendingCases`); only the problems
        of inputs ``budget`` still wants when a part is released are given.
    budget : DominanceBudget, optional
        Told each part's cases as :meth:`advance` takes them in, in order.
    first_item, end_item : int
        The batch's items ``[first_item, end_item)``, counted from this run's first.
    """

    def __init__(
        self,
        problems: Sequence[DominanceProblem],
        start: Callable[[Sequence[DominanceProblem]], PendingCases],
        budget: DominanceBudget | None,
        first_item: int,
        end_item: int,
    ) -> None:
        self._problems = problems
        self._start = start
        self._budget = budget
        self._per_problem: list[list[DominanceCase]] = [[] for _ in problems]
        self._taken = 0  # the parts taken in (:meth:`advance`)
        cuts = budget.looks_inside(first_item, end_item) if budget is not None else []
        self._parts = [
            _Part(first, end, [i for i, p in enumerate(problems) if first <= p.item < end])
            for first, end in itertools.pairwise([first_item, *cuts, end_item])
        ]
        for part in self._parts:
            if budget is not None and budget.holds(part.first):
                budget.hold(part.first, functools.partial(self._release, part))
            else:
                self._release(part)

    def _release(self, part: _Part) -> PendingCases:
        """Start a part's cases of the wanted inputs (once); the started cases."""
        if part.pending is None:
            budget = self._budget
            part.started = [
                i for i in part.indices if budget is None or budget.wants(self._problems[i].item)
            ]
            part.pending = self._start([self._problems[i] for i in part.started])
        return part.pending

    def advance(self, wait: bool = False) -> bool:
        """Take in the parts in turn: each part's cases are kept and told to the budget (which may
        release the next part, or drop its inputs). Without ``wait``, stop at the first part not
        finished (or still held); with it, wait for each. Whether every part is taken in.

        A part still held when its turn comes with ``wait`` is released then (the budget
        releases every part before its turn; this only keeps a wrong order from waiting forever,
        at the price of cases the result drops)."""
        while self._taken < len(self._parts):
            part = self._parts[self._taken]
            if not wait and (part.pending is None or not part.pending.done()):
                return False
            cases = self._release(part).per_problem()
            for index, found in zip(part.started, cases, strict=True):
                self._per_problem[index] = found
            self._taken += 1
            if self._budget is not None:
                self._budget.observe([case for found in cases for case in found], part.end)
        return True

    def result(self) -> list[DominanceCase]:
        """Wait for every part (:meth:`advance`); the batch's cases in problem order."""
        self.advance(wait=True)
        return [case for found in self._per_problem for case in found]

    def cancel(self) -> None:
        for part in self._parts:
            if part.pending is not None:
                part.pending.cancel()
