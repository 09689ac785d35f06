"""Causal attention: the block is marked, the report says how its dominance is classified.

A causal A is lower-triangular with a_00 = 1, so its spectrum is its diagonal: λ^A = 1 is an
eigenvalue, but A is not positive and Perron–Frobenius does not apply. The audit keeps the rule of
:func:`oversmooth.simulator.theory.dominance_kinds` and says so in the report.
"""

from __future__ import annotations

import numpy as np

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.report import render_report
from oversmooth.simulator.theory import KINDS, dominance_kinds
from tests.importers.family_corpus import load_fixture


def _causal_attention(n: int, rng: np.random.Generator) -> np.ndarray:
    """A row-stochastic lower-triangular A with a positive lower triangle."""
    A = np.tril(rng.uniform(0.1, 1.0, size=(n, n)))
    return A / A.sum(axis=1, keepdims=True)


def test_a_causal_spectrum_is_its_diagonal_and_keeps_the_unit_root() -> None:
    A = _causal_attention(6, np.random.default_rng(0))
    eig = np.linalg.eigvals(A)
    np.testing.assert_allclose(np.sort(eig.real), np.sort(np.diag(A)), atol=1e-12)
    assert A[0, 0] == 1.0


def test_causal_dominance_follows_the_same_rule() -> None:
    A = _causal_attention(6, np.random.default_rng(1))
    eig_A = np.diag(A).astype(complex)
    # H with a large positive eigenvalue: 1 + λ^H · 1 dominates (perron-type)
    assert KINDS[int(dominance_kinds(eig_A, np.array([2.0, -0.5])))] == "perron"
    # λ^H = -1.5: |1 - 1.5 a_ii| is 0.5 at a_00 = 1, larger at the smallest a_ii (non-perron)
    assert np.min(np.diag(A)) < 1 / 3
    assert KINDS[int(dominance_kinds(eig_A, np.array([-1.5])))] == "non-perron"
    # a second token that attends only to itself: two λ^A = 1 tie, which is not perron-type
    A[3] = 0.0
    A[3, 3] = 1.0
    assert KINDS[int(dominance_kinds(np.diag(A).astype(complex), np.array([2.0])))] == "non-perron"


def test_a_decoder_audit_marks_its_causal_blocks_in_the_report() -> None:
    model = load_fixture("gpt2/optimum.onnx.xz")
    result = audit(model, random_inputs(model.inputs, batch=2, seq=6, vocab_size=128))
    assert [block.causal for block in result.blocks] == [True, True]
    report = render_report(result)
    assert "Causal blocks (0, 1): A is lower-triangular" in report
    encoder = load_fixture("bert/optimum.onnx.xz")
    inputs = random_inputs(encoder.inputs, batch=2, seq=6, vocab_size=128)
    assert "Causal blocks" not in render_report(audit(encoder, inputs))
