"""The audit's exact layer dominance (``dominance="operator"``) against an independent recomputation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from oversmooth.executor import LocalExecutor
from oversmooth.importers.audit.pipeline import AuditOptions, audit, run_audit
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.sharding import sharded_audit
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.operator import operator_dominance
from tests.importers.audited import builder_inputs, effective_factors, real_tokens
from tests.importers.builders import assemble
from tests.importers.reference import forward_trace

SEED = 5
NAME = "vit_prenorm_layerscale"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("operator") / f"{NAME}.onnx"
    onnx.save(assemble(NAME, SEED).built.model, path)
    return path


def test_operator_cases_equal_a_recomputation_from_numpy_attention(model: Path) -> None:
    assembly = assemble(NAME, SEED)
    inputs = builder_inputs(assembly)
    result = audit(model, inputs, provider="cpu", dominance="operator", operator_inputs=1)
    trace = forward_trace(assembly)
    keep = real_tokens(assembly)
    assert {case.input for case in result.operator} == {0}
    assert len(result.operator) == len(assembly.built.blocks)
    for case in result.operator:
        block = assembly.built.blocks[case.block]
        real = np.flatnonzero(keep[case.input])
        A = trace.attention[case.block][case.input][:, real][:, :, real]
        A = A / A.sum(axis=-1, keepdims=True)
        want = operator_dominance(A, effective_factors(block))
        assert case.kind == want.kind
        assert case.rho_lfc == pytest.approx(want.rho_lfc, rel=tol.ORT_RTOL)
        assert case.rho_quotient == pytest.approx(want.rho_quotient, rel=tol.ORT_RTOL)
    summary = result.dominance_summary().operator
    assert summary is not None
    assert summary.cases == len(result.operator)
    assert 0.0 <= summary.agreement <= 1.0


def test_the_operator_runs_on_the_audits_first_inputs_wherever_the_shards_start(
    model: Path,
) -> None:
    graph = load_model(model)
    inputs = random_inputs(graph.inputs, seed=2, batch=5, seq=6, vocab_size=50)
    options = AuditOptions(provider="cpu", batch_size=1, dominance="operator", operator_inputs=3)
    one = run_audit(graph, inputs, options)
    merged = sharded_audit(graph, inputs, options, executor=LocalExecutor(), shards=5)
    assert {case.input for case in one.operator} == {0, 1, 2}
    assert [(c.input, c.block, c.kind) for c in merged.operator] == [
        (c.input, c.block, c.kind) for c in one.operator
    ]


def test_operator_mode_writes_operator_csv_and_reports_the_agreement(
    model: Path, tmp_path: Path
) -> None:
    from oversmooth.report import save_audit

    result = audit(
        model,
        builder_inputs(assemble(NAME, SEED)),
        provider="cpu",
        dominance="operator",
        operator_inputs=1,
    )
    folder = save_audit(result, tmp_path / "audit")
    header = (folder / "operator.csv").read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith("input,block,kind,rho_lfc,rho_quotient")
    report = (folder / "report.md").read_text(encoding="utf-8")
    assert "The whole operator of each block" in report
    assert "per-head rule" in report
    test = result.dominance_summary().operator.agreement_test
    assert test is not None  # the agreement comes with its chance level, in the report too
    assert f"gives {test.expected:.2f} agreements on average" in report
    assert '"agreement_test"' in (folder / "audit.json").read_text(encoding="utf-8")
