"""Eigenvalues of the value products (importers.value_spectra) on blocks with hand-made weights.

A builder model's block gets value weights whose spectrum is known by construction: head h reads
orthonormal columns ``Q_h`` of its key/value head and writes through ``W_O^h = D_h Q_hᵀ``, so
``W_O^h W_V^h = D_h`` and the eigenvalues of ``W_V^h W_O^h`` are the diagonal of ``D_h`` and zeros
(claim 31). With disjoint ``Q_h`` the whole layer's are every head's together; with GQA, a key/value
head's query heads add up. The effective H is checked against its dense product; the tidy rows
and the summary against hand-worked examples. That a function-preserving reparametrisation keeps
the effective spectrum is tested in test_effective_h.py.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import threadpoolctl
from scipy import stats

from oversmooth.importers import value_spectra
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.value_spectra import (
    LAYER_HEAD,
    SPECTRUM_KINDS,
    BlockSpectra,
    SpectrumRow,
    block_spectra,
    blocks_spectra,
    head_eigenvalues,
    layer_eigenvalues,
    spectrum_rows,
    summarize_spectra,
)
from oversmooth.importers.weights import BlockWeights, extract
from oversmooth.simulator.tolerances import EIG_TOL
from tests.importers.builders import assemble
from tests.importers.test_real_models import matched_distance

SEED = 3


@functools.cache
def builder_block(name: str) -> BlockWeights:
    """Block 0 of builder model ``name``."""
    return extract(model_from_proto(assemble(name, SEED).built.model))[0]


def with_known_values(block: BlockWeights, values: np.ndarray) -> BlockWeights:
    """``block`` with W_V, W_O such that ``W_O^h W_V^h = diag(values[h])``.

    Key/value head g's columns of W_V are orthonormal and disjoint from the other heads';
    ``W_O^h = diag(values[h]) Q_gᵀ`` for query head h of group g.
    """
    d, width = block.d_model, block.d_head
    Q, _ = np.linalg.qr(np.random.default_rng(SEED).standard_normal((d, d)))
    W_V = Q[:, : block.n_kv_heads * width]
    kv_heads = [W_V[:, g * width : (g + 1) * width] for g in range(block.n_kv_heads)]
    W_O = np.concatenate(
        [values[h][:, None] * kv_heads[h // block.kv_group].T for h in range(block.n_heads)]
    )
    return dataclasses.replace(block, W_V=W_V, W_O=W_O)


def head_values(block: BlockWeights) -> np.ndarray:
    """Distinct real eigenvalues per head, both signs: ``(n_heads, d_head)``."""
    count = block.n_heads * block.d_head
    return np.linspace(-2.0, 1.5, count).reshape(block.n_heads, block.d_head)


def assert_same_values(found: np.ndarray, expected: np.ndarray) -> None:
    """The same multiset of eigenvalues, to EIG_TOL (a one-to-one matching)."""
    assert found.shape == expected.shape
    assert matched_distance(np.asarray(found), np.asarray(expected)) <= EIG_TOL


# -- head and layer eigenvalues ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert_legacy", "llama_rmsnorm_rope_gqa"])
def test_each_heads_eigenvalues_are_its_own_values(name: str) -> None:
    block = builder_block(name)
    values = head_values(block)
    known = with_known_values(block, values)
    for head in range(block.n_heads):
        assert_same_values(head_eigenvalues(known, head), values[head])
        # claim 31: the d×d product has these and d − d_head zeros
        W_V, W_O = known.value_head(head)
        dense = np.linalg.eigvals(W_V @ W_O)
        padded = np.concatenate([values[head], np.zeros(block.d_model - block.d_head)])
        assert_same_values(dense, padded)


def test_a_layer_of_disjoint_heads_has_every_heads_values() -> None:
    block = builder_block("bert_legacy")
    assert block.n_heads * block.d_head == block.d_model
    values = head_values(block)
    assert_same_values(layer_eigenvalues(with_known_values(block, values)), values.ravel())


def test_with_gqa_the_query_heads_of_a_key_value_head_add_up() -> None:
    block = builder_block("llama_rmsnorm_rope_gqa")
    assert block.kv_group == 2
    values = head_values(block)
    summed = values.reshape(block.n_kv_heads, block.kv_group, block.d_head).sum(axis=1)
    zeros = np.zeros(block.d_model - summed.size)
    expected = np.concatenate([summed.ravel(), zeros])
    assert_same_values(layer_eigenvalues(with_known_values(block, values)), expected)


def test_the_effective_eigenvalues_are_those_of_the_dense_effective_product() -> None:
    """``C diag(γ) W_V W_O diag(s)`` formed densely here: C the centring, γ and s the block's."""
    vit = builder_block("vit_prenorm_layerscale")
    block = with_known_values(vit, head_values(vit))
    d = block.d_model
    centre = np.eye(d) - np.ones((d, d)) / d
    left, right = centre @ np.diag(block.gamma), np.diag(block.layer_scale)
    for head in range(block.n_heads):
        W_V, W_O = block.value_head(head)
        dense = np.linalg.eigvals(left @ W_V @ W_O @ right)
        assert matched_distance(dense, head_eigenvalues(block, head, h="effective")) <= EIG_TOL
    whole = np.linalg.eigvals(left @ block.expanded_W_V() @ block.W_O @ right)
    assert_same_values(layer_eigenvalues(block, h="effective"), whole)
    # and they are not the stored ones: γ, s and the centring move them
    assert matched_distance(layer_eigenvalues(block), whole) > 1e-3


# -- every kind of one block ---------------------------------------------------------------------


def test_a_block_that_folds_nothing_has_its_stored_spectra_as_effective() -> None:
    block = builder_block("bert_legacy")  # post-LN, no LayerScale
    assert block.folded() == ()
    spectra = block_spectra(block)
    assert spectra.head_effective is spectra.head
    assert spectra.layer_effective is spectra.layer
    assert spectra.head.shape == (block.n_heads, block.d_head)
    assert spectra.layer.shape == (block.d_model,)


def test_block_spectra_pick_their_kind_by_h() -> None:
    block = builder_block("vit_prenorm_layerscale")
    spectra = block_spectra(block)
    assert spectra.index == block.index
    assert_same_values(spectra.heads(h="stored")[1], head_eigenvalues(block, 1))
    assert_same_values(spectra.heads(h="effective")[1], head_eigenvalues(block, 1, h="effective"))
    assert_same_values(spectra.whole_layer(h="stored"), layer_eigenvalues(block))
    assert_same_values(spectra.whole_layer(h="effective"), layer_eigenvalues(block, h="effective"))


def test_blocks_spectra_run_with_one_blas_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    single = value_spectra.block_spectra

    def recording(block: BlockWeights) -> BlockSpectra:
        threads.extend(
            pool["num_threads"]
            for pool in threadpoolctl.threadpool_info()
            if pool["user_api"] == "blas"
        )
        return single(block)

    monkeypatch.setattr(value_spectra, "block_spectra", recording)
    blocks = [builder_block("bert_legacy"), builder_block("vit_prenorm_layerscale")]
    found = blocks_spectra(blocks)
    assert [spectra.index for spectra in found] == [block.index for block in blocks]
    if not threads:
        pytest.skip("no BLAS library that threadpoolctl can see")
    assert set(threads) == {1}


# -- tidy rows and their summary -----------------------------------------------------------------


def test_tidy_rows_go_heads_then_layer_stored_then_effective() -> None:
    spectra = BlockSpectra(
        index=2,
        head=np.array([[1 + 1j, 2.0]]),
        layer=np.array([3.0, -4.0]),
        head_effective=np.array([[5.0, 6 - 1j]]),
        layer_effective=np.array([7.0, 8.0]),
    )
    rows = spectrum_rows([spectra])
    assert rows == [
        SpectrumRow(2, 0, "head", 1.0, 1.0),
        SpectrumRow(2, 0, "head", 2.0, 0.0),
        SpectrumRow(2, LAYER_HEAD, "layer", 3.0, 0.0),
        SpectrumRow(2, LAYER_HEAD, "layer", -4.0, 0.0),
        SpectrumRow(2, 0, "head-effective", 5.0, 0.0),
        SpectrumRow(2, 0, "head-effective", 6.0, -1.0),
        SpectrumRow(2, LAYER_HEAD, "layer-effective", 7.0, 0.0),
        SpectrumRow(2, LAYER_HEAD, "layer-effective", 8.0, 0.0),
    ]
    assert {row.kind for row in rows} == set(SPECTRUM_KINDS)
    assert all(type(row.real) is float and type(row.imag) is float for row in rows)


def test_the_summary_of_a_hand_worked_kind() -> None:
    values = [-1.0, complex(-0.5, 1.0), 0.5, 2.0]
    rows = [SpectrumRow(0, 0, "head", z.real, z.imag) for z in map(complex, values)]
    rows.append(SpectrumRow(0, LAYER_HEAD, "layer", 1.0, 0.0))
    summaries = summarize_spectra(rows)
    assert list(summaries) == ["head", "layer"]  # kinds present, in SPECTRUM_KINDS order
    head = summaries["head"]
    assert head.count == 4
    assert head.negative_fraction == 0.5
    assert head.median_real == 0.0  # (−0.5 + 0.5) / 2
    assert head.inside_unit_disk == 0.25  # only −1: |1 + (−1)| = 0
    assert head.spectral_radius == 2.0
    reference = stats.skew([-1.0, -0.5, 0.5, 2.0], bias=True)
    assert head.skewness == pytest.approx(reference, rel=1e-12)
    assert np.isnan(summaries["layer"].skewness)  # one value: no spread
