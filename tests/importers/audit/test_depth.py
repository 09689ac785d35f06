"""The audit's depth step (oversmooth.importers.audit.depth, docs/theory.md §6.11) on builder models.

The builders' float64 forward pass (``tests/importers/reference.py``) gives the hidden states and
attention matrices, so the stream terms (‖x̄‖, the pre-norm's mean 1/σ or 1/rms) and |λ₂(A_h)| are
recomputed in NumPy; the bias row c is recomputed head by head; the per-block rows must follow
their definitions (product over depth, measured growth, agreement); the report and the files
show them.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.importers.audit.depth import bias_rows
from oversmooth.importers.audit.records import DEPTH_COLUMNS, HEAD_COLUMNS, Agreement, BlockVerdict
from oversmooth.report import render_report, write_audit_files
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.depth import geometric_mean
from tests.importers.audited import assembly_of, audited, real_tokens
from tests.importers.builders import VARIANTS
from tests.importers.reference import forward_trace

#: float32 onnxruntime against the float64 reference: a mean of 1/σ over tokens, an attention
#: eigenvalue modulus (eigenvalues of a float32-rounded stochastic matrix move by about its error).
STREAM_RTOL = 1e-4
LAMBDA2_ATOL = 1e-4

PRE_NORM = ("vit_prenorm_layerscale", "llama_rmsnorm_rope_gqa")


@pytest.mark.parametrize("name", PRE_NORM)
def test_stream_terms_equal_numpy_on_the_forward_pass(model_dir: Path, name: str) -> None:
    assembly = assembly_of(name)
    result = audited(model_dir, name)
    trace = forward_trace(assembly)
    keep = real_tokens(assembly)
    recipe = assembly.reference.recipe
    for layer, block in enumerate(result.blocks):
        hidden = trace.hidden[layer]
        for item in range(hidden.shape[0]):
            x = hidden[item][keep[item]]
            if recipe.norm_kind == "layernorm":
                scale = np.sqrt(x.var(axis=1) + recipe.eps)
            else:
                scale = np.sqrt(np.mean(x**2, axis=1) + recipe.eps)
            assert result.stream["inverse_scale"][item, layer] == pytest.approx(
                np.mean(1 / scale), rel=STREAM_RTOL
            ), (block.index, item)
            assert result.stream["mean_norm"][item, layer] == pytest.approx(
                np.linalg.norm(x.mean(axis=0)), rel=STREAM_RTOL
            )
    assert result.depth is not None
    expected = "1/sigma (LayerNorm)" if recipe.norm_kind == "layernorm" else "1/rms (RMSNorm)"
    assert {row.norm_scale for row in result.depth.per_block} == {expected}


def test_a_post_norm_block_has_no_per_token_scale(model_dir: Path) -> None:
    result = audited(model_dir, "bert_legacy")
    assert result.depth is not None
    assert np.isnan(result.stream["inverse_scale"]).all()
    for row in result.depth.per_block:
        assert row.norm_scale.startswith("not applicable")
        assert np.isnan(row.inverse_scale_mean)


@pytest.mark.parametrize("name", ["bert_legacy", "vit_prenorm_layerscale"])
def test_second_eigenvalue_of_every_head_equals_numpy(model_dir: Path, name: str) -> None:
    assembly = assembly_of(name)
    result = audited(model_dir, name, depth_inputs=2)
    trace = forward_trace(assembly)
    keep = real_tokens(assembly)
    assert {case.input for case in result.heads} == {0, 1}
    for case in result.heads:
        A = trace.attention[case.block][case.input, case.head][
            np.ix_(keep[case.input], keep[case.input])
        ]
        A = A / A.sum(axis=1, keepdims=True)
        moduli = np.sort(np.abs(np.linalg.eigvals(A)))
        assert case.n_tokens == A.shape[0]
        assert case.lambda2 == pytest.approx(moduli[-2], abs=LAMBDA2_ATOL)


def test_depth_inputs_bounds_the_head_cases(model_dir: Path) -> None:
    result = audited(model_dir, "vit_prenorm_layerscale")  # the default: 1 input
    assert {case.input for case in result.heads} == {0}
    assert result.depth is not None
    assert result.depth.inputs == 1
    assert result.config.depth_inputs == 1


@pytest.mark.parametrize(
    "name", ["vit_prenorm_layerscale", "llama_rmsnorm_rope_gqa", "bert_legacy"]
)
def test_the_bias_row_is_the_heads_constant_terms(model_dir: Path, name: str) -> None:
    # c = Σ_h (β W_V^h + b_V^h) W_O^h + b_O, times s: head by head, GQA through value_head
    result = audited(model_dir, name)
    for block, row in zip(result.blocks, bias_rows(result.blocks), strict=True):
        zeros = np.zeros(block.d_model)
        beta = block.beta if block.norm == "pre" and block.beta is not None else zeros
        c = zeros if block.b_O is None else block.b_O.copy()
        for head in range(block.n_heads):
            W_V, W_O = block.value_head(head)
            kv = head // block.kv_group
            d = block.d_head
            b_V = np.zeros(d) if block.b_V is None else block.b_V[kv * d : (kv + 1) * d]
            c = c + (beta @ W_V + b_V) @ W_O
        scale = block.layer_scale if block.layer_scale is not None else 1.0
        assert_allclose(row, c * scale, rtol=tol.STEP_RTOL, atol=tol.STEP_ATOL)


@pytest.mark.parametrize("name", ["vit_prenorm_layerscale", "bert_legacy"])
def test_per_block_rows_follow_their_definitions(model_dir: Path, name: str) -> None:
    result = audited(model_dir, name, depth_inputs=2)
    depth = result.depth
    assert depth is not None
    means = {r["layer"]: r["mean"] for r in result.layer_rows() if r["metric"] == "hfc_lfc"}
    assert depth.start == means[0]
    product = depth.start
    for row in depth.per_block:
        cases = [case for case in result.heads if case.block == row.block]
        assert row.predicted_growth == pytest.approx(
            geometric_mean([case.rho_quotient / case.rho_lfc for case in cases]), rel=1e-12
        )
        product *= row.predicted_growth
        assert row.predicted_hfc_lfc == pytest.approx(product, rel=1e-12)
        assert row.measured_hfc_lfc == means[row.block + 1]
        assert row.measured_growth == pytest.approx(means[row.block + 1] / means[row.block])
        assert np.isnan(row.operator_growth)  # no --dominance operator
    pairs = [
        (row.predicted_growth > 1, row.measured_growth > 1)
        for row in depth.per_block
        if row.predicted_growth != 1 and row.measured_growth != 1
    ]
    assert depth.agreement == Agreement.of_pairs(pairs)
    assert depth.operator_agreement is None
    n_heads = sum(block.n_heads for block in result.blocks)
    assert len(depth.heads) == n_heads
    assert all(head.sigma_max_over_rho >= 1 for head in depth.heads)


def test_agreement_of_pairs_is_the_verdicts_agreement() -> None:
    fields = dict.fromkeys(
        ("cases", "perron", "non_perron", "balanced", "contracting", "hfc_lfc_ratio"), 0
    )

    def verdict(predicted: str, observed: str) -> BlockVerdict:
        agree = None if "mixed" in (predicted, observed) else predicted == observed
        return BlockVerdict(
            block=0,
            part="attention",
            predicted=predicted,
            observed=observed,
            agree=agree,
            cosine_change=0.0,
            mlp_hfc_lfc_ratio=0.0,
            mlp_cosine_change=0.0,
            **fields,
        )

    names = ["smoothing", "no smoothing", "smoothing", "smoothing", "no smoothing", "smoothing"]
    seen = ["smoothing", "smoothing", "mixed", "smoothing", "no smoothing", "no smoothing"]
    verdicts = [verdict(p, o) for p, o in zip(names, seen, strict=True)]
    pairs = [
        (p == "smoothing", o == "smoothing")
        for p, o in zip(names, seen, strict=True)
        if o != "mixed"
    ]
    assert Agreement.of(verdicts) == Agreement.of_pairs(pairs)
    assert Agreement.of_pairs([]) is None


def test_the_report_and_the_files_show_the_depth_step(model_dir: Path, tmp_path: Path) -> None:
    result = audited(model_dir, "vit_prenorm_layerscale")
    text = render_report(result)
    assert "## Depth: predicted against measured HFC/LFC" in text
    section = text.split("## Depth")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(result.blocks)  # header + one row per block
    assert "Chance level" in section
    write_audit_files(result, tmp_path)
    with (tmp_path / "depth.csv").open() as handle:
        depth = list(csv.DictReader(handle))
    with (tmp_path / "heads.csv").open() as handle:
        heads = list(csv.DictReader(handle))
    assert tuple(depth[0]) == DEPTH_COLUMNS
    assert len(depth) == len(result.blocks)
    assert tuple(heads[0]) == HEAD_COLUMNS
    assert len(heads) == sum(block.n_heads for block in result.blocks)


def test_every_builder_variant_has_a_depth_summary(model_dir: Path) -> None:
    assert "vit_prenorm_layerscale" in VARIANTS
    result = audited(model_dir, "gpt2_fused_qkv")
    assert result.depth is not None
    assert len(result.depth.per_block) == len(result.blocks)
