"""The audit's dominance step: the dominating eigenvalue of ``I + H_h ⊗ A`` per (input, block, head).

A is a head's attention matrix restricted to the real tokens (rows renormalised), H_h the head's
value spectrum (see :mod:`oversmooth.importers.audit.pipeline`, "Dominance counting"). Most cases are decided
without the spectrum of A: :func:`oversmooth.simulator.perron.dominating_modes` certifies perron kind from a
bound on A's non-Perron eigenvalues and computes the full spectra only of the heads it cannot
decide; its answer is the dense path's (same kind, μ, λ^A, λ^H to round-off).

Public API
----------
dominance_spectra
    Per block, the (n_heads, k) H eigenvalues the dominance step uses, from the value spectra.
DominanceProblem, dominance_problems
    The heads of one (input, layer), and all of one batch of onnxruntime outputs.
nonfinite_attention
    Which inputs' attention probabilities hold NaN or infinities on their real tokens.
per_input_attention
    A block's probabilities as (batch, heads, T, T), refused unless one stack per input.
stacks, stacked_cases
    Problems of one token count and H width, solved in one stacked call.
PendingCases
    The cases of one batch's problems, started on a thread pool and collected later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from oversmooth.importers.audit.records import DominanceCase
from oversmooth.importers.errors import ImporterInputError, UnsupportedModelError
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import AttentionBlock
from oversmooth.importers.value_spectra import BlockSpectra, HChoice
from oversmooth.importers.weights import BlockWeights
from oversmooth.simulator.backend import array_module, on_host, to_numpy
from oversmooth.simulator.perron import CERTIFY_MIN_ORDER, DenseMap, dominating_modes
from oversmooth.simulator.theory import HEAD_KINDS

__all__ = [
    "MAX_DEVICE_STACK_ELEMENTS",
    "MAX_STACK_ELEMENTS",
    "DominanceProblem",
    "PendingCases",
    "attention_by_head",
    "dominance_problems",
    "dominance_spectra",
    "nonfinite_attention",
    "per_input_attention",
    "spread_over",
    "stacked_cases",
    "stacks",
]

#: Attention entries (float64) of one stack at most: 2^21 (16 MiB), e.g. 31 heads of 257 tokens.
#: The certificate holds about three such arrays per stack, one stack per worker thread.
MAX_STACK_ELEMENTS = 2**21
#: The same for attention held on a device (GPU): 2^27 entries (1 GiB of float64), e.g. 2,032
#: heads of 257 tokens: each of the certificate's passes is one kernel over the whole stack.
MAX_DEVICE_STACK_ELEMENTS = 2**27


def dominance_spectra(
    blocks: Sequence[BlockWeights],
    spectra: Sequence[BlockSpectra],
    granularity: str,
    h: HChoice,
) -> list[np.ndarray]:
    """Per block a (n_heads, k) array of H eigenvalues used for dominance.

    ``granularity`` is ``"layer"`` or ``"head"``. ``"head"``: the d_head eigenvalues of head h's
    product plus the zero eigenvalue of the rank-deficient d×d product (when
    ``d_model > d_head``); ``"layer"``: the d eigenvalues of the whole-layer product for every
    head. ``h`` (:data:`~oversmooth.importers.value_spectra.H_CHOICES`) picks the effective or the stored H.
    """
    values = []
    for block, spectrum in zip(blocks, spectra, strict=True):
        if granularity == "layer":
            eig = np.tile(spectrum.whole_layer(h=h), (block.n_heads, 1))
        else:
            eig = spectrum.heads(h=h)
            if block.d_model > block.d_head:  # the d×d product also has the eigenvalue 0
                eig = np.concatenate([eig, np.zeros((block.n_heads, 1))], axis=1)
        values.append(eig)
    return values


def _token_masks(inputs: Inputs, batch: int, n_tokens: int) -> np.ndarray:
    # Images have no mask (every position is real); a text mask must match the token axis exactly.
    return inputs.token_mask_for(n_tokens)[:batch]


def attention_by_head(array: Any, name: str, n_heads: int) -> Any:
    """A block's Softmax output ``name`` as (batch, n_heads, T, T) probabilities (a view, in the
    array's own library: NumPy, or CuPy for probabilities kept on the GPU).

    (batch · n_heads, T, T) probabilities are split batch-major; any other shape is refused.

    Exports that compute the scores as a batched product of 3-D tensors (XGLM's) merge batch
    and heads as a row-major reshape of (batch, heads) does: row ``b · n_heads + h`` is head h of
    input b (checked against transformers' own attention weights for XGLM).
    """
    if array.ndim == 3 and array.shape[0] % n_heads == 0:
        array = array.reshape(-1, n_heads, *array.shape[1:])
    if array.ndim != 4 or array.shape[1] != n_heads or array.shape[2] != array.shape[3]:
        raise ImporterInputError(
            f"attention probabilities {name!r} must have shape (batch, {n_heads}, T, T); got {array.shape}"
        )
    return array


def per_input_attention(
    array: Any, name: str, n_heads: int, inputs: Inputs, block: AttentionBlock | None = None
) -> Any:
    """:func:`attention_by_head` of ``array``, checked to hold one (n_heads, T, T) stack per
    input of ``inputs``: per-input data (token masks, item numbers) is never indexed with another
    axis.

    Raises
    ------
    UnsupportedModelError
        The leading size is not the inputs' count (say n·B: attention computed within n windows
        folded into the leading axis), naming ``block`` when given.
    """
    probs = attention_by_head(array, name, n_heads)
    if len(probs) != inputs.batch_size:
        where = f"attention probabilities {name!r}"
        if block is not None:
            where = f"block {block.index}'s {where} (Softmax {block.softmax!r})"
        raise UnsupportedModelError(
            f"{where} hold {len(probs)} ({n_heads}, T, T) stacks for {inputs.batch_size} inputs "
            f"(shape {tuple(array.shape)}): the attention is not computed once per input over "
            f"all its tokens (windows folded into its leading axis?), and the audit reads one "
            f"attention matrix per input and head"
        )
    return probs


def nonfinite_attention(
    array: Any, name: str, n_heads: int, inputs: Inputs, *, block: AttentionBlock | None = None
) -> np.ndarray:
    """(batch,) bool: which inputs' attention probabilities ``array`` (a block's Softmax output)
    hold a NaN or an infinity among their real tokens' rows and columns (what the dominance step
    reads; padding is never read). Probabilities lie in [0, 1], so a sum is finite exactly when
    every term is: nothing as large as the probabilities is allocated. The sum is taken in the
    probabilities' own precision, at least float32's (half the time of float64's on DINOv2): a
    sum of N terms in [0, 1] stays below N, far from float32's overflow. Device probabilities are
    summed on their device; only the (batch,) answer comes to the host. Probabilities of another
    leading size than the inputs' count are refused (:func:`per_input_attention`)."""
    probs = per_input_attention(array, name, n_heads, inputs, block)
    xp = array_module(probs)
    masks = _token_masks(inputs, probs.shape[0], probs.shape[-1])
    accumulate = np.promote_types(probs.dtype, np.float32)
    if masks.all():
        return ~to_numpy(xp.isfinite(probs.reshape(len(probs), -1).sum(axis=1, dtype=accumulate)))
    # Every input's real-token indices go to the device in one copy and the per-input sums come
    # back in one: on a GPU a copy each way per block, not one per input (a host-to-device copy
    # waits for the stream's earlier work; 384 per batch of 64 for a six-block text model).
    keep = [np.flatnonzero(mask) for mask in masks]
    bounds = np.cumsum([0, *map(len, keep)])
    indices = xp.asarray(np.concatenate(keep))
    sums = []
    for b in range(len(probs)):
        real = indices[bounds[b] : bounds[b + 1]]
        sums.append(probs[b][:, real[:, None], real].sum(dtype=accumulate))
    return ~to_numpy(xp.isfinite(xp.stack(sums)))


@dataclass(frozen=True)
class DominanceProblem:
    """The heads of one (input, layer): attention probabilities and the H spectra they meet.

    Attributes
    ----------
    item, layer : int
    probs : (heads, T, T) ndarray
        The block's attention probabilities for this input (all positions): NumPy, or CuPy when
        they stayed on the GPU (then the stacks and the certificate stay there too).
    token_mask : (T,) bool ndarray
        The real tokens.
    eig_H : (heads, k) complex ndarray
    """

    item: int
    layer: int
    probs: Any
    token_mask: np.ndarray
    eig_H: np.ndarray

    def attention(self, out: Any = None) -> Any:
        """A (heads, n, n): the real tokens' rows and columns, rows renormalised (float64).

        Written into ``out`` (float64, that shape, in the library of :attr:`probs`) when given,
        e.g. a slice of a stack. In the library (on the device) of :attr:`probs`.
        """
        xp = array_module(self.probs)
        source = self.probs  # images: no copy of a submatrix (10x faster at T = 257)
        if not self.token_mask.all():
            keep = xp.asarray(np.flatnonzero(self.token_mask))
            source = self.probs[:, keep[:, None], keep]
        A = xp.empty(source.shape, dtype=np.float64) if out is None else out
        A[...] = source
        A /= A.sum(axis=-1, keepdims=True)
        return A

    @property
    def n_tokens(self) -> int:
        """The real tokens: the order of A."""
        return int(np.count_nonzero(self.token_mask))

    def cases(self, tie_rtol: float, *, certify: bool = True) -> list[DominanceCase]:
        """One case per head (:func:`oversmooth.simulator.perron.dominating_modes`; ``certify=False``: dense)."""
        return stacked_cases([self], tie_rtol, certify=certify)[0]


def stacked_cases(
    problems: Sequence[DominanceProblem],
    tie_rtol: float,
    *,
    certify: bool = True,
    to_host: Callable[[Any], np.ndarray] = to_numpy,
    dense_parts: int = 1,
    dense_map: DenseMap = map,
) -> list[list[DominanceCase]]:
    """The cases of problems with equal token counts and H widths, from one stacked call.

    Their attention matrices are stacked into one ``(sum of heads, n, n)`` array for
    :func:`oversmooth.simulator.perron.dominating_modes`: the certificate's matrix products and bookkeeping
    then run once over every head instead of once per (input, layer), which costs less Python per
    head and holds the GIL less (measured on DINOv2: 1.2x less wall time on two threads, for the
    same CPU time: the certificate's passes go a few heads at a time, in cache). Each head's
    answer does not depend on the others of its stack.

    Problems whose probabilities are on a device are stacked and certified there; ``to_host``
    (e.g. a :class:`oversmooth.simulator.backend.HostCopies`) brings only the undecided heads' matrices to
    the host for their dense spectra, in ``dense_parts`` parts run by ``dense_map``
    (:func:`~oversmooth.simulator.perron.dominating_modes`; the parts change no answer).

    Returns
    -------
    list of list of DominanceCase
        Per problem, one case per head.
    """
    eig_H = np.concatenate([problem.eig_H for problem in problems])
    n = problems[0].n_tokens
    A = array_module(problems[0].probs).empty((eig_H.shape[0], n, n))
    first = 0
    for problem in problems:  # each written into its place: no copy of the whole stack
        problem.attention(out=A[first : first + problem.eig_H.shape[0]])
        first += problem.eig_H.shape[0]
    modes = dominating_modes(
        A,
        eig_H,
        tie_rtol=tie_rtol,
        certify=certify,
        to_host=to_host,
        dense_parts=dense_parts,
        dense_map=dense_map,
    )
    cases = []
    first = 0
    for problem in problems:
        heads = range(first, first + problem.eig_H.shape[0])
        cases.append(
            [
                DominanceCase(
                    problem.item,
                    problem.layer,
                    head - first,
                    HEAD_KINDS[int(modes.kinds[head])],
                    complex(modes.mu[head]),
                    complex(modes.eig_A[head]),
                    complex(modes.eig_H[head]),
                    int(A.shape[-1]),
                )
                for head in heads
            ]
        )
        first = heads.stop
    return cases


def dominance_problems(
    outputs: dict[str, np.ndarray],
    blocks: Sequence[AttentionBlock],
    attention: Sequence[str],
    inputs: Inputs,
    start: int,
    eig_H: Sequence[np.ndarray],
) -> list[DominanceProblem]:
    """The (input, layer) problems of one batch of outputs, in (layer, input) order.

    ``outputs`` hold the blocks' attention probabilities under the names ``attention`` for the
    batch ``inputs``, whose first input is numbered ``start``; ``eig_H`` holds one (n_heads, k)
    array per block (:func:`dominance_spectra`). Probabilities whose leading size is not the
    batch's input count are refused (:func:`per_input_attention`), never indexed as inputs.
    """
    problems = []
    for layer, (block, name) in enumerate(zip(blocks, attention, strict=False)):
        probs = per_input_attention(outputs[name], name, block.n_heads, inputs, block)
        masks = _token_masks(inputs, probs.shape[0], probs.shape[-1])
        problems += [
            DominanceProblem(start + b, layer, probs[b], masks[b], eig_H[layer])
            for b in range(len(probs))
        ]
    return problems


def stacks(problems: Sequence[DominanceProblem]) -> list[list[int]]:
    """Indices of ``problems`` grouped for :func:`stacked_cases`, in order.

    A stack holds problems with the same number of real tokens and the same H width, of any
    layers, at most :data:`MAX_STACK_ELEMENTS` attention entries (bounding a task's memory;
    :data:`MAX_DEVICE_STACK_ELEMENTS` for probabilities on a device). Text
    inputs give one token count per sentence, so stacking across layers makes the stacks of a
    batch as many as its distinct lengths instead of lengths × layers: the per-call overhead of
    the small dense problems counts there (MiniLM-L6: 6× fewer calls).

    Problems on a device are not cut further for the worker threads (they were, into one stack
    per thread, until 2026-11-28). The certificate launches its kernels once per stack, whatever
    the stack's size; on an H200 it took 23.3 wall but 2.2 CPU ms per audited input over 16 such
    stacks, its threads waiting, for the device or, as supposed here, for the GIL to launch the
    same kernels sixteen times. One stack per 2,032 heads of 257 tokens (DINOv2's default rule:
    32 inputs, 384 (input, layer) problems, two stacks) is the design that followed: on an H200
    the certificate then took 0.4–1.2 wall ms per audited input (docs/performance.md). The
    undecided heads' dense spectra still use every thread: :class:`PendingCases` spreads them
    (:func:`spread_over`).
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for index, problem in enumerate(problems):
        groups.setdefault((problem.n_tokens, problem.eig_H.shape[1]), []).append(index)
    return [run for group in groups.values() for run in _even_runs(problems, group)]


def _even_runs(problems: Sequence[DominanceProblem], group: list[int]) -> list[list[int]]:
    """``group`` cut into the fewest runs within :data:`MAX_STACK_ELEMENTS` (device problems:
    :data:`MAX_DEVICE_STACK_ELEMENTS`), of near-equal length.

    Equal runs keep the worker threads equally busy (a greedy fill left one short run: 11 % more
    wall time on DINOv2's 72 problems over two threads).
    """
    n = problems[group[0]].n_tokens
    largest = max(problems[i].eig_H.shape[0] for i in group) * n * n
    limit = MAX_STACK_ELEMENTS if on_host(problems[group[0]].probs) else MAX_DEVICE_STACK_ELEMENTS
    per_run = max(1, limit // max(largest, 1))
    count = -(-len(group) // per_run)
    return [run.tolist() for run in np.array_split(np.asarray(group), count)]


def spread_over(pool: Executor) -> DenseMap:
    """A ``dense_map`` for :func:`~oversmooth.simulator.perron.dominating_modes` that solves the
    parts on ``pool``'s threads, the caller (itself one of them) taking the first part, then
    each later part no thread has started, before it waits for those that others run.

    A part never waits, and the caller waits only for parts already running, so the pool cannot
    deadlock however many of its threads spread parts at once; with every other thread busy the
    caller solves all its parts itself. Results come back in the parts' order. If a part fails,
    the parts not yet started are cancelled and the error is raised.
    """

    def spread(solve: Callable[[slice], Any], parts: Sequence[slice]) -> list[Any]:
        later = {k: pool.submit(solve, parts[k]) for k in range(1, len(parts))}
        try:
            solved = {0: solve(parts[0])} if parts else {}
            for k, future in later.items():  # in order, each part no thread has started
                if future.cancel():
                    solved[k] = solve(parts[k])
            for k, future in later.items():
                if k not in solved:
                    solved[k] = future.result()
            return [solved[k] for k in range(len(parts))]
        finally:
            for future in later.values():
                future.cancel()

    return spread


class PendingCases:
    """The dominance cases of one batch, being computed by a thread pool.

    The batch's (input, layer) problems (:func:`dominance_problems`) are stacked
    (:func:`stacks`) and the stacks spread over ``pool``'s threads (matrix products and LAPACK
    release the GIL); the caller goes on (runs the next batch). :meth:`result` waits for them
    and returns them in (layer, input, head) order, whatever the stacking and the thread count.
    ``to_host`` brings the undecided heads' matrices to the host (:func:`stacked_cases`). A
    stack certified on a device solves its undecided heads in ``parallel`` parts (the pool's
    thread count) spread over the pool (:func:`spread_over`); the others in one, stacks too
    small to certify included (dense at once: cutting those into 16 stacks cost 5× on MiniLM-L6
    on an H200; parts are not measured there).
    """

    def __init__(
        self,
        problems: Sequence[DominanceProblem],
        tie_rtol: float,
        pool: Executor,
        to_host: Callable[[Any], np.ndarray] = to_numpy,
        parallel: int = 1,
    ) -> None:
        self._count = len(problems)
        self._stacks = stacks(problems)
        spread = spread_over(pool)
        self._futures = []
        for stack in self._stacks:
            first = problems[stack[0]]
            certified_on_device = not on_host(first.probs) and first.n_tokens >= CERTIFY_MIN_ORDER
            self._futures.append(
                pool.submit(
                    stacked_cases,
                    [problems[i] for i in stack],
                    tie_rtol,
                    to_host=to_host,
                    dense_parts=parallel if certified_on_device else 1,
                    dense_map=spread if certified_on_device else map,
                )
            )

    def per_problem(self) -> list[list[DominanceCase]]:
        """Wait for every stack; each problem's cases, in problem order."""
        per_problem: list[list[DominanceCase]] = [[] for _ in range(self._count)]
        for stack, future in zip(self._stacks, self._futures, strict=True):
            for index, cases in zip(stack, future.result(), strict=True):
                per_problem[index] = cases
        return per_problem

    def done(self) -> bool:
        """Whether every stack has finished (:meth:`per_problem` would not wait)."""
        return all(future.done() for future in self._futures)

    def result(self) -> list[DominanceCase]:
        """Wait for every stack; the cases in problem order."""
        return [case for cases in self.per_problem() for case in cases]

    def cancel(self) -> None:
        """Cancel the stacks not yet started."""
        for future in self._futures:
            future.cancel()
