"""A batch's host work on a thread pool, and every batch's overlapped with inference.

Split from :mod:`oversmooth.importers.audit.session` (the session, its layers and reductions).

Public API
----------
OperatorPlan
    What the exact layer dominance needs: every block's head factors, the inputs it runs on.
Cases
    A batch's cases of every kind.
batch_work
    One batch's host work (its metrics, its dominance cases) started on a thread pool.
HELD_ATTENTION_SHARE, held_attention_limit
    How much device attention finished batches' dominance cases may keep while the next batches
    run.
pipelined
    Every batch's host work, overlapped with inference.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from threadpoolctl import threadpool_limits

from oversmooth.importers.audit.depth import head_cases
from oversmooth.importers.audit.dominance import PendingCases, dominance_problems
from oversmooth.importers.audit.dominance_inputs import DominanceBudget, HeldCases
from oversmooth.importers.audit.layers import computed_layers, measure_layers
from oversmooth.importers.audit.operating_step import (
    AttributionCase,
    OperatingCase,
    OperatingPlan,
    sublayer_cases,
)
from oversmooth.importers.audit.operator_step import OperatorCase, operator_cases
from oversmooth.importers.audit.records import DominanceCase, HeadCase
from oversmooth.importers.audit.session import (
    LOOKAHEAD_BATCHES,
    AuditSession,
    check_finite_outputs,
)
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import AttentionBlock
from oversmooth.importers.runtime.cuda import device_free_memory
from oversmooth.simulator.backend import on_host
from oversmooth.simulator.operator import HeadFactors

__all__ = [
    "HELD_ATTENTION_SHARE",
    "Cases",
    "OperatorPlan",
    "batch_work",
    "held_attention_limit",
    "pipelined",
]

#: The share of a GPU's free memory (when the audit starts) that the attention of finished
#: batches may keep while their dominance cases are computed and later batches run
#: (:func:`held_attention_limit`). DINOv2 at batch 64 keeps 1.2 GB a batch, so about 16 batches
#: on an 80 GB H100 that nothing else uses.
HELD_ATTENTION_SHARE = 0.25


@dataclass(frozen=True)
class OperatorPlan:
    """What the exact layer dominance needs: every block's head factors, and the inputs it runs on
    (those numbered below ``inputs``)."""

    factors: tuple[HeadFactors, ...]
    inputs: int


#: A batch's cases: per (input, block, head), per (input, block) of the whole operator, per
#: (input, block, head) of the depth step, and the operating point's and attribution's.
Cases = tuple[
    list[DominanceCase],
    list[OperatorCase],
    list[HeadCase],
    tuple[list[OperatingCase], list[AttributionCase]],
]


class _BatchWork:
    """The host work of one batch running on a thread pool: metrics, dominance and operator cases.

    ``held_bytes``: the device memory of the attention its dominance cases read, where that
    attention is on a device (it then lives as long as the cases hold it, and :meth:`detach`
    lets them finish after the batch); None where it is in host buffers the runner reuses.
    """

    def __init__(
        self,
        metrics: Sequence[Future[int]],
        dominance: HeldCases | None,
        operator: Future[list[OperatorCase]] | None = None,
        heads: Sequence[Future[list[HeadCase]]] = (),
        sublayer: Sequence[Future[tuple[list[OperatingCase], list[AttributionCase]]]] = (),
        held_bytes: int | None = None,
    ) -> None:
        self._metrics = metrics
        self._dominance = dominance
        self._operator = operator
        self._heads = heads
        self._sublayer = sublayer
        self._held_bytes = held_bytes

    def detach(self) -> tuple[HeldCases, int] | None:
        """The dominance cases and the device bytes they hold, no longer part of :meth:`result`
        (which then returns none); None where they cannot outlive the batch (host attention)
        or there are none."""
        if self._dominance is None or self._held_bytes is None:
            return None
        dominance, self._dominance = self._dominance, None
        return dominance, self._held_bytes

    def result(self) -> Cases:
        for group in self._metrics:  # in depth order: the first layer's error is the one raised
            group.result()
        cases = self._dominance.result() if self._dominance is not None else []
        exact = self._operator.result() if self._operator is not None else []
        points, split = [], []
        for future in self._sublayer:
            operating, attribution = future.result()
            points += operating
            split += attribution
        depth = [case for future in self._heads for case in future.result()]
        return cases, exact, depth, (points, split)

    def cancel(self) -> None:
        for group in self._metrics:
            group.cancel()
        if self._dominance is not None:
            self._dominance.cancel()
        for future in (self._operator, *self._heads, *self._sublayer):
            if future is not None:
                future.cancel()


def _device_bytes(arrays: Sequence[Any]) -> int | None:
    """The bytes of ``arrays`` when every one is on a device, else None."""
    if any(on_host(array) for array in arrays):
        return None
    return sum(int(array.nbytes) for array in arrays)


def held_attention_limit(session: AuditSession) -> int:
    """The bytes of device attention that finished batches' dominance cases may hold while the
    next batches run: :data:`HELD_ATTENTION_SHARE` of the GPU's free memory where the attention
    stays there (:attr:`Runner.on_device`), else 0."""
    if not session.attention or not set(session.attention) <= session.runner.on_device:
        return 0
    free = device_free_memory()
    return int(HELD_ATTENTION_SHARE * free) if free else 0


def batch_work(
    session: AuditSession,
    blocks: Sequence[AttentionBlock],
    eig_H: Sequence[np.ndarray],
    tie_rtol: float,
    per_input: dict[str, np.ndarray],
    operator: OperatorPlan | None,
    pool: ThreadPoolExecutor,
    batch: Inputs,
    start: int,
    outputs: dict[str, np.ndarray],
    *,
    stream: dict[str, np.ndarray] | None = None,
    depth_inputs: int = 0,
    sublayer: OperatingPlan | None = None,
    budget: DominanceBudget | None = None,
) -> _BatchWork:
    """Start a batch's host work: its layer metrics (into ``per_input``, the depth step's stream
    terms into ``stream``), its dominance cases, the operator cases of its inputs below
    ``operator.inputs``, the depth step's head cases of those below ``depth_inputs`` and the
    operating point's and attribution's of those below ``sublayer.inputs``, once its outputs are
    checked finite (:func:`check_finite_outputs`); the dominance cases only of the inputs
    ``budget`` still wants (:class:`~oversmooth.importers.audit.dominance_inputs.DominanceBudget`)."""
    check_finite_outputs(session, blocks, outputs, batch, start)
    # On the host a task per layer spreads a batch's Gram spectra over every worker thread; on
    # the GPU one task solves every layer's at once (a kernel per step for the whole stack).
    layers = computed_layers(session.plan)
    groups = (
        [layers]
        if layers and session.plan.grams_on_device(outputs)
        else [[layer] for layer in layers]
    )
    metrics = [
        pool.submit(
            measure_layers,
            outputs,
            session.plan,
            start,
            per_input,
            batch.labels,
            batch.token_mask,
            stream,
            group,
        )
        for group in groups
    ]
    if not session.attention:
        return _BatchWork(metrics, None)
    problems = dominance_problems(outputs, blocks, session.attention, batch, start, eig_H)
    exact = None
    if operator is not None and start < operator.inputs:
        exact = pool.submit(operator_cases, problems, operator.factors, tie_rtol, operator.inputs)
    # a task per (input, block) of the depth step and of the attribution: each is a few dense
    # eigensolves or products per head (DINOv2's depth step: 6 eigensolves of order 256 per
    # block, about 0.15 s of CPU on an H200's host), which one task would do one after another
    heads = [
        pool.submit(head_cases, [problem], depth_inputs)
        for problem in problems
        if problem.item < depth_inputs
    ]
    parts = [
        pool.submit(sublayer_cases, [problem], outputs, sublayer, start)
        for problem in problems
        if sublayer is not None and problem.item < sublayer.inputs
    ]
    dominance = HeldCases(
        problems,
        functools.partial(
            PendingCases,
            tie_rtol=tie_rtol,
            pool=pool,
            to_host=session.copies,
            parallel=session.threads,
        ),
        budget,
        start,
        start + batch.batch_size,
    )
    held = _device_bytes([outputs[name] for name in session.attention])
    return _BatchWork(metrics, dominance, exact, heads, parts, held)


_T = TypeVar("_T")


def _wait(result: Callable[[], _T]) -> _T:
    """``result()``: the one place the pipeline's thread waits for host work (a batch's metrics
    and cases, or dominance cases it can no longer leave running); the benchmarks' stage
    "waiting for a batch" times it."""
    return result()


class _Collected:
    """The cases of the batches collected so far, in batch order, and the dominance cases still
    being computed on device attention (oldest first), which the next batches need not wait for.

    Parameters
    ----------
    held_limit : int
        The device bytes those cases may hold at once; past it the oldest are waited for.
    """

    def __init__(self, held_limit: int) -> None:
        self.cases: list[DominanceCase] = []
        self.exact: list[OperatorCase] = []
        self.heads: list[HeadCase] = []
        self.operating: list[OperatingCase] = []
        self.parts: list[AttributionCase] = []
        self._held: deque[tuple[HeldCases, int]] = deque()
        self._held_bytes = 0
        self._held_limit = held_limit

    def add(self, work: _BatchWork) -> None:
        """Wait for a batch's work, except dominance cases that may go on
        (:meth:`_BatchWork.detach`); :meth:`settle` takes those in."""
        later = work.detach()
        per_head, whole, depth, (points, split) = _wait(work.result)
        self.exact.extend(whole)
        self.heads.extend(depth)
        self.operating.extend(points)
        self.parts.extend(split)
        if later is None:
            self.settle(everything=True)  # the batch order of the cases
            self.cases.extend(per_head)
        else:
            self._held.append(later)
            self._held_bytes += later[1]

    def settle(self, everything: bool = False) -> None:
        """Take in the held dominance cases in batch order: those finished (which tells the budget
        their cases), and, waiting, the oldest while more than the limit is held (every one with
        ``everything``)."""
        while self._held:
            dominance, size = self._held[0]
            if everything or self._held_bytes > self._held_limit:
                cases = _wait(dominance.result)
            elif dominance.advance():
                cases = dominance.result()  # nothing left to wait for
            else:
                return
            self.cases.extend(cases)
            self._held.popleft()
            self._held_bytes -= size

    def cancel(self) -> None:
        for dominance, _ in self._held:
            dominance.cancel()

    def result(self) -> Cases:
        return self.cases, self.exact, self.heads, (self.operating, self.parts)


def pipelined(
    batches: Iterator[tuple[Inputs, dict[str, np.ndarray]]],
    measure: Callable[[ThreadPoolExecutor, Inputs, int, dict[str, np.ndarray]], _BatchWork],
    threads: int,
    held_limit: int = 0,
) -> Cases:
    """Run every batch's host work on worker threads while onnxruntime runs the next batches.

    At most :data:`LOOKAHEAD_BATCHES` batches' work is pending when the next one is started, so
    memory stays bounded; the cases come back in batch order (a batch's dominance budget, if
    any, is told its cases as they are taken in, in that order). Dominance cases that read
    attention on a device (:meth:`_BatchWork.detach`) may go on while later batches run, up to
    ``held_limit`` bytes of that attention (:func:`held_attention_limit`); they are taken in as
    they finish, checked after every batch. Many small eigenvalue problems: one BLAS thread
    each, ``threads`` worker threads, one per core (this also avoids the collapse of
    multithreaded BLAS on a busy machine, 5-20x measured on 2 cores). On an error or Ctrl-C the
    work not yet started is cancelled.
    """
    pending: deque[_BatchWork] = deque()
    collected = _Collected(held_limit)
    start = 0
    with threadpool_limits(limits=1, user_api="blas"):
        pool = ThreadPoolExecutor(max_workers=threads)
        try:
            for batch, outputs in batches:
                pending.append(measure(pool, batch, start, outputs))
                start += batch.batch_size
                while len(pending) > LOOKAHEAD_BATCHES:
                    collected.add(pending.popleft())
                collected.settle()
            while pending:
                collected.add(pending.popleft())
            collected.settle(everything=True)
        finally:
            for work in pending:
                work.cancel()
            collected.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
    return collected.result()
