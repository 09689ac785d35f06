"""The audit's dominance step on real attention matrices: the certified path equals the dense one.

The attention probabilities of zoo models on their bundled inputs (restricted to the real tokens,
rows renormalised, as the audit does) with the heads' H spectra: every head must get the same kind
from :func:`oversmooth.simulator.perron.dominating_modes` as from the full spectra, with μ, λ^A and λ^H equal
to 1e-9, and most heads must be decided by the bound (else the fast path would not be used).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from numpy.testing import assert_allclose
from threadpoolctl import threadpool_limits

from oversmooth.importers.audit.cache import cached_value_spectra
from oversmooth.importers.audit.dominance import (
    DominanceProblem,
    dominance_problems,
    dominance_spectra,
    nonfinite_attention,
)
from oversmooth.importers.audit.session import audit_session
from oversmooth.importers.errors import UnsupportedModelError
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import default_inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.value_spectra import H_CHOICES, HChoice
from oversmooth.importers.weights import block_weights
from oversmooth.importers.zoo import file_sha256, lookup
from oversmooth.simulator.perron import dominating_modes
from oversmooth.simulator.theory import HEAD_KINDS, KINDS, contracting_heads, dominance_kinds
from oversmooth.simulator.tolerances import EIG_TOL, TIE_RTOL
from tests.realmodels import require_real_model

#: Inputs per model: enough heads for a fraction, few enough for the dense path's time.
ITEMS = {"dinov2-vits14": 2, "minilm-l6-int8": 8}
#: The share of heads the bound decides on these inputs (measured with the effective H: 62.5 % and
#: 90 %; with the stored H: 91 % and 90 %; MiniLM is post-LN, so both H are the same there).
MIN_CERTIFIED = 0.5


@functools.cache
def attention_problems(name: str, h: HChoice = "effective") -> list[DominanceProblem]:
    """The audit's (input, layer) problems of zoo model ``name`` on its first bundled inputs, with
    the ``h`` H (the audit's default: the effective one)."""
    path = require_real_model(name)
    graph = load_model(path)
    blocks = [block_weights(graph, block) for block in find_attention_blocks(graph).blocks]
    inputs = default_inputs(graph.inputs, lookup(name).entry)
    inputs = inputs.subset(range(min(ITEMS[name], inputs.batch_size)))
    session = audit_session(graph, blocks, inputs, provider="cpu", spectral=False)
    outputs = session.runner.collect(session.feeds, batch_size=inputs.batch_size)
    spectra = cached_value_spectra(blocks, file_sha256(path), use_cache=False)
    eig_H = dominance_spectra(blocks, spectra, "head", h)
    return dominance_problems(outputs, blocks, session.attention, inputs, 0, eig_H)


@pytest.mark.realmodel
@pytest.mark.parametrize("h", H_CHOICES)
@pytest.mark.parametrize("name", sorted(ITEMS))
def test_real_attention_gets_the_dense_kinds_and_modes(name: str, h: HChoice) -> None:
    """Certified or dense, the same cases; and the contracting class, decided from H alone, is
    never perron under Definition 4 on the full spectrum of A (every other head's kind is
    Definition 4's)."""
    certified = total = contracting = 0
    for problem in attention_problems(name, h):
        with threadpool_limits(limits=1, user_api="blas"):  # as in the audit: see model_spectra
            fast = dominating_modes(problem.attention(), problem.eig_H, min_order=1)
            dense = problem.cases(TIE_RTOL, certify=False)
            definition = dominance_kinds(np.linalg.eigvals(problem.attention()), problem.eig_H)
        assert [case.kind for case in dense] == [HEAD_KINDS[kind] for kind in fast.kinds]
        by_h = contracting_heads(problem.eig_H)
        assert (fast.kinds[by_h] == HEAD_KINDS.index("contracting")).all()
        assert (definition[by_h] != KINDS.index("perron")).all()
        np.testing.assert_array_equal(fast.kinds[~by_h], definition[~by_h])
        contracting += int(by_h.sum())
        for field, values in (("mu", fast.mu), ("lambda_a", fast.eig_A), ("lambda_h", fast.eig_H)):
            expected = [getattr(case, field) for case in dense]
            assert_allclose(values, expected, rtol=0, atol=EIG_TOL, err_msg=field)
        certified += int(fast.certified.sum())
        total += len(dense)
    assert certified >= MIN_CERTIFIED * total, f"{certified} of {total} certified"
    if (name, h) == ("dinov2-vits14", "effective"):
        assert contracting > 0  # the class is exercised on real heads


def test_the_audit_cases_are_those_of_the_problems() -> None:
    """Certified or dense, a problem's cases carry its item, layer, heads and token count."""
    real = (np.ones((4, 4)) - np.eye(4)) / 3  # eigenvalues 1 and -1/3 (three times)
    probs = np.full((2, 5, 5), 0.5)
    rows, columns = np.ix_([0, 1, 3, 4], [0, 1, 3, 4])  # token 2 is padding
    probs[:, rows, columns] = 2 * real
    mask = np.array([True, True, False, True, True])
    # head 0: 1 + 0.5 on top; head 1: |1 - 2.5 (-1/3)| = 1.83 > |1 - 2.5| = 1.5 beats the Perron
    # row (not contracting: |1 + λ^H| > 1).
    eig_H = np.array([[0.5, 0.0], [-2.5, 0.0]], dtype=complex)
    problem = DominanceProblem(3, 1, probs, mask, eig_H)
    assert_allclose(problem.attention(), np.stack([real, real]), atol=1e-15)
    assert dominating_modes(problem.attention(), eig_H, min_order=1).certified.tolist() == [
        True,
        False,
    ]
    for certify in (True, False):
        cases = problem.cases(TIE_RTOL, certify=certify)
        assert [(c.input, c.block, c.head, c.n_tokens) for c in cases] == [
            (3, 1, 0, 4),
            (3, 1, 1, 4),
        ]
        assert [c.kind for c in cases] == ["perron", "non-perron"]


def test_stacked_problems_come_back_per_problem_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Problems of three layers, two token counts and two H widths, stacks capped at 216
    attention entries: every stack is of one token count and one width, layers mix, runs are
    even, and the batch's cases equal each problem's own, in problem order."""
    from concurrent.futures import ThreadPoolExecutor

    from oversmooth.importers.audit import dominance

    rng = np.random.default_rng(5)
    n_tokens, heads = 6, 2
    problems = []
    for layer in range(3):
        width = 3 if layer < 2 else 4
        for item in range(5):
            mask = np.ones(n_tokens, dtype=bool)
            mask[n_tokens - item % 2 :] = False  # odd items: one padding token
            probs = rng.random((heads, n_tokens, n_tokens))
            eig_H = rng.normal(size=(heads, width)) + 0j
            problems.append(DominanceProblem(item, layer, probs, mask, eig_H))
    monkeypatch.setattr(dominance, "MAX_STACK_ELEMENTS", 3 * heads * n_tokens**2)
    groups = dominance.stacks(problems)
    for group in groups:
        assert len({(problems[i].n_tokens, problems[i].eig_H.shape) for i in group}) == 1
        n = problems[group[0]].n_tokens
        assert len(group) >= 1
        assert len(group) * heads * n * n <= dominance.MAX_STACK_ELEMENTS
    assert any(len({problems[i].layer for i in group}) > 1 for group in groups)
    lengths: dict[tuple[int, int], list[int]] = {}
    for group in groups:
        key = (problems[group[0]].n_tokens, problems[group[0]].eig_H.shape[1])
        lengths.setdefault(key, []).append(len(group))
    assert lengths == {(6, 3): [3, 3], (5, 3): [4], (6, 4): [3], (5, 4): [2]}  # even runs
    assert sorted(i for group in groups for i in group) == list(range(len(problems)))
    with ThreadPoolExecutor(max_workers=2) as pool:
        cases = dominance.PendingCases(problems, TIE_RTOL, pool).result()
    assert cases == [case for problem in problems for case in problem.cases(TIE_RTOL)]


class _BusyPool(Executor):
    """A pool whose threads are all busy for good: what it is given never starts."""

    def __init__(self) -> None:
        self.submitted: list[Future[Any]] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        future: Future[Any] = Future()
        self.submitted.append(future)
        return future


def _within(seconds: float, run: Callable[[], Any]) -> list[Any]:
    """``[run()]`` from a daemon thread, or [] if it has not returned within ``seconds`` (a
    deadlock fails the test instead of hanging the run)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(run()), daemon=True)
    thread.start()
    thread.join(seconds)
    return out


def test_spreading_parts_cannot_deadlock_and_returns_them_in_order() -> None:
    """With every thread of the pool busy, the caller solves every part itself, in order; a
    part's error is raised, whether the caller's own first part or a later one, and the parts
    not yet started are cancelled."""
    from oversmooth.importers.audit.dominance import spread_over

    parts = [slice(k, k + 1) for k in range(6)]
    busy = _BusyPool()
    spread = spread_over(busy)
    order: list[int] = []

    def solve(part: slice) -> int:
        order.append(part.start)
        return part.start * 10

    assert _within(30, lambda: spread(solve, parts)) == [[0, 10, 20, 30, 40, 50]]
    assert order == [0, 1, 2, 3, 4, 5]
    assert all(future.cancelled() for future in busy.submitted)
    assert spread(solve, []) == []
    for bad in (0, 4):

        def failing(part: slice, bad: int = bad) -> int:
            if part.start == bad:
                raise ValueError(f"part {bad}")
            return part.start

        fresh = _BusyPool()
        with pytest.raises(ValueError, match=f"part {bad}"):
            spread_over(fresh)(failing, parts)
        assert all(future.cancelled() for future in fresh.submitted)


def test_dense_parts_spread_over_threads_give_the_one_call_answer() -> None:
    """dominating_modes with its undecided heads in four parts on a pool of three threads (the
    caller one of them) returns the one-call answer, byte for byte."""
    from concurrent.futures import ThreadPoolExecutor

    from oversmooth.importers.audit.dominance import spread_over
    from oversmooth.simulator import spectra

    A = spectra.attention_general(40, batch=(9,), rng=11)
    eig_H = np.tile(np.array([-1.7, 0.3, -0.2 + 0.5j, -0.2 - 0.5j]), (9, 1))
    whole = dominating_modes(A, eig_H, certify=False)
    with ThreadPoolExecutor(max_workers=3) as pool:
        parted = pool.submit(
            dominating_modes,
            A,
            eig_H,
            certify=False,
            dense_parts=4,
            dense_map=spread_over(pool),
        ).result(timeout=60)
    for name in ("kinds", "mu", "eig_A", "eig_H", "certified"):
        assert getattr(parted, name).tobytes() == getattr(whole, name).tobytes(), name


def test_only_stacks_certified_on_a_device_spread_their_dense_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Plumbing check (what PendingCases asks of stacked_cases, not what it computes): a stack
    on a device of certifiable order solves its undecided heads in one part per thread, spread
    over the pool; host stacks and device stacks too small to certify, in one part."""
    from concurrent.futures import ThreadPoolExecutor

    from oversmooth.importers.audit import dominance

    class OnDevice:  # stands for a device array in the stacking
        __dlpack_device__ = None

    asked: list[tuple[int, int, bool]] = []

    def stacked(problems, tie_rtol, **options):  # type: ignore[no-untyped-def]
        asked.append((problems[0].n_tokens, options["dense_parts"], options["dense_map"] is map))
        return [[] for _ in problems]

    monkeypatch.setattr(dominance, "stacked_cases", stacked)
    eig_H = np.zeros((2, 3), dtype=complex)
    long, short = np.ones(40, dtype=bool), np.ones(8, dtype=bool)
    problems = [
        DominanceProblem(0, 0, OnDevice(), long, eig_H),
        DominanceProblem(0, 1, OnDevice(), short, eig_H),
        DominanceProblem(0, 2, np.zeros((2, 40, 40)), long, np.zeros((2, 4), dtype=complex)),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        dominance.PendingCases(problems, TIE_RTOL, pool, parallel=5).result()
    assert sorted(asked) == [(8, 1, True), (40, 1, True), (40, 5, False)]


@pytest.mark.parametrize("shape", [(8, 2, 4, 4), (16, 4, 4)])
def test_attention_of_another_leading_size_than_the_inputs_is_refused_naming_the_block(
    shape: tuple[int, ...],
) -> None:
    """Probabilities of 8 (heads, t, t) stacks for 2 inputs (windows folded into the leading
    axis) are never indexed as inputs: a one-line importer error names the block, in the
    finiteness check and in the dominance step alike."""
    block = SimpleNamespace(index=3, softmax="attn/Softmax", n_heads=2)
    inputs = Inputs(feeds={"x": np.zeros((2, 16, 8), np.float32)}, labels=("a", "b"), source="t")
    probs = np.full(shape, 0.25)
    eig_H = [np.zeros((2, 3), complex)]
    expected = r"block 3's attention probabilities 'p' \(Softmax 'attn/Softmax'\) hold 8 "
    with pytest.raises(UnsupportedModelError, match=expected) as info:
        dominance_problems({"p": probs}, [block], ["p"], inputs, 0, eig_H)  # type: ignore[list-item]
    assert "\n" not in str(info.value)
    with pytest.raises(UnsupportedModelError, match=expected):
        nonfinite_attention(probs, "p", 2, inputs, block=block)  # type: ignore[arg-type]
