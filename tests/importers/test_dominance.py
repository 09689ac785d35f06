"""The audit's dominance step on real attention matrices: the certified path equals the dense one.

The attention probabilities of zoo models on their bundled inputs (restricted to the real tokens,
rows renormalised, as the audit does) with the heads' H spectra: every head must get the same kind
from :func:`simulator.perron.dominating_modes` as from the full spectra, with μ, λ^A and λ^H equal
to 1e-9, and most heads must be decided by the bound (else the fast path would not be used).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from numpy.testing import assert_allclose
from threadpoolctl import threadpool_limits

from importers.graph import load_model
from importers.match import find_attention_blocks
from importers.run.audit import audit_session
from importers.run.cache import cached_value_spectra
from importers.run.dominance import dominance_spectra
from importers.run.sources import default_inputs
from importers.weights import block_weights
from importers.zoo import file_sha256, lookup
from simulator.perron import dominating_modes, perron_targets
from simulator.tolerances import EIG_TOL
from tests.realmodels import require_real_model

#: Inputs per model: enough heads for a fraction, few enough for the dense path's time.
ITEMS = {"dinov2-vits14": 2, "minilm-l6-int8": 8}
#: The share of heads the bound decides on these inputs (measured: 77 % and 75 %).
MIN_CERTIFIED = 0.5


@functools.cache
def attention_problems(name: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(A, eig_H)`` per (input, layer): A (heads, n, n) on real tokens, eig_H (heads, k)."""
    path = require_real_model(name)
    graph = load_model(path)
    blocks = [block_weights(graph, block) for block in find_attention_blocks(graph).blocks]
    inputs = default_inputs(graph.inputs, lookup(name).entry)
    inputs = inputs.subset(range(min(ITEMS[name], inputs.batch_size)))
    session = audit_session(graph, blocks, inputs, provider="cpu", spectral=False)
    outputs = session.runner.collect(session.feeds, batch_size=inputs.batch_size)
    spectra = cached_value_spectra(blocks, file_sha256(path), use_cache=False)
    eig_H = dominance_spectra(blocks, spectra, "head", False)
    problems = []
    for layer, tensor in enumerate(session.attention):
        probs = outputs[tensor]
        for item, real in enumerate(inputs.token_mask_for(probs.shape[-1])):
            keep = np.flatnonzero(real)
            A = probs[item][:, keep][:, :, keep].astype(np.float64)
            problems.append((A / A.sum(axis=-1, keepdims=True), eig_H[layer]))
    return problems


@pytest.mark.realmodel
@pytest.mark.parametrize("name", sorted(ITEMS))
def test_real_attention_gets_the_dense_kinds_and_modes(name: str) -> None:
    certified = total = 0
    for A, eig_H in attention_problems(name):
        with threadpool_limits(limits=1, user_api="blas"):  # as in the audit: see model_spectra
            fast = dominating_modes(A, eig_H, targets=perron_targets(eig_H))
            dense = dominating_modes(A, eig_H, certify=False)
        np.testing.assert_array_equal(fast.kinds, dense.kinds)
        for field in ("mu", "eig_A", "eig_H"):
            assert_allclose(getattr(fast, field), getattr(dense, field), rtol=0, atol=EIG_TOL)
        certified += int(fast.certified.sum())
        total += len(A)
    assert certified >= MIN_CERTIFIED * total, f"{certified} of {total} certified"
