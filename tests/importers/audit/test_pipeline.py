"""The model audit against an independent recomputation.

The builder models (``tests/importers/builders.py``) have known weights, so every number the audit
reports can be recomputed in float64 NumPy (``tests/importers/reference.py``: the simulator's
LayerNorm and softmax, the builders' ground-truth weights, never the importer's): the per-layer
metrics of the hidden states and the kind of the dominating eigenvalue of ``I + H_h ⊗ A`` per
(input, block, head). (The folder ``save_audit`` writes: tests/oversmooth/test_report.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.errors import ProviderError
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import bundled_inputs, random_inputs
from oversmooth.report import render_report, save_audit
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import METRICS, all_metrics
from oversmooth.simulator.output import to_json
from oversmooth.simulator.theory import KINDS, contracting_heads, dominance_kinds, kron_eigenvalues
from tests.importers.audited import (
    assembly_of,
    audited,
    builder_inputs,
    real_tokens,
    saved_model,
)
from tests.importers.builders import VARIANTS, Assembly, ExpectedBlock
from tests.importers.reference import forward_trace
from tests.realmodels import require_real_model

#: Variants whose activations onnxruntime quantises at run time: no float recomputation applies.
RUNTIME_QUANTISED = {"dynamic_quant"}
FLOAT_VARIANTS = sorted(set(VARIANTS) - RUNTIME_QUANTISED)
#: Variants with a padding mask (the builders pad the second sequence's last two tokens).
PADDED = "bert_legacy"
_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"


def numpy_metrics(hidden: np.ndarray, keep: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric per item ``(B,)`` of the tokens ``keep`` (B, T) of ``hidden`` (B, T, d)."""
    per_item = [all_metrics(hidden[b][keep[b]]) for b in range(hidden.shape[0])]
    return {name: np.array([float(item[name]) for item in per_item]) for name in METRICS}


# -- hidden states: the audit's metrics against the NumPy forward pass ---------------------------


def _assert_metrics(
    got: dict[str, np.ndarray],
    where: tuple[int | slice, int],
    expected: dict[str, np.ndarray],
    label: str,
) -> None:
    """Every metric's ``got[metric][where]`` equals ``expected[metric]`` to onnxruntime's
    tolerance (``label`` says which layer or block)."""
    for metric in METRICS:
        assert_allclose(
            got[metric][where],
            expected[metric],
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL,
            err_msg=f"{metric} {label}",
        )


@pytest.mark.parametrize("name", FLOAT_VARIANTS)
def test_audit_metrics_equal_those_of_a_numpy_forward_pass(model_dir: Path, name: str) -> None:
    assembly = assembly_of(name)
    result = audited(model_dir, name)
    trace = forward_trace(assembly)
    assert result.n_layers == len(assembly.built.blocks) + 1
    keep = real_tokens(assembly)
    for layer, hidden in enumerate(trace.hidden):
        expected = numpy_metrics(hidden, keep)
        _assert_metrics(
            result.metrics, (slice(None), layer), expected, f"of {name} at layer {layer}"
        )


@pytest.mark.parametrize("name", FLOAT_VARIANTS)
def test_attention_part_equals_the_numpy_stream_after_attention(model_dir: Path, name: str) -> None:
    """The attention sublayer's residual sum (before a post-LN norm), reduced in the graph,
    against NumPy."""
    assembly = assembly_of(name)
    result = audited(model_dir, name)
    keep = real_tokens(assembly)
    for block, mid in enumerate(forward_trace(assembly).attention_sum):
        expected = numpy_metrics(mid, keep)
        _assert_metrics(
            result.attention_part,
            (slice(None), block),
            expected,
            f"of {name} after block {block}'s attention",
        )


def head_spectrum(block: ExpectedBlock, head: int) -> np.ndarray:
    """Eigenvalues of the d×d ``W_V^h W_O^h``: those of ``W_O^h W_V^h`` plus the exact zero."""
    d, kv = block.d_head, head // (block.n_heads // block.n_kv_heads)
    W_V = block.W_V[:, kv * d : (kv + 1) * d]
    W_O = block.W_O[head * d : (head + 1) * d, :]
    nonzero = np.linalg.eigvals(W_O @ W_V)
    return np.concatenate([nonzero, [0.0]]) if block.d_model > d else nonzero


def expected_dominance(
    assembly: Assembly, attention: list[np.ndarray], keep: np.ndarray
) -> dict[tuple[int, int, int], tuple[str, float]]:
    """(input, block, head) -> (kind, dominating μ) from NumPy attention and the true weights."""
    cases = {}
    for layer, (block, probs) in enumerate(zip(assembly.built.blocks, attention, strict=True)):
        for item in range(probs.shape[0]):
            real = np.flatnonzero(keep[item])
            A = probs[item][:, real][:, :, real]
            eig_A = np.linalg.eigvals(A / A.sum(axis=-1, keepdims=True))
            for head in range(block.n_heads):
                eig_H = head_spectrum(block, head)
                if contracting_heads(eig_H):  # decided from H, no mode (docs/theory.md §6.10)
                    cases[item, layer, head] = ("contracting", complex(np.nan, np.nan))
                    continue
                kind = KINDS[int(dominance_kinds(eig_A[head], eig_H))]
                mu = kron_eigenvalues(eig_A[head], eig_H).ravel()
                cases[item, layer, head] = (kind, complex(mu[np.argmax(np.abs(mu))]))
    return cases


@pytest.mark.parametrize("name", FLOAT_VARIANTS)
def test_audit_dominance_equals_a_recomputation_from_numpy_attention(
    model_dir: Path, name: str
) -> None:
    assembly = assembly_of(name)
    result = audited(model_dir, name, h="stored")  # the recomputation uses W_V^h W_O^h as stored
    keep = real_tokens(assembly)
    expected = expected_dominance(assembly, forward_trace(assembly).attention, keep)
    found = {(case.input, case.block, case.head): case for case in result.dominance}
    assert found.keys() == expected.keys(), name
    for key, (kind, mu) in expected.items():
        case = found[key]
        assert case.kind == kind, f"{name}: case {key}"
        # A complex-conjugate pair ties in modulus: compare real part and |imaginary part|.
        assert_allclose(
            [case.mu.real, abs(case.mu.imag)],
            [mu.real, abs(mu.imag)],
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL,
            err_msg=f"{name}: case {key}",
        )
        assert case.n_tokens == int(keep[key[0]].sum())
        block = assembly.built.blocks[key[1]]
        spectrum = head_spectrum(block, key[2])
        gap = np.min(np.abs(spectrum - case.lambda_h))
        assert gap <= tol.HEAD_SPECTRUM_RTOL * np.max(np.abs(spectrum)), f"{name}: case {key}"


def test_dominance_summary_fractions_count_the_cases(model_dir: Path) -> None:
    result = audited(model_dir, PADDED)
    summary = result.dominance_summary()
    kinds = [case.kind for case in result.dominance]
    assert summary.cases == len(kinds) == 2 * sum(b.n_heads for b in result.blocks)
    assert summary.perron == kinds.count("perron") / len(kinds)
    assert summary.contracting == kinds.count("contracting") / len(kinds)
    assert summary.perron + summary.non_perron + summary.contracting == pytest.approx(
        1.0, abs=tol.EPS
    )
    assert summary.balanced == kinds.count("balanced") / len(kinds)
    assert sum(row.cases for row in summary.per_block) == len(kinds)


def test_block_verdicts_compare_the_prediction_with_the_observed_change(model_dir: Path) -> None:
    """The attention part: the stream entering block b against the one after its attention."""
    result = audited(model_dir, PADDED)
    means = {(r["layer"], r["metric"]): r["mean"] for r in result.layer_rows()}
    mids = {(r["block"], r["metric"]): r["mean"] for r in result.attention_rows()}
    rows = result.dominance_summary().per_block
    assert [row.block for row in rows] == [w.index for w in result.blocks]
    for row in rows:
        b = row.block
        assert row.part == "attention"
        ratio = mids[b, "hfc_lfc"] / means[b, "hfc_lfc"]
        change = mids[b, "cosine"] - means[b, "cosine"]
        mlp_ratio = means[b + 1, "hfc_lfc"] / mids[b, "hfc_lfc"]
        assert row.mlp_hfc_lfc_ratio == pytest.approx(mlp_ratio, rel=tol.STEP_RTOL)
        assert row.hfc_lfc_ratio == pytest.approx(ratio, rel=tol.STEP_RTOL)
        assert row.cosine_change == pytest.approx(change, abs=tol.STEP_ATOL)
        expected = "smoothing" if row.perron > 0.5 else "no smoothing"
        assert row.predicted == ("tie" if row.perron == 0.5 else expected)
        smooths, sharpens = ratio < 1 and change > 0, ratio > 1 and change < 0
        assert row.observed == ("smoothing" if smooths else "no smoothing" if sharpens else "mixed")
        undecided = row.observed == "mixed" or row.predicted == "tie"
        assert row.agree == (None if undecided else row.predicted == row.observed)
    report = render_report(result)
    assert "Chance level" in report or "No block has both" in report


def test_layer_granularity_uses_the_whole_layer_spectrum(model_dir: Path) -> None:
    result = audited(model_dir, "bert_legacy", dominance="layer")
    for case in result.dominance:
        block = assembly_of("bert_legacy").built.blocks[case.block]
        spectrum = np.linalg.eigvals(block.W_V @ block.W_O)
        gap = np.min(np.abs(spectrum - case.lambda_h))
        assert gap <= tol.HEAD_SPECTRUM_RTOL * np.max(np.abs(spectrum))


def test_dominance_none_fetches_no_attention(model_dir: Path) -> None:
    result = audited(model_dir, "bert_legacy", dominance="none")
    assert result.dominance == []
    assert result.dominance_summary().perron is None
    exposed = result.provenance.runner["exposed"]
    assert not {w.attention_name for w in result.blocks} & set(exposed)
    with_attention = audited(model_dir, "bert_legacy")
    for metric in METRICS:
        assert_allclose(
            result.metrics[metric],
            with_attention.metrics[metric],
            rtol=tol.ORT_REPEAT_RTOL,
            atol=tol.ORT_REPEAT_ATOL,
        )


def _effective_head(block, head: int) -> tuple[np.ndarray, np.ndarray]:
    """``(C diag(γ) W_V^h, W_O^h diag(s))`` from the builder's own float64 parameters."""
    d = block.d_head
    W_V = block.gamma[:, None] * block.W_V[:, head * d : (head + 1) * d]
    W_V = W_V - W_V.mean(axis=0, keepdims=True)  # the LayerNorm's centring, x ↦ x (I − 𝟙𝟙ᵀ/d)
    return W_V, block.W_O[head * d : (head + 1) * d, :] * block.layer_scale[None, :]


@pytest.mark.parametrize("h", ["effective", "stored"])
def test_each_h_takes_its_own_head_spectrum(model_dir: Path, h: str) -> None:
    name = "vit_prenorm_layerscale"
    result = audited(model_dir, name, h=h)
    for case in result.dominance:
        block = assembly_of(name).built.blocks[case.block]
        d = block.d_head
        if h == "effective":
            W_V, W_O = _effective_head(block, case.head)
        else:
            W_V = block.W_V[:, case.head * d : (case.head + 1) * d]
            W_O = block.W_O[case.head * d : (case.head + 1) * d, :]
        spectrum = np.concatenate([np.linalg.eigvals(W_O @ W_V), [0.0]])
        gap = np.min(np.abs(spectrum - case.lambda_h))
        assert gap <= tol.HEAD_SPECTRUM_RTOL * np.max(np.abs(spectrum))


def test_the_effective_h_is_the_stored_one_where_nothing_is_folded(model_dir: Path) -> None:
    """Post-LN BERT has no pre-norm and no LayerScale: both H give the same cases."""
    effective = audited(model_dir, "bert_legacy")
    assert effective.dominance == audited(model_dir, "bert_legacy", h="stored").dominance
    assert all(block.folded() == () for block in effective.blocks)


def test_audit_json_names_the_h_and_its_factors_per_block(model_dir: Path) -> None:
    document = json.loads(to_json(audited(model_dir, "vit_prenorm_layerscale")))
    assert document["config"]["h"] == "effective"
    assert document["h"]["used"] == "effective"
    first = document["h"]["blocks"][0]
    assert first["folded"] == ["centring", "gamma", "layer_scale"]
    assert "beta" in first["omitted"]


def test_batch_size_does_not_change_the_numbers(model_dir: Path) -> None:
    one = audited(model_dir, PADDED, batch_size=1)
    two = audited(model_dir, PADDED, batch_size=2)
    for metric in METRICS:
        assert_allclose(
            one.metrics[metric],
            two.metrics[metric],
            rtol=tol.ORT_REPEAT_RTOL,
            atol=tol.ORT_REPEAT_ATOL,
        )
    assert [c.kind for c in one.dominance] == [c.kind for c in two.dominance]


# -- padding and prefix tokens --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert_legacy", "bert_dynamo", "where_mask", "scale_mul_scores"])
def test_padding_tokens_are_excluded(model_dir: Path, name: str) -> None:
    """The padded item's metrics are those of the same sequence run alone, without padding."""
    assembly = assembly_of(name)
    keep = real_tokens(assembly)
    item = int(np.argmin(keep.sum(axis=1)))
    n_real = int(keep[item].sum())
    assert n_real < keep.shape[1], "the builder pads one sequence"
    alone_feeds = {
        key: value[item : item + 1, :n_real] for key, value in assembly.built.inputs.items()
    }
    alone = forward_trace(assembly, alone_feeds)
    result = audited(model_dir, name)
    for layer, hidden in enumerate(alone.hidden):
        expected = all_metrics(hidden[0])
        padded = forward_trace(assembly).hidden[layer][item]
        with_padding = all_metrics(padded)
        _assert_metrics(result.metrics, (item, layer), expected, f"of {name} at layer {layer}")
        # The check has teeth: counting the padding tokens changes the cosine.
        assert abs(float(with_padding["cosine"]) - float(expected["cosine"])) > tol.ORT_ATOL


@pytest.mark.parametrize("prefix", [1, 2])
def test_exclude_prefix_drops_the_first_tokens(model_dir: Path, prefix: int) -> None:
    assembly = assembly_of(PADDED)
    result = audited(model_dir, PADDED, exclude_prefix=prefix)
    keep = real_tokens(assembly).copy()
    keep[:, :prefix] = False
    assert result.config.exclude_prefix == prefix
    for layer, hidden in enumerate(forward_trace(assembly).hidden):
        expected = numpy_metrics(hidden, keep)
        _assert_metrics(result.metrics, (slice(None), layer), expected, f"at layer {layer}")


def test_exclude_prefix_true_drops_one_token_of_a_model_outside_the_zoo(model_dir: Path) -> None:
    assert audited(model_dir, PADDED, exclude_prefix=True).config.exclude_prefix == 1
    assert audited(model_dir, PADDED, exclude_prefix=False).config.exclude_prefix == 0


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"exclude_prefix": -1}, "exclude_prefix"),
        ({"exclude_prefix": 1.5}, "exclude_prefix"),
        ({"batch_size": 0}, "batch_size"),
        ({"dominance": "token"}, "dominance"),
        ({"provider": "tpu"}, "provider"),
    ],
)
def test_bad_arguments_are_named(model_dir: Path, kwargs: dict, argument: str) -> None:
    path = saved_model(model_dir, PADDED)
    with pytest.raises(InputError, match=f"`{argument}`"):
        audit(path, builder_inputs(assembly_of(PADDED)), **kwargs)


# -- provider ---------------------------------------------------------------------------------------


def _cuda_session_providers(path: Path) -> list[str]:
    """What onnxruntime itself runs when asked for CUDA first (independent of the runner)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(os.fspath(path), options, providers=[_CUDA, _CPU])
    return list(session.get_providers())


def test_reported_provider_is_what_onnxruntime_used(model_dir: Path) -> None:
    path = saved_model(model_dir, PADDED)
    inputs = builder_inputs(assembly_of(PADDED))
    cpu = audit(path, inputs, provider="cpu", dominance="none")
    assert cpu.provider.used == (_CPU,)
    assert cpu.provider.requested == "cpu"
    auto = audit(path, inputs, provider="auto", dominance="none")
    assert auto.provider.used[0] == _cuda_session_providers(path)[0]
    assert list(auto.provider.used) == auto.provenance.runner["provider_used"]
    if auto.provider.used[0] == _CPU:
        assert "CPU" in auto.provider.note


def test_cuda_that_cannot_run_is_an_error(model_dir: Path) -> None:
    path = saved_model(model_dir, PADDED)
    if _cuda_session_providers(path)[0] == _CUDA:
        result = audit(path, builder_inputs(assembly_of(PADDED)), provider="cuda", dominance="none")
        assert result.provider.used[0] == _CUDA
        return
    with pytest.raises(ProviderError, match="cuda"):
        audit(path, builder_inputs(assembly_of(PADDED)), provider="cuda")


# -- random inputs ----------------------------------------------------------------------------------


def test_random_inputs_are_labelled_in_result_and_report(model_dir: Path, tmp_path: Path) -> None:
    path = saved_model(model_dir, "vit_prenorm_layerscale")
    inputs = random_inputs(load_model(path).inputs, seed=1, batch=2)
    result = audit(path, inputs, provider="cpu")
    assert result.inputs.random is True
    assert any(note.kind == "random" and "RANDOM" in note.text for note in result.notes)
    report = (save_audit(result, tmp_path / "report") / "report.md").read_text(encoding="utf-8")
    assert "RANDOM" in report


# -- a real model -----------------------------------------------------------------------------------


@pytest.mark.realmodel
def test_real_text_model_padding_equals_the_sequence_alone() -> None:
    """minilm-l3 on a padded pair of bundled sentences vs the shorter one alone."""
    path = require_real_model("minilm-l3")
    text = bundled_inputs("text", graph=load_model(path).inputs)
    lengths = text.token_mask.sum(axis=1)
    short, long = int(np.argmin(lengths)), int(np.argmax(lengths))
    padded = text.subset([long, short])
    n_real = int(lengths[short])
    alone = text.subset([short])
    alone = Inputs(
        feeds={key: value[:, :n_real] for key, value in alone.feeds.items()},
        token_mask=alone.token_mask[:, :n_real],
        labels=alone.labels,
        source="test",
    )
    with_padding = audit(path, padded, provider="cpu", batch_size=2)
    by_itself = audit(path, alone, provider="cpu")
    for metric in METRICS:
        assert_allclose(
            with_padding.metrics[metric][1],
            by_itself.metrics[metric][0],
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL,
            err_msg=metric,
        )
    padded_kinds = [c.kind for c in with_padding.dominance if c.input == 1]
    assert padded_kinds == [c.kind for c in by_itself.dominance]
    assert {c.n_tokens for c in with_padding.dominance if c.input == 1} == {n_real}


def test_audit_takes_its_options_once_and_refuses_an_unknown_one(model_dir: Path) -> None:
    """``audit()`` has no keyword list of its own: AuditOptions' fields, on top of ``options``."""
    from oversmooth.importers.audit.pipeline import AuditOptions
    from oversmooth.importers.errors import ImporterInputError

    path = saved_model(model_dir, "bert_legacy")
    inputs = builder_inputs(assembly_of("bert_legacy"))
    with pytest.raises(ImporterInputError, match="`batchsize` is not an audit option"):
        audit(path, inputs, provider="cpu", batchsize=2)
    base = AuditOptions(provider="cpu", dominance="none", batch_size=1)
    result = audit(path, inputs, base, batch_size=3, cache=False)
    assert (result.config.batch_size, result.config.dominance) == (3, "none")
