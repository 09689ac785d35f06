"""The importer on the family fixture corpus (issue 11): tiny random Transformers of many families,
exported the ways users export them, checked against the truth torch computed.

``tests/fixtures/families/manifest.json`` lists every fixture (written by
``scripts/make_family_fixtures.py``; see docs/fixtures.md). For each one the importer must find every
attention block with the true head count, key/value head count and head size; the per-head products
W_V^h W_O^h and W_Q^h W_K^hᵀ must match the truth to 1e-4 (relative, Frobenius); and the audit's
layer tensors, run through :class:`~importers.run.runner.Runner`, must match the true residual
stream at every layer boundary to 1e-3 (relative). A fixture that fails today is listed in
:data:`KNOWN_FAILURES` with the first line of what went wrong and runs as a strict xfail: when a fix
makes it pass, the test fails until its entry is removed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from importers.graph import OnnxModel, load_model
from importers.match import NoAttentionBlocksError, find_attention_blocks
from importers.run.audit import layer_tensors
from importers.run.runner import Runner
from importers.weights import BlockWeights, block_weights
from simulator.errors import one_line

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "families"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))

#: Relative tolerance on the per-head products W_V^h W_O^h and W_Q^h W_K^hᵀ.
WEIGHT_RTOL = 1e-4
#: Relative tolerance on each layer's hidden states.
LAYER_RTOL = 1e-3
#: Dynamic int8 quantisation also quantises the activations at run time, per batch: the graph's
#: hidden states differ from any float recomputation by that rounding, so layers are compared to
#: the (dequantised-weight) truth at this looser tolerance. Weights are still exact.
QUANTISED_LAYER_RTOL = 5e-2

#: Fixtures that fail today, with the first line of the failure (see docs/fixtures.md).
KNOWN_FAILURES: dict[str, str] = {
    "albert-int8": "block 1 head 0: W_Q W_K^T differs by 1.1e-02 (relative)",
    "bloom-dynamo_eager": "no attention block found among 2 Softmax node(s); most common reasons: Softmax 'node_Softmax_105': QK^T MatMul not found: no input of Add 'node_add_207' comes from a product of two non-constant tensors (x2)",
    "bloom-int8": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/model/h.0/self_attention/Softmax': QK^T MatMul not found: no input of Add '/model/h.0/self_attention/Add_1' comes from a product of two non-constant tensors (x2)",
    "bloom-legacy_eager": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/model/h.0/self_attention/Softmax': QK^T MatMul not found: no input of Add '/model/h.0/self_attention/Add_1' comes from a product of two non-constant tensors (x2)",
    "bloom-optimized": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/model/h.0/self_attention/Softmax': QK^T MatMul not found: no input of Add '/model/h.0/self_attention/Add_1' comes from a product of two non-constant tensors (x2)",
    "bloom-optimum": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/h.0/self_attention/Softmax': QK^T MatMul not found: no input of Add '/h.0/self_attention/Add_1' comes from a product of two non-constant tensors (x2)",
    "deberta_v2-dynamo_eager": "no attention block found among 2 Softmax node(s); most common reasons: Softmax 'node_softmax': QK^T MatMul not found: walking back from the Softmax reached Reshape 'node_view_10' (x2)",
    "deberta_v2-legacy_eager": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/model/encoder/layer.0/attention/self/Softmax': QK^T MatMul not found: walking back from the Softmax reached Reshape '/model/encoder/layer.0/attention/self/Reshape_12' (x2)",
    "deberta_v2-optimized": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/model/encoder/layer.0/attention/self/Softmax': QK^T MatMul not found: walking back from the Softmax reached Reshape '/model/encoder/layer.0/attention/self/Reshape_12' (x2)",
    "deberta_v2-optimum": "no attention block found among 2 Softmax node(s); most common reasons: Softmax '/encoder/layer.0/attention/self/Softmax': QK^T MatMul not found: walking back from the Softmax reached Reshape '/encoder/layer.0/attention/self/Reshape_12' (x2)",
    "falcon-dynamo_eager": "no attention block found among 2 Softmax node(s); most common reasons: Softmax 'node_Softmax_157': K projection not found: walking back from 'transpose_4' reached GatherND 'node_GatherND_80' (expected a MatMul/Gemm with a constant weight) (x2)",
    "siglip_vision-int8": "layer 1 ('/model/vision_model/encoder/layers.0/Add_1_output_0') differs from the residual stream by 1.0e-01",
}


def _relative(found: np.ndarray, truth: np.ndarray) -> float:
    scale = max(float(np.linalg.norm(truth)), 1e-30)
    return float(np.linalg.norm(found - truth)) / scale


@functools.cache
def _truth(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name) as data:
        return {key: data[key] for key in data.files}


def _feeds(model: OnnxModel, truth: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The truth's input feeds that the graph takes (exports differ in their optional inputs)."""
    return {graph_input.name: truth[f"feed_{graph_input.name}"] for graph_input in model.inputs}


def _blocks(model: OnnxModel, n_layers: int) -> list[BlockWeights] | str:
    """Every block's weights, or the first line of why they could not all be found."""
    try:
        report = find_attention_blocks(model)
    except NoAttentionBlocksError as err:
        return one_line(err)
    if report.failures:
        first = report.failures[0]
        return f"{len(report.failures)} of {report.n_softmax} Softmax rejected: {first.reason}"
    if len(report.blocks) != n_layers:
        return f"found {len(report.blocks)} blocks; the model has {n_layers}"
    return [block_weights(model, block) for block in report.blocks]


def _head_problem(block: BlockWeights, truth: dict[str, np.ndarray], layer: int) -> str | None:
    """The first head whose W_Q^h W_K^hᵀ or W_V^h W_O^h differs from the truth."""
    dh, group = int(truth["d_head"]), int(truth["n_heads"]) // int(truth["n_kv_heads"])
    for h in range(int(truth["n_heads"])):
        q, kv = slice(h * dh, (h + 1) * dh), slice((h // group) * dh, (h // group + 1) * dh)
        pairs = {
            "W_Q W_K^T": (
                block.W_Q[:, q] @ block.W_K[:, kv].T,
                truth["W_Q"][layer][:, q].astype(np.float64) @ truth["W_K"][layer][:, kv].T,
            ),
            "W_V W_O": (
                block.W_V[:, kv] @ block.W_O[q, :],
                truth["W_V"][layer][:, kv].astype(np.float64) @ truth["W_O"][layer][q, :],
            ),
        }
        for name, (found, expected) in pairs.items():
            error = _relative(found, expected)
            if error > WEIGHT_RTOL:
                return f"block {layer} head {h}: {name} differs by {error:.1e} (relative)"
    return None


def _structure_problem(blocks: list[BlockWeights], truth: dict[str, np.ndarray]) -> str | None:
    for layer, block in enumerate(blocks):
        found = (block.n_heads, block.n_kv_heads, block.d_head)
        expected = tuple(int(truth[key]) for key in ("n_heads", "n_kv_heads", "d_head"))
        if found != expected:
            return f"block {layer}: (heads, kv heads, d_head) = {found}; expected {expected}"
        problem = _head_problem(block, truth, layer)
        if problem:
            return problem
    return None


def _layer_problem(
    model: OnnxModel, blocks: list[BlockWeights], truth: dict[str, np.ndarray], rtol: float
) -> str | None:
    """The first audit layer whose tensor differs from the true residual stream."""
    names = layer_tensors(blocks)
    try:
        outputs = Runner(model, expose=names, provider="cpu", threads=1).collect(
            _feeds(model, truth)
        )
    except Exception as err:  # the runner's own errors and onnxruntime's alike
        return f"runner failed: {one_line(err)}"
    for layer, name in enumerate(names):
        found, expected = outputs[name], truth["hidden"][layer]
        if found.shape != expected.shape:
            return f"layer {layer} ({name!r}) has shape {found.shape}; expected {expected.shape}"
        error = _relative(found.astype(np.float64), expected.astype(np.float64))
        if error > rtol:
            return f"layer {layer} ({name!r}) differs from the residual stream by {error:.1e}"
    return None


def first_problem(entry: dict[str, Any]) -> str | None:
    """The first way the importer's answer on one fixture differs from its truth (None: none)."""
    truth = _truth(entry["truth"])
    model = load_model(FIXTURES / entry["file"])
    blocks = _blocks(model, truth["W_Q"].shape[0])
    if isinstance(blocks, str):
        return blocks
    rtol = QUANTISED_LAYER_RTOL if entry["variant"] == "int8" else LAYER_RTOL
    return _structure_problem(blocks, truth) or _layer_problem(model, blocks, truth, rtol)


def _params() -> list[Any]:
    params = []
    for entry in MANIFEST["fixtures"]:
        reason = KNOWN_FAILURES.get(entry["id"])
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(entry, id=entry["id"], marks=marks))
    return params


@pytest.mark.parametrize("entry", _params())
def test_fixture_matches_its_truth(entry: dict[str, Any]) -> None:
    problem = first_problem(entry)
    assert problem is None, problem


def test_known_failures_name_real_fixtures() -> None:
    ids = {entry["id"] for entry in MANIFEST["fixtures"]}
    assert set(KNOWN_FAILURES) <= ids, sorted(set(KNOWN_FAILURES) - ids)


def test_manifest_lists_every_file_with_its_checksum() -> None:
    listed = {entry["file"]: entry["sha256"] for entry in MANIFEST["fixtures"]}
    on_disk = {path.relative_to(FIXTURES).as_posix() for path in FIXTURES.rglob("*.onnx")}
    assert set(listed) == on_disk
    for name, digest in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


def test_corpus_stays_small() -> None:
    total = sum(path.stat().st_size for path in FIXTURES.rglob("*") if path.is_file())
    assert total <= 20 * 2**20, f"{total / 2**20:.1f} MiB"
