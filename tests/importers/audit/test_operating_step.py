"""The audit's attribution and operating point (oversmooth.importers.audit.operating_step) on builder models.

Tests that can fail: the rebuilt attention sublayer (effective H, the norm's per-token scale,
the bias row; a post-LN norm) reproduces the graph's own attention-sublayer tensor; the host's
block change (output minus input, from the returned layers) equals the in-graph metrics'
(``result.metrics``, a separate computation); the operating point equals a recomputation from
the builders' float64 forward pass. That the parts sum to the block's change is by construction
(a plumbing check).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from oversmooth.executor import LocalExecutor
from oversmooth.importers.audit.pipeline import AuditOptions, run_audit
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.report import render_report, write_audit_files
from oversmooth.sharding import sharded_audit
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.attribution import PARTS
from oversmooth.simulator.operating import operating_dominance, token_inverse_scale
from tests.importers.audited import (
    assembly_of,
    audited,
    effective_factors,
    real_tokens,
    saved_model,
)
from tests.importers.reference import forward_trace

#: The rebuilt float64 sublayer against onnxruntime's float32 tensor (relative Frobenius).
RECONSTRUCTION_RTOL = 1e-5
NAMES = ("vit_prenorm_layerscale", "llama_rmsnorm_rope_gqa", "bert_legacy")


@pytest.mark.parametrize("name", NAMES)
def test_the_rebuilt_sublayer_reproduces_the_graph(model_dir: Path, name: str) -> None:
    result = audited(model_dir, name, operator_inputs=2)
    assert result.attribution
    n_blocks = len(result.blocks)
    assert {(c.block, c.input) for c in result.attribution} == {
        (b, i) for b in range(n_blocks) for i in range(2)
    }
    for case in result.attribution:
        assert case.reconstruction_residual < RECONSTRUCTION_RTOL, case


@pytest.mark.parametrize("name", NAMES)
def test_the_parts_sum_to_the_in_graph_block_change(model_dir: Path, name: str) -> None:
    """Σ parts = f(output) − f(input) on the host (plumbing), which must equal the in-graph
    metrics' change of the same input and block (not plumbing: another computation)."""
    result = audited(model_dir, name, operator_inputs=2)
    for (block, item), found in _by_case(result.attribution).items():
        for metric, column in (("hfc_lfc", "delta_hfc_lfc"), ("cosine", "delta_cosine")):
            measured = result.metrics[metric][item, block + 1] - result.metrics[metric][item, block]
            total = sum(getattr(case, column) for case in found)
            sequential = sum(getattr(case, column.replace("delta", "sequential")) for case in found)
            assert total == pytest.approx(measured, rel=1e-5, abs=1e-6), (block, item, metric)
            assert sequential == pytest.approx(total, rel=1e-12, abs=1e-12)


def test_a_post_norm_block_has_no_scale_part(model_dir: Path) -> None:
    result = audited(model_dir, "bert_legacy", operator_inputs=2)
    scale = [case for case in result.attribution if case.part == "scale"]
    assert all(case.delta_hfc_lfc == 0.0 for case in scale)
    assert any(case.delta_hfc_lfc != 0.0 for case in result.attribution if case.part == "norm")


def test_operating_cases_equal_a_recomputation(model_dir: Path) -> None:
    name = "vit_prenorm_layerscale"
    assembly = assembly_of(name)
    result = audited(model_dir, name, operator_inputs=1, dominance="operating")
    trace, keep, eps = forward_trace(assembly), real_tokens(assembly), assembly.reference.recipe.eps
    assert {case.input for case in result.operating} == {0}
    for case in result.operating:
        block = assembly.built.blocks[case.block]
        real = np.flatnonzero(keep[case.input])
        A = trace.attention[case.block][case.input][:, real][:, :, real]
        A = A / A.sum(axis=-1, keepdims=True)
        X = trace.hidden[case.block][case.input][real]
        want = operating_dominance(
            A, effective_factors(block), token_inverse_scale(X, "layernorm", eps)
        )
        assert case.kind == want.kind
        assert case.rho == pytest.approx(want.rho, rel=tol.ORT_RTOL)
        assert case.limit_low == pytest.approx(want.limit_low, rel=1e-3, abs=1e-6)
        assert case.scale == "1/sigma"


def test_files_and_report(model_dir: Path, tmp_path: Path) -> None:
    result = audited(model_dir, "vit_prenorm_layerscale", operator_inputs=1, dominance="operating")
    names = {path.name for path in write_audit_files(result, tmp_path)}
    assert {"attribution.csv", "operating.csv"} <= names
    with (tmp_path / "attribution.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {row["part"] for row in rows} == set(PARTS)
    text = render_report(result)
    assert "What moved HFC/LFC" in text
    assert "The operating point" in text
    lines = [line for line in text.splitlines() if line.startswith("- block ")]
    assert lines
    for line in lines:
        reasons = ("mostly because of the", "mostly through the effective-H", "every part's sign")
        assert sum(reason in line for reason in reasons) == 1, line


def test_attribution_runs_on_the_audits_first_inputs_wherever_the_shards_start(
    model_dir: Path,
) -> None:
    graph = load_model(saved_model(model_dir, "vit_prenorm_layerscale"))
    inputs = random_inputs(graph.inputs, seed=2, batch=5, seq=6, vocab_size=50)
    options = AuditOptions(provider="cpu", batch_size=2, operator_inputs=3)
    one = run_audit(graph, inputs, options)
    merged = sharded_audit(graph, inputs, options, executor=LocalExecutor(), shards=5)
    assert {case.input for case in one.attribution} == {0, 1, 2}
    assert [c.row() for c in merged.attribution] == [c.row() for c in one.attribution]


def _by_case(cases: list) -> dict[tuple[int, int], list]:
    found: dict[tuple[int, int], list] = {}
    for case in cases:
        found.setdefault((case.block, case.input), []).append(case)
    return found
