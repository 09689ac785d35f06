"""The effective H is a property of the model, not of how its checkpoint is parametrised."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from oversmooth.importers.graph import load_model
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.value_spectra import head_eigenvalues, layer_eigenvalues
from oversmooth.importers.weights import BlockWeights, block_weights
from oversmooth.simulator import tolerances as tol
from tests.importers.builders import assemble
from tests.importers.test_real_models import matched_distance

SEED = 3


@pytest.fixture(scope="module")
def block(tmp_path_factory: pytest.TempPathFactory) -> BlockWeights:
    """Block 0 of a pre-LayerNorm ViT with LayerScale (every factor the effective H folds)."""
    import onnx

    path = tmp_path_factory.mktemp("vit") / "vit.onnx"
    onnx.save(assemble("vit_prenorm_layerscale", SEED).built.model, path)
    graph = load_model(path)
    return block_weights(graph, find_attention_blocks(graph).blocks[0])


def _flip_gamma(block: BlockWeights, k: np.ndarray) -> BlockWeights:
    """Negate γ_k and β_k with row k of W_Q, W_K and W_V: LN(x)_k W changes sign twice, the
    network computes the same function."""
    sign = np.ones(block.d_model)
    sign[k] = -1.0
    return dataclasses.replace(
        block,
        gamma=block.gamma * sign,
        beta=block.beta * sign,
        W_Q=block.W_Q * sign[:, None],
        W_K=block.W_K * sign[:, None],
        W_V=block.W_V * sign[:, None],
    )


def _flip_layer_scale(block: BlockWeights, k: np.ndarray) -> BlockWeights:
    """Negate LayerScale s_k with column k of W_O and b_O_k: the branch's output is unchanged."""
    sign = np.ones(block.d_model)
    sign[k] = -1.0
    return dataclasses.replace(
        block,
        layer_scale=block.layer_scale * sign,
        W_O=block.W_O * sign[None, :],
        b_O=None if block.b_O is None else block.b_O * sign,
    )


@pytest.mark.parametrize("flip", [_flip_gamma, _flip_layer_scale])
def test_a_function_preserving_reparametrisation_keeps_the_effective_h(block, flip) -> None:
    k = np.random.default_rng(SEED).choice(block.d_model, block.d_model // 2, replace=False)
    other = flip(block, k)
    for head in range(block.n_heads):
        effective = head_eigenvalues(block, head, h="effective")
        radius = float(np.max(np.abs(effective)))
        assert (
            matched_distance(head_eigenvalues(other, head, h="effective"), effective)
            <= tol.HEAD_SPECTRUM_RTOL * radius
        )
    whole = layer_eigenvalues(block, h="effective")
    assert matched_distance(layer_eigenvalues(other, h="effective"), whole) <= (
        tol.HEAD_SPECTRUM_RTOL * float(np.max(np.abs(whole)))
    )
    # the stored product is not a property of the model: the same flip moves its spectrum
    stored, moved = layer_eigenvalues(block), layer_eigenvalues(other)
    assert matched_distance(moved, stored) > tol.GAMMA_FOLD_MIN_RTOL * np.max(np.abs(stored))


def test_the_effective_product_is_the_stated_factorisation(block) -> None:
    """M_h = C diag(γ) W_V^h W_O^h diag(s), C = I − 𝟙𝟙ᵀ/d, built densely here."""
    d = block.d_model
    centre = np.eye(d) - np.ones((d, d)) / d
    left, right = block.effective_value_head(0)
    W_V, W_O = block.value_head(0)
    dense = centre @ np.diag(block.gamma) @ W_V @ W_O @ np.diag(block.layer_scale)
    np.testing.assert_allclose(left @ right, dense, rtol=tol.STEP_RTOL, atol=tol.STEP_ATOL)
    assert block.folded() == ("centring", "gamma", "layer_scale")
