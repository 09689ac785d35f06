"""The audit's device path: large outputs stay where the model ran, small records come back.

On the CPU the device path is the host path (NumPy arrays, the same calls): these tests check what
it hands to the host — only the attention matrices of the heads the perron certificate leaves
undecided — by counting the bytes. Where CUDA and CuPy work (marker ``cuda``), the same code runs
on CuPy arrays: the runner's outputs stay on the GPU, the certificate and the Gram eigenvalues run
there, and the answers are the host path's (same kinds, μ to EIG_TOL, metrics to GRAM_RTOL).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.importers.audit.dominance import DominanceProblem, stacked_cases
from oversmooth.importers.audit.session import audit_session, layer_tensors
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.reductions import plan_reductions
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import block_weights
from oversmooth.simulator.backend import HostCopies, on_host
from oversmooth.simulator.metrics import METRICS
from oversmooth.simulator.perron import dominating_modes
from oversmooth.simulator.statistics import (
    SPECTRAL_METRICS,
    TokenStatistics,
    gram_eigenvalues,
    metrics_from_statistics,
    redo_unconverged,
    unconverged,
)
from oversmooth.simulator.theory import HEAD_KINDS
from oversmooth.simulator.tolerances import EIG_TOL, GRAM_ATOL, GRAM_RTOL, TIE_RTOL
from tests.importers.audit.test_dominance import attention_problems
from tests.importers.audited import builder_model_and_inputs
from tests.importers.runtime.device_helpers import cupy_or_skip

SEED = 0


def _two_heads(n: int = 40) -> DominanceProblem:
    """One (input, layer) of two heads on n real tokens of n + 1 (token 2 is padding), large
    enough to be certified (CERTIFY_MIN_ORDER): head 0 is certified perron, head 1 is not (its
    H makes the Perron row lose: |1 − 2.02·(−1/(n−1))| > |1 − 2.02| > 1, so it is not contracting
    either), so it takes the dense path."""
    real = (np.ones((n, n)) - np.eye(n)) / (n - 1)  # eigenvalues 1 and -1/(n-1)
    keep = [i for i in range(n + 1) if i != 2]
    probs = np.full((2, n + 1, n + 1), 0.5)
    probs[:, *np.ix_(keep, keep)] = 2 * real
    mask = np.isin(np.arange(n + 1), keep)
    eig_H = np.array([[0.5, 0.0], [-2.02, 0.0]], dtype=complex)
    return DominanceProblem(0, 0, probs, mask, eig_H)


def test_only_the_undecided_heads_attention_is_handed_to_the_host() -> None:
    problem = _two_heads()
    copies = HostCopies()
    cases = stacked_cases([problem, problem], TIE_RTOL, to_host=copies)
    assert [c.kind for case in cases for c in case] == ["perron", "non-perron"] * 2
    # head 1 of each problem: one (2, 40, 40) float64 stack of the two undecided heads
    assert (copies.bytes, copies.arrays, copies.device_bytes) == (2 * 40 * 40 * 8, 1, 0)


def test_a_contracting_head_hands_nothing_to_the_host() -> None:
    """Decided from H alone (|1 − 1.5| < 1 beside the null-space 0): no spectrum, no copy."""
    problem = _two_heads()
    contracting = DominanceProblem(
        0, 0, problem.probs, problem.token_mask, np.array([[0.5, 0.0], [-1.5, 0.0]], dtype=complex)
    )
    copies = HostCopies()
    (cases,) = stacked_cases([contracting], TIE_RTOL, to_host=copies)
    assert [c.kind for c in cases] == ["perron", "contracting"]
    assert (copies.bytes, copies.arrays) == (0, 0)


def test_a_batch_that_needs_no_dense_spectrum_hands_nothing_to_the_host() -> None:
    problem = _two_heads()
    perron_only = DominanceProblem(0, 0, problem.probs[:1], problem.token_mask, problem.eig_H[:1])
    copies = HostCopies()
    stacked_cases([perron_only] * 3, TIE_RTOL, to_host=copies)
    assert copies.bytes == 0
    assert copies.arrays == 0


@pytest.mark.realmodel
def test_real_attention_hands_only_the_uncertified_heads_to_the_host() -> None:
    problems = attention_problems("dinov2-vits14")
    copies = HostCopies()
    cases = [case for group in stacked_cases(problems, TIE_RTOL, to_host=copies) for case in group]
    modes = [dominating_modes(p.attention(), p.eig_H) for p in problems]
    contracting = HEAD_KINDS.index("contracting")
    uncertified = sum(int((~m.certified & (m.kinds != contracting)).sum()) for m in modes)
    n = problems[0].n_tokens
    assert copies.bytes == uncertified * n * n * 8
    # With the effective H, a third of DINOv2's heads here are non-perron or undecided (54 of 144),
    # and the contracting ones among them never leave the device.
    assert sum(int((m.kinds == contracting).sum()) for m in modes) > 0
    assert 0 < uncertified < 0.5 * len(cases), f"{uncertified} of {len(cases)} heads uncertified"


def test_the_cpu_session_keeps_nothing_on_a_device() -> None:
    model, inputs = builder_model_and_inputs("bert_legacy")
    blocks = [block_weights(model, b) for b in find_attention_blocks(model).blocks]
    session = audit_session(model, blocks, inputs, provider="cpu")
    assert session.runner.on_device == frozenset()
    assert session.runner.provenance()["kept_on_device"] == []
    for outputs in session.runner.run(session.feeds):
        assert all(isinstance(array, np.ndarray) for array in outputs.values())


# --- where CUDA and CuPy work ------------------------------------------------------------------


@pytest.mark.cuda
def test_the_runner_yields_device_outputs_equal_to_the_host_copies() -> None:
    cupy = cupy_or_skip()
    model, inputs = builder_model_and_inputs("bert_legacy")
    blocks = find_attention_blocks(model).blocks
    layers = layer_tensors(blocks)
    plan = plan_reductions(model, layers, masked=True)
    feeds = {**inputs.feeds, **plan.mask_feed(inputs.token_mask)}
    kept = [blocks[0].attention_name, plan.gram_name(0)]
    options = {"expose": [blocks[0].attention_name], "extension": plan.extension}
    on_gpu = Runner(model, provider="cuda", device_outputs=kept, **options)
    on_host = Runner(model, provider="cuda", **options)
    assert on_gpu.on_device == frozenset(kept)
    for reuse in (0, 1):
        gpu = next(on_gpu.run(feeds, reuse_outputs=reuse))
        host = next(on_host.run(feeds, reuse_outputs=reuse))
        for name, array in gpu.items():
            if name in kept:
                assert isinstance(array, cupy.ndarray), name
                array = cupy.asnumpy(array)
            else:
                assert isinstance(array, np.ndarray), name
            np.testing.assert_array_equal(array, host[name], err_msg=name)


@pytest.mark.cuda
@pytest.mark.realmodel
def test_the_certificate_on_the_gpu_gives_the_host_answers() -> None:
    cupy = cupy_or_skip()
    problems = attention_problems("dinov2-vits14")
    on_device = [
        DominanceProblem(p.item, p.layer, cupy.asarray(p.probs), p.token_mask, p.eig_H)
        for p in problems
    ]
    copies = HostCopies()
    gpu = [case for group in stacked_cases(on_device, TIE_RTOL, to_host=copies) for case in group]
    host = [case for group in stacked_cases(problems, TIE_RTOL) for case in group]
    assert [case.kind for case in gpu] == [case.kind for case in host]
    assert_allclose([c.mu for c in gpu], [c.mu for c in host], rtol=0, atol=EIG_TOL)
    A = cupy.concatenate([p.attention() for p in on_device])
    modes = dominating_modes(A, np.concatenate([p.eig_H for p in problems]))
    assert [HEAD_KINDS[kind] for kind in modes.kinds] == [case.kind for case in host]
    n = problems[0].n_tokens
    dense = ~modes.certified & (modes.kinds != HEAD_KINDS.index("contracting"))
    assert copies.device_bytes == copies.bytes == int(dense.sum()) * n * n * 8
    assert copies.bytes < 0.5 * len(gpu) * n * n * 8
    # as the audit runs them: stacked by memory, the undecided heads in four parts on four threads
    from concurrent.futures import ThreadPoolExecutor

    from oversmooth.importers.audit.dominance import PendingCases

    spread = HostCopies()
    with ThreadPoolExecutor(max_workers=4) as pool:
        pending = PendingCases(on_device, TIE_RTOL, pool, to_host=spread, parallel=4)
        audit = pending.result()
    assert [case.kind for case in audit] == [case.kind for case in host]
    assert_allclose([c.mu for c in audit], [c.mu for c in host], rtol=0, atol=EIG_TOL)
    assert spread.bytes == copies.bytes


@pytest.mark.cuda
def test_gram_eigenvalues_on_the_gpu_give_the_host_metrics() -> None:
    cupy = cupy_or_skip()
    X = np.random.default_rng(3).normal(size=(16, 257, 64)) @ np.diag(np.geomspace(1, 1e-3, 64))
    gram = X @ np.swapaxes(X, -1, -2)
    on_gpu = gram_eigenvalues(cupy.asarray(gram))
    on_cpu = gram_eigenvalues(gram)
    assert isinstance(on_gpu, np.ndarray)
    assert on_gpu.dtype == np.float64
    scalars = np.full((16, 8), 2.0)  # the scalar statistics do not enter the spectral metrics
    names = [name for name in METRICS if name in SPECTRAL_METRICS]
    gpu = metrics_from_statistics(TokenStatistics.from_packed(scalars, on_gpu), names)
    cpu = metrics_from_statistics(TokenStatistics.from_packed(scalars, on_cpu), names)
    for name in names:
        assert_allclose(gpu[name], cpu[name], rtol=GRAM_RTOL, atol=GRAM_ATOL, err_msg=name)


@pytest.mark.cuda
def test_a_device_spectrum_that_fails_the_frobenius_check_is_redone_on_the_host() -> None:
    """CuPy's batched solver reports no failure unless asked: a spectrum that fails the check
    (here the diagonal, as a run stopped before any sweep returns) is recomputed by LAPACK."""
    cupy = cupy_or_skip()
    X = np.random.default_rng(4).normal(size=(3, 257, 64))
    gram = X @ np.swapaxes(X, -1, -2)
    on_device = cupy.asarray(gram)
    eig = cupy.linalg.eigvalsh(on_device)
    eig[1] = cupy.sort(cupy.diagonal(on_device[1]))
    assert unconverged(on_device, eig).tolist() == [False, True, False]
    redone = redo_unconverged(on_device, eig)
    np.testing.assert_array_equal(redone[1], np.linalg.eigvalsh(gram[1]))
    np.testing.assert_array_equal(redone[[0, 2]], cupy.asnumpy(eig[[0, 2]]))


class _OnDevice:
    """Stands for a device array in the stacking (which reads only where the array lives)."""

    __dlpack_device__ = None


def test_device_problems_stack_by_memory_alone() -> None:
    """Host and device problems stack by memory alone, each within its own limit (one stack
    here; the device's holds 2^27 entries, 64 times the host's): a device stack is not cut for
    the threads, whose share is the undecided heads' dense spectra (spread_over)."""
    from oversmooth.importers.audit.dominance import stacks

    mask = np.ones(40, dtype=bool)
    eig_H = np.zeros((6, 3), dtype=complex)
    host = [DominanceProblem(i, 0, np.zeros((6, 40, 40)), mask, eig_H) for i in range(10)]
    device = [DominanceProblem(i, 0, _OnDevice(), mask, eig_H) for i in range(10)]
    assert not on_host(device[0].probs)
    assert stacks(host) == [list(range(10))]
    assert stacks(device) == [list(range(10))]
    wide = np.zeros((6, 40, 40))
    many_host = [DominanceProblem(i, 0, wide, mask, eig_H) for i in range(300)]
    many_device = [DominanceProblem(i, 0, _OnDevice(), mask, eig_H) for i in range(300)]
    # 2^21 // (6 · 40²) = 218 problems per host stack: two stacks, of equal length
    assert [len(stack) for stack in stacks(many_host)] == [150, 150]
    assert stacks(many_device) == [list(range(300))]
