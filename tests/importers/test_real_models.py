"""The importer on the three pinned real models (installed by ``make venv``).

In CI (``CI`` set) a missing or changed model fails with the zoo's message naming the package, pin
and expected hash; elsewhere the tests skip with that same message.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from numpy.testing import assert_allclose
from scipy.optimize import linear_sum_assignment

from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.importers.match import MatchReport, find_attention_blocks
from oversmooth.importers.value_spectra import (
    LAYER_HEAD,
    head_eigenvalues,
    model_spectra,
    summarize_spectra,
)
from oversmooth.importers.weights import BlockWeights, extract
from oversmooth.simulator import tolerances as tol
from tests.importers.match.test_variants import (
    attention_branch,
    attention_probabilities,
    normed,
    run_exposed,
)
from tests.realmodels import require_real_model

pytestmark = pytest.mark.realmodel

#: What each zoo model is: its pinned architecture (see the zoo table in oversmooth/importers/zoo.py).
REAL_MODELS = {
    "minilm-l6-int8": {
        "blocks": 6,
        "heads": 12,
        "d_head": 32,
        "norm": "post",
        "layer_scale": False,
    },
    "minilm-l3": {"blocks": 3, "heads": 12, "d_head": 32, "norm": "post", "layer_scale": False},
    "dinov2-vits14": {"blocks": 12, "heads": 6, "d_head": 64, "norm": "pre", "layer_scale": True},
}
D_MODEL = 384


@functools.cache
def report(name: str) -> MatchReport:
    return find_attention_blocks(load_model(require_real_model(name)))


@functools.cache
def weights(name: str) -> tuple[BlockWeights, ...]:
    return tuple(extract(load_model(require_real_model(name))))


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_blocks_have_the_known_architecture(name):
    expected = REAL_MODELS[name]
    found = report(name)
    assert found.failures == [], found.explain()
    assert found.n_softmax == expected["blocks"]
    assert len(found.blocks) == expected["blocks"]
    for block in found.blocks:
        assert block.n_heads == expected["heads"]
        assert block.n_kv_heads == expected["heads"]
        assert block.d_head == expected["d_head"]
        assert block.d_model == D_MODEL
        assert block.norm == expected["norm"]
        assert block.norm_kind == "layernorm"
        assert block.has_layer_scale == expected["layer_scale"]
        assert block.notes == (), block.notes


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_weights_are_finite_float64_with_the_convention_shapes(name):
    width = REAL_MODELS[name]["heads"] * REAL_MODELS[name]["d_head"]
    shapes = {
        "W_Q": (D_MODEL, width),
        "W_K": (D_MODEL, width),
        "W_V": (D_MODEL, width),
        "W_O": (width, D_MODEL),
    }
    for block in weights(name):
        arrays = block.arrays()
        assert {key: arrays[key].shape for key in shapes} == shapes
        for key, value in arrays.items():
            assert value.dtype == np.float64, key
            assert np.all(np.isfinite(value)), f"block {block.index}: {key}"
            if key != "h_centre":  # 0.0 where the branch reads its input uncentred (post-LN)
                assert np.any(value != 0), f"block {block.index}: {key} is all zeros"
        assert (block.layer_scale is not None) == REAL_MODELS[name]["layer_scale"]


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_blocks_chain_in_depth_order(name):
    for block, following in itertools.pairwise(weights(name)):
        assert block.output_name == following.input_name


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_onnxruntime_values_are_recomputed_from_the_extracted_weights(name):
    path = require_real_model(name)
    blocks = weights(name)
    chosen = [blocks[0], blocks[-1]]
    feeds = random_inputs(load_model(path).inputs, seed=3, batch=1, seq=8).feeds
    names = [n for b in chosen for n in (b.input_name, b.attention_name, b.residual_name)]
    names += [b.norm_output_name for b in chosen if b.norm_output_name]
    values = run_exposed(load_model(path).proto, feeds, names)
    for block in chosen:
        x, A = values[block.input_name], values[block.attention_name]
        residual = values[block.residual_name]
        scale = float(np.max(np.abs(residual)))
        assert_allclose(
            attention_probabilities(block, x),
            A,
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL,
            err_msg=f"{name} block {block.index}: softmax(Q K^T / sqrt(d_head)) from W_Q, W_K",
        )
        assert_allclose(
            attention_branch(block, x, A),
            residual,
            rtol=tol.ORT_RTOL,
            atol=tol.ORT_ATOL * scale,
            err_msg=f"{name} block {block.index}: residual from W_V, W_O (and LayerScale)",
        )
        if block.norm == "post":
            assert_allclose(
                normed(block, residual),
                values[block.norm_output_name],
                rtol=tol.ORT_RTOL,
                atol=tol.ORT_ATOL,
                err_msg=f"{name} block {block.index}: post-LN from gamma, beta",
            )


def matched_distance(big: np.ndarray, small: np.ndarray) -> float:
    """Largest distance in the best one-to-one matching of ``big`` with ``small`` padded by zeros."""
    padded = np.concatenate([small, np.zeros(big.size - small.size)])
    cost = np.abs(big[:, None] - padded[None, :])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_head_spectra_are_the_nonzero_eigenvalues_of_the_full_product(name):
    """Claim 31: eig(W_V^h W_O^h) (d x d) = eig(W_O^h W_V^h) (d_head x d_head) plus zeros."""
    blocks = weights(name)
    for block, head in ((blocks[0], 0), (blocks[-1], blocks[-1].n_heads - 1)):
        small = head_eigenvalues(block, head)
        assert small.shape == (block.d_head,)
        W_V, W_O = block.value_head(head)
        big = np.linalg.eigvals(W_V @ W_O)
        radius = float(np.max(np.abs(big)))
        assert matched_distance(big, small) <= tol.HEAD_SPECTRUM_RTOL * radius, (
            f"{name} block {block.index} head {head}"
        )


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_model_spectra_rows_stored_and_effective(name):
    blocks = weights(name)[:2]  # two blocks keep the d x d eigensolves few
    rows = model_spectra(blocks)
    kinds = {row.kind for row in rows}
    assert kinds == {"head", "layer", "head-effective", "layer-effective"}
    width = REAL_MODELS[name]["heads"] * REAL_MODELS[name]["d_head"]
    per_kind = {kind: sum(row.kind == kind for row in rows) for kind in kinds}
    assert per_kind["head"] == per_kind["layer"] == len(blocks) * min(width, D_MODEL)
    assert per_kind["head-effective"] == per_kind["head"]
    assert all(row.head == LAYER_HEAD for row in rows if row.kind.startswith("layer"))
    summaries = summarize_spectra(rows)
    for summary in summaries.values():
        assert 0.0 <= summary.negative_fraction <= 1.0
        assert 0.0 <= summary.inside_unit_disk <= 1.0
        assert summary.spectral_radius > 0.0
        assert np.isfinite(summary.skewness)
    for block in blocks:
        for head in range(block.n_heads):
            stored = head_eigenvalues(block, head)
            effective = head_eigenvalues(block, head, h="effective")
            if not block.folded():
                np.testing.assert_array_equal(effective, stored)
                continue
            radius = float(np.max(np.abs(stored)))
            assert abs(effective.sum() - stored.sum()) > tol.GAMMA_FOLD_MIN_RTOL * radius


def test_dinov2_effective_h_equals_the_product_of_the_exported_factors(tmp_path):
    """The audit's λ^H, rebuilt independently from `oversmooth weights`: the d×d product
    C diag(h_scale_in) W_V^h W_O^h diag(h_scale_out), C = I − 𝟙𝟙ᵀ/d where h_centre is 1."""
    from oversmooth.cli import main

    require_real_model("dinov2-vits14")
    out = tmp_path / "w.npz"
    assert main(["weights", "dinov2-vits14", "--out", str(out)]) == 0
    spectra = model_spectra(weights("dinov2-vits14")[:2])
    with np.load(out) as archive:
        for index in range(2):

            def get(key: str, index: int = index) -> np.ndarray:
                return archive[f"blocks.{index}.{key}"]

            d = get("W_V").shape[0]
            centre = np.eye(d) - np.ones((d, d)) / d if get("h_centre") == 1.0 else np.eye(d)
            assert get("h_centre") == 1.0  # DINOv2 is pre-LayerNorm
            d_head = REAL_MODELS["dinov2-vits14"]["d_head"]
            for head in range(REAL_MODELS["dinov2-vits14"]["heads"]):
                cols = slice(head * d_head, (head + 1) * d_head)
                left = centre @ (get("h_scale_in")[:, None] * get("W_V")[:, cols])
                M = left @ (get("W_O")[cols, :] * get("h_scale_out")[None, :])
                dense = np.linalg.eigvals(M)
                dense = dense[np.argsort(-np.abs(dense))][:d_head]
                ours = np.array(
                    [
                        complex(r.real, r.imag)
                        for r in spectra
                        if r.kind == "head-effective" and r.block == index and r.head == head
                    ]
                )
                radius = float(np.max(np.abs(dense)))
                assert matched_distance(dense, ours) <= tol.HEAD_SPECTRUM_RTOL * radius
