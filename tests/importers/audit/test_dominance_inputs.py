"""``--dominance-inputs N|all|auto``: how many inputs the dominance step uses.

Checked: the rule on case lists (a number, every input, the stopping rule); the budget a running
audit keeps makes the decision the assembled result makes, for any batch size; a batch's cases are
cut at the undecided looks inside it and every part past such a look is held until that look is
decided, so that no spectrum is computed for an input the rule then drops; and an audit of a
builder model with more inputs than the rule's first look gives, at batch sizes 3 and 8, exactly
the cases of ``all`` truncated to the inputs the rule chose (in the batches' order, as ever),
computes at batch 8, 12 and 64 the spectra of those inputs only, while its layer metrics still
cover every input.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.importers.audit.cases import DominanceCase
from oversmooth.importers.audit.dominance_inputs import (
    DominanceBudget,
    HeldCases,
    dominance_stop,
)
from oversmooth.importers.audit.host_work import pipelined
from oversmooth.importers.audit.pipeline import AuditOptions, audit
from oversmooth.importers.defaults import AUTO_EVERY, AUTO_FIRST, AUTO_WIDTH
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.report import render_report
from tests.importers.builders import assemble

KINDS = ("perron", "non-perron", "balanced", "contracting")


def _cases(n_inputs: int, seed: int, heads: int = 6) -> list[DominanceCase]:
    """Cases whose perron share varies between inputs (so the interval narrows with inputs)."""
    rng = np.random.default_rng(seed)
    cases = []
    for item in range(n_inputs):
        p = rng.beta(8, 4)
        for head in range(heads):
            for block in range(2):
                kind = "perron" if rng.random() < p else str(rng.choice(KINDS[1:]))
                cases.append(DominanceCase(item, block, head, kind, 1j, 1j, 1j, 5))
    return cases


@pytest.mark.parametrize(("mode", "inputs"), [(5, 5), (500, 40), ("all", 40)])
def test_a_number_or_all_uses_that_many_first_inputs(mode: int | str, inputs: int) -> None:
    stop = dominance_stop(_cases(40, seed=1), mode, 40)
    assert stop.inputs == inputs
    assert stop.width > 0


def test_auto_uses_every_input_below_the_first_look_and_states_the_width() -> None:
    stop = dominance_stop(_cases(AUTO_FIRST - 1, seed=2), "auto", AUTO_FIRST - 1)
    assert stop.inputs == AUTO_FIRST - 1
    assert stop.width > AUTO_WIDTH  # 31 inputs of 12 cases: not precise
    assert not stop.met


@pytest.mark.parametrize("batch", [1, 4, 7, 16])
def test_the_running_budget_decides_what_the_result_decides(batch: int) -> None:
    """Cases arrive batch by batch; once the budget sets a limit, later inputs get none, and the
    assembled result's rule — run on whatever was computed — stops at that same limit."""
    every = _cases(600, seed=3, heads=40)
    budget = DominanceBudget("auto")
    computed: list[DominanceCase] = []
    for start in range(0, 600, batch):
        batch_cases = [
            c for c in every if start <= c.input < start + batch and budget.wants(c.input)
        ]
        computed += batch_cases
        budget.observe(batch_cases, min(start + batch, 600))
    stop = dominance_stop(computed, "auto", 600)
    assert budget.limit is not None
    assert stop.inputs == budget.limit
    assert stop.met
    assert (stop.inputs - AUTO_FIRST) % AUTO_EVERY == 0
    assert stop == dominance_stop(every, "auto", 600)  # as if every case had been computed


class _Problem(NamedTuple):
    """A dominance problem as :class:`HeldCases` sees it: its input and layer."""

    item: int
    layer: int


class _Started:
    """A :class:`PendingCases` stand-in: the given problems' cases, looked up, finished after
    ``polls`` looks."""

    def __init__(self, cases: list[list[DominanceCase]], polls: int = 0) -> None:
        self._cases = cases
        self._polls = polls

    def done(self) -> bool:
        self._polls -= 1
        return self._polls < 0

    def per_problem(self) -> list[list[DominanceCase]]:
        return self._cases

    def cancel(self) -> None:
        return None


class _Batch(NamedTuple):
    batch_size: int


class _Work:
    """A batch's host work holding only its dominance cases; ``held``: the bytes they hold if
    they may outlive the batch (attention on a device), else None."""

    def __init__(self, cases: HeldCases, held: int | None) -> None:
        self._cases, self._held = cases, held

    def detach(self) -> tuple[HeldCases, int] | None:
        return None if self._held is None else (self._cases, self._held)

    def result(self):
        return (self._cases.result() if self._held is None else []), [], [], ([], [])

    def cancel(self) -> None:
        self._cases.cancel()


def _pipeline(
    every: list[DominanceCase],
    n_inputs: int,
    sizes: Sequence[int],
    held: tuple[int, int] | None = None,
    seed: int = 0,
) -> tuple[DominanceBudget, list[int], list[DominanceCase], list[DominanceCase]]:
    """The audit's pipeline (:func:`pipelined`) with the real :class:`HeldCases` over batches of
    ``sizes`` (cycled) and two layers: the budget, the inputs whose problems were started, the
    cases collected and every batch's cases in problem order. ``held``: (bytes a batch holds,
    the limit) for cases that may outlive their batch, each part finishing after 0 to 3 looks
    (drawn from ``seed``); None: host attention, collected with its batch."""
    by_problem: dict[tuple[int, int], list[DominanceCase]] = {}
    for case in every:
        by_problem.setdefault((case.input, case.block), []).append(case)
    budget = DominanceBudget("auto")
    started: list[int] = []
    rng = np.random.default_rng(seed)

    def start(problems: Sequence[_Problem]) -> _Started:
        started.extend(problem.item for problem in problems)
        polls = int(rng.integers(0, 4)) if held is not None else 0
        return _Started([by_problem.get(problem, []) for problem in problems], polls)

    expected: list[DominanceCase] = []

    def measure(pool, batch: _Batch, first: int, outputs) -> _Work:
        end = first + batch.batch_size
        problems = [_Problem(item, layer) for layer in range(2) for item in range(first, end)]
        expected.extend(case for problem in problems for case in by_problem.get(problem, []))
        return _Work(HeldCases(problems, start, budget, first, end), held and held[0])

    batches, first, k = [], 0, 0
    while first < n_inputs:
        size = min(sizes[k % len(sizes)], n_inputs - first)
        batches.append((_Batch(size), {}))
        first, k = first + size, k + 1
    collected, *_ = pipelined(iter(batches), measure, threads=1, held_limit=held[1] if held else 0)
    return budget, started, collected, expected


@pytest.mark.parametrize("batch", [1, 5, 8, 12, 16, 40, 64, 600])
def test_no_spectrum_is_computed_past_the_stopping_look_whatever_the_batch(batch: int) -> None:
    """A batch is cut at the looks not yet decided inside it, a part at or past one waits until
    that look is decided, so the inputs whose cases are started are exactly those below the limit
    the rule sets; each batch's cases come back in problem order (layer, then input) whatever
    the cuts."""
    n_inputs = 600
    every = _cases(n_inputs, seed=3, heads=40)
    budget, started, collected, expected = _pipeline(every, n_inputs, [batch])
    limit = budget.limit
    assert limit is not None
    assert dominance_stop(every, "auto", n_inputs).inputs == limit
    assert sorted(set(started)) == list(range(limit))
    assert len(started) == 2 * limit  # each (input, layer) once
    assert collected == [case for case in expected if case.input < limit]


@given(
    n_inputs=st.integers(min_value=1, max_value=300),
    sizes=st.lists(st.integers(min_value=1, max_value=70), min_size=1, max_size=6),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_uneven_batches_start_exactly_the_inputs_the_result_keeps(
    n_inputs: int, sizes: list[int], seed: int
) -> None:
    """Batches of any sizes (the last one short), a rule that may never stop: the inputs started
    are exactly those the assembled result keeps, and the cases collected are its cases."""
    every = _cases(n_inputs, seed=seed, heads=8)
    budget, started, collected, expected = _pipeline(every, n_inputs, sizes)
    kept = dominance_stop(every, "auto", n_inputs).inputs
    assert budget.limit in (None, kept)
    assert sorted(started) == sorted(2 * list(range(kept)))
    assert collected == [case for case in expected if case.input < kept]


@given(
    n_inputs=st.integers(min_value=1, max_value=300),
    sizes=st.lists(st.integers(min_value=1, max_value=70), min_size=1, max_size=6),
    limit=st.sampled_from([0, 1, 3, 10**9]),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_cases_that_outlive_their_batch_change_nothing(
    n_inputs: int, sizes: list[int], limit: int, seed: int
) -> None:
    """Dominance cases on device attention, taken in whenever they finish and the limit allows
    (later batches then built while looks are undecided): the same inputs started, the same
    cases in the same order, the same limit as cases collected with their batch."""
    every = _cases(n_inputs, seed=seed, heads=8)
    on_host = _pipeline(every, n_inputs, sizes)
    on_device = _pipeline(every, n_inputs, sizes, held=(1, limit), seed=seed)
    assert on_device[0].limit == on_host[0].limit
    assert sorted(on_device[1]) == sorted(on_host[1])
    assert on_device[2] == on_host[2]


def test_the_looks_inside_a_batch_are_the_undecided_ones_on_the_grid() -> None:
    budget = DominanceBudget("auto", first_input=10)  # a run whose first input is the 11th
    looks = [AUTO_FIRST - 10 + k * AUTO_EVERY for k in range(3)]  # 22, 38, 54: inputs 32, 48, 64
    assert budget.looks_inside(0, looks[-1] + 1) == looks
    assert budget.looks_inside(AUTO_FIRST - 10, AUTO_FIRST - 9) == []  # a look at its start
    assert DominanceBudget("all").looks_inside(0, 600) == []
    assert DominanceBudget("auto", stop_early=False).looks_inside(0, 600) == []


@pytest.mark.parametrize("value", [0, -2, "some", True, 2.5])
def test_a_bad_dominance_inputs_is_refused_by_name(value: object) -> None:
    with pytest.raises(ImporterInputError, match="`dominance_inputs` must be a positive integer"):
        AuditOptions(dominance_inputs=value)  # type: ignore[arg-type]


@functools.cache
def _model(tmp: Path) -> Path:
    path = tmp / "vit.onnx"
    onnx.save(assemble("vit_prenorm_layerscale", 3).built.model, path)
    return path


@pytest.fixture(scope="module")
def many_inputs(tmp_path_factory: pytest.TempPathFactory):
    path = _model(tmp_path_factory.mktemp("dominance_inputs"))
    inputs = random_inputs(load_model(path).inputs, seed=5, batch=AUTO_FIRST + 2 * AUTO_EVERY)
    every = audit(path, inputs, provider="cpu", cache=False, dominance_inputs="all")
    return path, inputs, every


@pytest.mark.parametrize("batch_size", [3, 8])
def test_an_audit_keeps_the_first_inputs_cases_whatever_the_batch(
    many_inputs, batch_size: int
) -> None:
    path, inputs, every = many_inputs
    n_inputs = inputs.batch_size
    for mode in ("auto", 20):
        result = audit(
            path,
            inputs,
            provider="cpu",
            cache=False,
            batch_size=batch_size,
            dominance_inputs=mode,
        )
        stop = dominance_stop(every.dominance, mode, n_inputs)
        kept = [c for c in every.dominance if c.input < stop.inputs]
        assert sorted(c.row() for c in result.dominance) == sorted(c.row() for c in kept)
        summary = result.dominance_summary()
        assert summary.inputs == stop.inputs
        assert summary.rule == str(mode)
        for name, values in every.metrics.items():  # the layers cover every input
            np.testing.assert_array_equal(result.metrics[name], values, err_msg=name)
    assert every.dominance_summary().inputs == n_inputs
    assert f"first {n_inputs} of the {n_inputs} inputs" in render_report(every)


@pytest.mark.parametrize("batch_size", [8, 12, 64])
def test_an_auto_audit_computes_no_spectrum_past_the_inputs_it_keeps(
    many_inputs, monkeypatch, batch_size: int
):
    """The dominance stacks see exactly the inputs the rule keeps, whether the looks fall on
    batch boundaries (8) or inside batches (12; 64, every input in one batch): what lies past
    the stopping look waits for it and is dropped, not computed and thrown away."""
    from oversmooth.importers.audit import dominance

    path, inputs, every = many_inputs
    stop = dominance_stop(every.dominance, "auto", inputs.batch_size)
    assert stop.inputs < inputs.batch_size  # else nothing would be saved
    seen: set[int] = set()
    original = dominance.stacked_cases

    def counting(problems, *args, **kwargs):
        seen.update(problem.item for problem in problems)
        return original(problems, *args, **kwargs)

    monkeypatch.setattr(dominance, "stacked_cases", counting)
    result = audit(
        path, inputs, provider="cpu", cache=False, batch_size=batch_size, dominance_inputs="auto"
    )
    assert seen == set(range(stop.inputs))
    assert result.dominance_summary().inputs == stop.inputs
