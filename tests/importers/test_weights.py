"""A block's weights (importers.weights): head slices with and without GQA, the effective H's
factors by norm kind, what is folded and what is omitted, the arrays written out, and ``extract``
on a partly matched model.

That every builder variant's weights come out as the builder drew them is tested in
match/test_variants.py; that the effective H does not depend on the checkpoint's parametrisation,
in test_effective_h.py.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match import IncompleteMatchError
from oversmooth.importers.weights import FACTOR_KEYS, WEIGHT_KEYS, BlockWeights, extract
from oversmooth.simulator.tolerances import STEP_ATOL, STEP_RTOL
from tests.importers.builders import assemble, assemble_near_miss

SEED = 3
#: Builder variants by the kind of norm their attention sub-block has.
POST_LN, PRE_LN, PRE_RMS = "bert_legacy", "vit_prenorm_layerscale", "llama_rmsnorm_rope_gqa"


@functools.cache
def blocks_of(name: str) -> tuple[BlockWeights, ...]:
    """Every block of builder model ``name``."""
    return tuple(extract(model_from_proto(assemble(name, SEED).built.model)))


# -- heads ---------------------------------------------------------------------------------------


def test_with_gqa_each_query_head_reads_its_groups_key_value_head() -> None:
    block = blocks_of(PRE_RMS)[0]
    width = block.d_head
    assert (block.n_heads, block.n_kv_heads, block.kv_group) == (4, 2, 2)
    for head, kv in enumerate([0, 0, 1, 1]):
        W_V, W_O = block.value_head(head)
        np.testing.assert_array_equal(W_V, block.W_V[:, kv * width : (kv + 1) * width])
        np.testing.assert_array_equal(W_O, block.W_O[head * width : (head + 1) * width])
    expanded = block.expanded_W_V()
    assert expanded.shape == (block.d_model, block.n_heads * width)
    np.testing.assert_array_equal(expanded[:, width : 2 * width], block.W_V[:, :width])
    np.testing.assert_array_equal(expanded[:, 2 * width : 3 * width], block.W_V[:, width:])


def test_without_gqa_the_expanded_values_are_the_values() -> None:
    block = blocks_of(POST_LN)[0]
    assert block.kv_group == 1
    np.testing.assert_array_equal(block.expanded_W_V(), block.W_V)


def test_extracted_weights_are_read_only_float64() -> None:
    block = blocks_of(PRE_LN)[0]
    for key, array in block.arrays().items():
        assert array.dtype == np.float64, key
        assert not array.flags.writeable, key


# -- the effective H's factors, by norm kind -------------------------------------------------------


def test_a_pre_layernorm_block_folds_centring_gamma_and_layer_scale() -> None:
    block = blocks_of(PRE_LN)[0]
    factors = block.h_factors()
    assert block.centred
    assert factors["h_centre"].shape == ()  # a 0-d flag, as h_factors documents
    assert float(factors["h_centre"]) == 1.0
    np.testing.assert_array_equal(factors["h_scale_in"], block.gamma)
    np.testing.assert_array_equal(factors["h_scale_out"], block.layer_scale)
    assert block.folded() == ("centring", "gamma", "layer_scale")
    assert block.omitted() == ("per-token 1/σ of the layernorm", "beta", "b_V", "b_O")


def test_a_pre_rmsnorm_block_folds_gamma_but_does_not_centre() -> None:
    block = blocks_of(PRE_RMS)[0]
    factors = block.h_factors()
    assert not block.centred
    assert float(factors["h_centre"]) == 0.0
    np.testing.assert_array_equal(factors["h_scale_in"], block.gamma)
    np.testing.assert_array_equal(factors["h_scale_out"], np.ones(block.d_model))
    assert block.folded() == ("gamma",)
    assert block.omitted() == ("per-token 1/σ of the rmsnorm",)


def test_a_post_layernorm_block_folds_nothing_its_norm_acts_on_the_sum() -> None:
    block = blocks_of(POST_LN)[0]
    assert block.gamma is not None  # the norm after the residual add is not the branch's
    factors = block.h_factors()
    assert float(factors["h_centre"]) == 0.0
    np.testing.assert_array_equal(factors["h_scale_in"], np.ones(block.d_model))
    np.testing.assert_array_equal(factors["h_scale_out"], np.ones(block.d_model))
    assert block.folded() == ()
    assert block.omitted() == ("b_V", "b_O", "the norm after the residual add")


@pytest.mark.parametrize("name", [POST_LN, PRE_LN, PRE_RMS])
def test_the_effective_whole_layer_factors_are_the_stated_products(name: str) -> None:
    """``L W_V`` (heads expanded) and ``W_O R`` against dense ``C diag(γ)`` and ``diag(s)``."""
    block = blocks_of(name)[0]
    d = block.d_model
    factors = block.h_factors()
    centre = np.eye(d) - float(factors["h_centre"]) * np.ones((d, d)) / d
    left = centre @ np.diag(factors["h_scale_in"]) @ block.expanded_W_V()
    right = block.W_O @ np.diag(factors["h_scale_out"])
    np.testing.assert_allclose(block.effective_W_V(), left, rtol=STEP_RTOL, atol=STEP_ATOL)
    np.testing.assert_allclose(block.effective_W_O(), right, rtol=STEP_RTOL, atol=STEP_ATOL)
    for head in range(block.n_heads):
        head_left, head_right = block.effective_value_head(head)
        width = slice(head * block.d_head, (head + 1) * block.d_head)
        np.testing.assert_allclose(head_left, left[:, width], rtol=STEP_RTOL, atol=STEP_ATOL)
        np.testing.assert_allclose(head_right, right[width], rtol=STEP_RTOL, atol=STEP_ATOL)


# -- what is written out -------------------------------------------------------------------------


def test_the_arrays_are_the_present_weights_then_the_factors_in_key_order() -> None:
    rms = blocks_of(PRE_RMS)[0]  # no biases, no beta, no LayerScale
    assert list(rms.arrays()) == ["W_Q", "W_K", "W_V", "W_O", "gamma", *FACTOR_KEYS]
    vit = blocks_of(PRE_LN)[0]  # every weight
    assert list(vit.arrays()) == [*WEIGHT_KEYS, *FACTOR_KEYS]
    np.testing.assert_array_equal(vit.arrays()["layer_scale"], vit.layer_scale)


# -- extract ---------------------------------------------------------------------------------------


def test_extract_returns_every_block_in_depth_order() -> None:
    blocks = blocks_of(POST_LN)
    assert [block.index for block in blocks] == [0, 1]
    assert blocks[0].output_name == blocks[1].input_name


def test_a_partly_matched_model_is_refused_unless_partial() -> None:
    model = model_from_proto(assemble_near_miss("softmax_axis", SEED).built.model)
    with pytest.raises(IncompleteMatchError, match="1 of 2 attention blocks are not matched"):
        extract(model)
    (matched,) = extract(model, partial=True)
    assert matched.W_Q.shape == (matched.d_model, matched.n_heads * matched.d_head)
