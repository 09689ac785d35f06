"""``--dominance-inputs N|all|auto``: how many inputs the dominance step uses.

Checked: the rule on case lists (a number, every input, the stopping rule); the budget a running
audit keeps makes the decision the assembled result makes, for any batch size, and holds back every
batch that lies wholly past an undecided look until that look is decided, so that no spectrum is
computed for a batch the rule then drops; and an audit of a builder model with more inputs than the
rule's first look gives, at batch sizes 3 and 8, exactly the cases of ``all`` truncated to the
inputs the rule chose (in the batches' order, as ever), computes at batch 8 the spectra of those
inputs only, while its layer metrics still cover every input.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

from oversmooth.importers.audit.cases import DominanceCase
from oversmooth.importers.audit.dominance_inputs import DominanceBudget, dominance_stop
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


@pytest.mark.parametrize("batch", [1, 5, 8, 16, 40])
def test_a_batch_past_an_undecided_look_waits_for_it(batch: int) -> None:
    """The pipeline's order (batch k submitted, then batch k - 1 collected): a batch whose first
    input lies at or past a look not yet decided is held, released once the look is decided, and
    then computes only the inputs still wanted; so only a batch that straddles the stopping look
    computes cases past it."""
    n_inputs = 600
    every = _cases(n_inputs, seed=3, heads=40)
    budget = DominanceBudget("auto")
    started: dict[int, list[DominanceCase]] = {}

    def start(first: int) -> None:
        started[first] = [
            c for c in every if first <= c.input < first + batch and budget.wants(c.input)
        ]

    submitted: list[int] = []
    for first in [*range(0, n_inputs, batch), None]:
        if first is not None:
            submitted.append(first)
            if budget.holds(first):
                budget.hold(first, functools.partial(start, first))
            else:
                start(first)
        if len(submitted) > (1 if first is not None else 0):  # collect the oldest
            oldest = submitted.pop(0)
            assert oldest in started, "a held batch reached its collection unreleased"
            budget.observe(started[oldest], min(oldest + batch, n_inputs))
    limit = budget.limit
    assert limit is not None
    assert dominance_stop(every, "auto", n_inputs).inputs == limit
    computed = {c.input for cases in started.values() for c in cases}
    straddling = {first for first in started if first < limit < first + batch}
    allowed = limit if not straddling else max(straddling) + batch
    assert computed == set(range(min(allowed, n_inputs)))


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


def test_an_auto_audit_computes_no_spectrum_past_the_inputs_it_keeps(many_inputs, monkeypatch):
    """At batch 8 (the looks fall on batch boundaries) the dominance stacks see exactly the
    inputs the rule keeps: the batch after the stopping look waits for the look and is dropped,
    not computed and thrown away."""
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
    result = audit(path, inputs, provider="cpu", cache=False, batch_size=8, dominance_inputs="auto")
    assert seen == set(range(stop.inputs))
    assert result.dominance_summary().inputs == stop.inputs
