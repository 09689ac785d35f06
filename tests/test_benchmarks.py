"""The benchmarks still run: each one's measuring function on a small real model, once.

Speed is never asserted here (targets live in ``benchmarks/``, ratios measured in one run); these
tests only catch a benchmark broken by a refactor (a renamed function it patches, an argument it
no longer passes), which nothing else runs.
"""

from __future__ import annotations

import pytest

from tests.realmodels import require_real_model


@pytest.mark.realmodel
def test_the_device_benchmark_measures_a_text_model() -> None:
    from benchmarks.bench_device import rates
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs.sources import default_inputs
    from oversmooth.importers.zoo import get_model

    graph = load_model(require_real_model("minilm-l3"))
    inputs = default_inputs(graph.inputs, get_model("minilm-l3"))
    result = rates(graph, "minilm-l3", inputs, "cpu", 2, min_seconds=0.0, batches_per_audit=1)
    assert min(result.plain, result.session, result.audit) > 0
    assert result.device_bytes_per_input == 0
    assert "CPU" in result.line()


@pytest.mark.realmodel
def test_the_audit_benchmark_times_the_audit_against_inference() -> None:
    from benchmarks.bench_audit import audit_against_inference

    require_real_model("minilm-l3")
    timing = audit_against_inference("minilm-l3", 4, 2)
    assert timing.n_inputs == 4


def test_the_train_benchmark_times_one_epoch_of_each_variant() -> None:
    pytest.importorskip("torch", reason="needs the train extra: pip install 'oversmooth[train]'")
    from benchmarks.bench_train import VARIANTS, time_runs

    timings = time_runs(1, variants=VARIANTS[:2])
    assert [t.variant for t in timings] == ["standard", "plus"]
    assert all(t.seconds > 0 and t.epochs == 1 and t.device == "cpu" for t in timings)
