"""The model audit: run a real ONNX Transformer on real inputs and measure smoothing layer by layer.

For every input and layer the audit records the simulator's smoothing metrics of the hidden states,
reduced inside the graph to a few statistics per layer (:mod:`importers.run.reductions`: the hidden
states themselves never leave the device);
for every (input, layer, head) it finds the dominating eigenvalue of ``I + H_h ⊗ A`` from the real
attention matrix A and the head's value-projection product (docs/theory.md §6.2, Table 1); and it reports
the eigenvalues of W_V W_O per head and layer (Fig. 5).

Layers
------
Layer 0 is the residual stream entering the first attention block (after the embeddings and any
embedding norm); layer i is the output of block i-1, i.e. the stream entering block i. For a post-LN
block that is the output of its last norm; for a pre-LN block the residual after its MLP add, before
any final norm. Padding tokens (from the attention mask) never enter a metric; prefix tokens (CLS,
registers) are left out of the metrics when ``exclude_prefix`` is set.

Dominance counting
------------------
One case per (input, layer, head). A is the head's attention matrix restricted to real tokens (rows
renormalised). H_h has the d_head eigenvalues of ``W_O^h W_V^h`` plus the zero eigenvalue of the
rank-deficient d×d product (``granularity="head"``), or the d eigenvalues of the whole-layer
``W_V W_O`` (``"layer"``); with ``fold_gamma`` the pre-LN γ is folded in (``diag(γ) W_V W_O``). The
kind is perron when every dominating ``1 + λ^H λ^A`` uses the Perron root of A, non-perron otherwise
(balanced ties, S4, are non-perron and also counted separately).

Public API
----------
audit
    Run the audit and return an :class:`~importers.run.records.AuditResult` (write it with
    :func:`importers.run.report.save_audit`).
layer_tensors
    The graph tensors the audit records as layers (block 0's input, every block's output).
audit_session, AuditSession
    The session the audit runs (model plus in-graph reductions), for benchmarks and tools.
"""

from __future__ import annotations

import functools
import os
import platform
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np
from threadpoolctl import threadpool_limits

from importers.errors import ImporterError, ImporterInputError, LayerStreamError
from importers.graph import OnnxModel, load_model
from importers.graph.shapes import ShapeContext
from importers.match import (
    check_complete,
    departures_note,
    find_attention_blocks,
    missing_blocks_note,
)
from importers.run.batching import items_per_call, run_batches
from importers.run.cache import cached_value_spectra, checked_spectra
from importers.run.dominance import (
    PendingCases,
    dominance_problems,
    dominance_spectra,
    unfolded_blocks_note,
)
from importers.run.feeds import Inputs
from importers.run.records import (
    AuditConfig,
    AuditResult,
    DominanceCase,
    InputsInfo,
    ModelInfo,
    Provenance,
    ProviderInfo,
)
from importers.run.reductions import Gram, ReductionPlan, plan_reductions
from importers.run.runner import Runner, default_threads
from importers.run.sources import default_inputs
from importers.value_spectra import BlockSpectra, spectrum_rows
from importers.weights import BlockWeights, block_weights
from importers.zoo import ModelRef, ZooModel, file_sha256, lookup
from simulator.metrics import METRICS
from simulator.output import package_versions
from simulator.statistics import SPECTRAL_METRICS, metrics_from_statistics
from simulator.tolerances import TIE_RTOL
from simulator.validation import check_choice, check_positive_int

__all__ = ["AuditSession", "audit", "audit_session", "layer_tensors"]

Granularity = Literal["head", "layer", "none"]
_PACKAGES = ("oversmooth", "numpy", "scipy", "onnx", "onnxruntime", "onnxruntime-gpu")


def layer_tensors(
    blocks: Sequence[BlockWeights], notes: list[str] | None = None, *, partial: bool = False
) -> list[str]:
    """Graph tensors of the recorded layers: block 0's input, then every block's output.

    Layer 0 is the stream entering block 0, layer i the output of block i-1 (see the module
    docstring); the matcher traces both from the graph's residual sums
    (:mod:`importers.match.stream`). Every layer is checked against the block structure: block
    i-1's output, found walking forward from its MLP residual, must be the stream block i reads,
    found walking back from its attention (its norm's input, or the attention input, that its
    attention residual adds), or the stream that one adds input-independent terms to
    (``input_base``: YOLOS' position embeddings between blocks; noted).

    Parameters
    ----------
    blocks : sequence of BlockWeights
        The matched blocks in depth order.
    notes : list of str, optional
        Notes on the layer choice are appended here.
    partial : bool
        The blocks are only the matched part of the model (``--partial``): between two of them an
        unmatched block may sit, so a break of the chain is noted (the earlier block's output is
        used) instead of refused.

    Returns
    -------
    list of str

    Raises
    ------
    LayerStreamError
        A block's residual stream could not be established, or a layer tensor is not the stream
        entering the next block.
    """
    for block in blocks:
        if block.stream_error is not None:
            raise LayerStreamError(
                f"layer {block.index + 1} (the output of block {block.index}) cannot be read: "
                f"{block.stream_error}"
            )
    names = [blocks[0].input_name] + [block.output_name for block in blocks]
    for i in range(1, len(blocks)):
        if blocks[i].input_name == blocks[i - 1].output_name:
            continue
        if blocks[i].input_base == blocks[i - 1].output_name:
            if notes is not None:
                notes.append(
                    f"block {i} reads block {i - 1}'s output plus a term that does not depend on "
                    f"the inputs ({blocks[i].input_name!r}); layer {i} is block {i - 1}'s output"
                )
            continue
        mismatch = (
            f"block {i} reads {blocks[i].input_name!r} but block {i - 1} ends at "
            f"{blocks[i - 1].output_name!r}"
        )
        if not partial:
            raise LayerStreamError(
                f"layer {i} would not be the residual stream: {mismatch}, and the importer "
                f"does not follow what changes the stream between them (for example a term "
                f"added between blocks, as YOLOS adds position embeddings)"
            )
        if notes is not None:
            notes.append(f"{mismatch}; layer {i} uses the latter")
    if len(set(names)) != len(names):
        raise LayerStreamError(
            f"two layers would read the same tensor ({', '.join(map(repr, names))}): internal error"
        )
    return names


def _gram_orientation(graph: OnnxModel, layer0: str, first: Inputs, block: BlockWeights) -> Gram:
    """The smaller Gram matrix of a (T, D) hidden state: T×T when T <= D is known, else D×D.

    Either gives the same singular values; the smaller costs less to build, to copy back and to
    diagonalise (DINOv2: T = 257 against D = 384, 2.2x fewer entries and host time). T is
    the token axis of the inputs' mask, else that of layer 0's shape with the graph inputs pinned
    to the first input's shapes, by the graph's own shape arithmetic (:class:`ShapeContext`: ONNX
    shape inference cannot follow DINOv2's position-embedding interpolation to its 257 tokens).
    """
    if first.token_mask is not None:
        tokens: int | None = first.token_mask.shape[1]
    else:
        shapes = ShapeContext(graph.index, batch=first.batch_size, sequence=1)
        for name, array in first.feeds.items():
            shapes.set_shape(name, np.shape(array))
        try:
            dims = shapes.shape(layer0)
        except ImporterError:  # no rule reaches it: the D×D Gram is always right
            dims = None
        token_axis = 0 if block.time_major else 1
        tokens = dims[token_axis] if dims is not None and len(dims) == 3 else None
    return "tokens" if tokens is not None and tokens <= block.d_model else "features"


def check_dominance_options(dominance: str, fold_gamma: bool) -> None:
    """``dominance`` is head, layer or none; ``fold_gamma`` only with a dominance step."""
    check_choice(dominance, "dominance", ("head", "layer", "none"), error=ImporterInputError)
    if fold_gamma and dominance == "none":
        raise ImporterInputError(
            "`fold_gamma` folds γ into H for the dominance step; got dominance 'none'"
        )


def _check_counted_tokens(n_tokens: np.ndarray, labels: Sequence[str]) -> None:
    """Every item of a batch (``labels``, one each) keeps at least 2 tokens for the metrics."""
    short = np.flatnonzero(np.asarray(n_tokens) < 2)
    if short.size:
        item = int(short[0])
        label = labels[item] if len(labels[item]) <= 40 else labels[item][:37] + "..."
        raise ImporterInputError(
            f"input {label!r} keeps {int(n_tokens[item])} token(s) for the metrics once padding "
            "and the `exclude_prefix` tokens are left out; a smoothing metric needs at least 2"
        )


def _measure_layers(
    outputs: dict[str, np.ndarray],
    plan: ReductionPlan,
    start: int,
    per_input: dict[str, np.ndarray],
    labels: Sequence[str],
) -> int:
    """Fill ``per_input[metric][item, layer]`` for one batch from its in-graph statistics.

    Without a Gram matrix (``spectral=False``) only the scalar metrics are filled. Returns the
    batch size.
    """
    names = [name for name in METRICS if plan.gram != "none" or name not in SPECTRAL_METRICS]
    batch = 0
    for layer in range(len(plan.layers)):
        statistics = plan.statistics(outputs, layer)
        _check_counted_tokens(statistics.n_tokens, labels)
        values = metrics_from_statistics(statistics, names)
        for metric, value in values.items():
            batch = len(value)
            per_input[metric][start : start + batch, layer] = value
    return batch


def _prefix_count(exclude_prefix: bool | int, entry: ZooModel | None) -> int:
    if isinstance(exclude_prefix, bool):
        if not exclude_prefix:
            return 0
        return int(entry.prefix_tokens) if entry is not None else 1
    if not isinstance(exclude_prefix, int | np.integer) or exclude_prefix < 0:
        raise ImporterInputError(
            f"`exclude_prefix` must be a bool or a non-negative integer; got {exclude_prefix!r}"
        )
    return int(exclude_prefix)


def _open(model: str | os.PathLike[str] | OnnxModel, entry: ZooModel | None) -> ModelRef:
    """The model as (file, zoo entry), plus the loaded graph: parsed once, here or by the caller."""
    if isinstance(model, OnnxModel):
        if model.path is None:
            raise ImporterInputError(
                "`model` must have been loaded from a file; got an in-memory model"
            )
        return ModelRef(model.path, entry)
    return lookup(model)


@dataclass(frozen=True)
class AuditSession:
    """The audit's onnxruntime session: the model plus its in-graph reductions, and its feeds.

    Attributes
    ----------
    layers : list of str
        The layer tensors (:func:`layer_tensors`), reduced in the graph.
    attention : list of str
        The attention probabilities fetched per block (empty without dominance).
    plan : ReductionPlan
    runner : Runner
        Returns the reductions' outputs, then the attention probabilities.
    inputs : Inputs
        What the session runs on (held in memory or read per batch).
    notes : list of str
        Notes on the layer choice.
    """

    layers: list[str]
    attention: list[str]
    plan: ReductionPlan
    runner: Runner
    inputs: Inputs
    notes: list[str]

    def batch_feeds(self, batch: Inputs) -> dict[str, np.ndarray]:
        """A batch's feeds plus the token mask the reductions read (padding never counts)."""
        mask = batch.token_mask
        return {**batch.feeds, **(self.plan.mask_feed(mask) if mask is not None else {})}

    @property
    def feeds(self) -> dict[str, np.ndarray]:
        """:meth:`batch_feeds` of every input at once (read whole, in memory)."""
        return self.batch_feeds(self.inputs)

    def batches(
        self, items: int, *, progress: bool = False
    ) -> Iterator[tuple[Inputs, dict[str, np.ndarray]]]:
        """``(batch, outputs)`` for the inputs read ``items`` at a time (see :func:`run_batches`).

        Each batch's outputs stay valid while :data:`LOOKAHEAD_BATCHES` more are run.
        """
        return run_batches(
            self.runner,
            self.inputs,
            self.batch_feeds,
            items,
            progress=progress,
            keep=LOOKAHEAD_BATCHES + 1,
        )


def audit_session(
    graph: OnnxModel,
    blocks: Sequence[BlockWeights],
    inputs: Inputs,
    *,
    prefix: int = 0,
    attention: bool = True,
    spectral: bool = True,
    provider: Literal["auto", "cpu", "cuda"] = "auto",
    threads: int | None = None,
    partial: bool = False,
) -> AuditSession:
    """Build the session the audit runs: layer statistics reduced in the graph, attention exposed.

    Only the reductions' outputs come back per layer (:mod:`importers.run.reductions`): eight
    scalars, plus the smaller Gram matrix when ``spectral`` (the singular-value metrics need it);
    the attention probabilities are fetched only when ``attention`` (the dominance step needs
    them). ``partial``: ``blocks`` are only the matched part of the model (see
    :func:`layer_tensors`).
    """
    notes: list[str] = []
    layers = layer_tensors(blocks, notes, partial=partial)
    probs = [block.attention_name for block in blocks] if attention else []
    first = inputs.read(0, 1)  # masked or not, and the token count, without reading every input
    time_major = [blocks[0].time_major] + [block.time_major for block in blocks]
    gram = _gram_orientation(graph, layers[0], first, blocks[0]) if spectral else "none"
    plan = plan_reductions(
        graph,
        layers,
        prefix=prefix,
        masked=first.token_mask is not None,
        gram=gram,
        time_major=time_major,
    )
    runner = Runner(
        graph, expose=probs, extension=plan.extension, provider=provider, threads=threads
    )
    return AuditSession(layers, probs, plan, runner, inputs, notes)


#: Batches whose host work (metrics, dominance) may still run while the next batch is inferred.
LOOKAHEAD_BATCHES = 1


class _BatchWork:
    """The host work of one batch running on a thread pool: its metrics and dominance cases."""

    def __init__(self, metrics: Future[int], dominance: PendingCases | None) -> None:
        self._metrics = metrics
        self._dominance = dominance

    def result(self) -> list[DominanceCase]:
        self._metrics.result()
        return self._dominance.result() if self._dominance is not None else []

    def cancel(self) -> None:
        self._metrics.cancel()
        if self._dominance is not None:
            self._dominance.cancel()


def _measure_batch(
    session: AuditSession,
    blocks: Sequence[BlockWeights],
    eig_H: Sequence[np.ndarray],
    tie_rtol: float,
    per_input: dict[str, np.ndarray],
    pool: ThreadPoolExecutor,
    batch: Inputs,
    start: int,
    outputs: dict[str, np.ndarray],
) -> _BatchWork:
    """Start a batch's host work: its layer metrics (into ``per_input``) and dominance cases."""
    metrics = pool.submit(_measure_layers, outputs, session.plan, start, per_input, batch.labels)
    if not session.attention:
        return _BatchWork(metrics, None)
    problems = dominance_problems(outputs, blocks, session.attention, batch, start, eig_H)
    return _BatchWork(metrics, PendingCases(problems, tie_rtol, pool))


def _pipelined(
    batches: Iterator[tuple[Inputs, dict[str, np.ndarray]]],
    measure: Callable[[ThreadPoolExecutor, Inputs, int, dict[str, np.ndarray]], _BatchWork],
    threads: int,
) -> list[DominanceCase]:
    """Run every batch's host work on worker threads while onnxruntime runs the next batches.

    At most :data:`LOOKAHEAD_BATCHES` batches' work is pending when the next one is started, so
    memory stays bounded; the cases come back in batch order. Many small eigenvalue problems: one
    BLAS thread each, ``threads`` worker threads, one per core (this also avoids the collapse of
    multithreaded BLAS on a busy machine, 5-20x measured on 2 cores). On an error or Ctrl-C the
    work not yet started is cancelled.
    """
    cases: list[DominanceCase] = []
    pending: deque[_BatchWork] = deque()
    start = 0
    with threadpool_limits(limits=1, user_api="blas"):
        pool = ThreadPoolExecutor(max_workers=threads)
        try:
            for batch, outputs in batches:
                pending.append(measure(pool, batch, start, outputs))
                start += batch.batch_size
                while len(pending) > LOOKAHEAD_BATCHES:
                    cases += pending.popleft().result()
            while pending:
                cases += pending.popleft().result()
        finally:
            for work in pending:
                work.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
    return cases


def audit(
    model: str | os.PathLike[str] | OnnxModel,
    inputs: Inputs | None = None,
    *,
    entry: ZooModel | None = None,
    provider: Literal["auto", "cpu", "cuda"] = "auto",
    batch_size: int = 4,
    exclude_prefix: bool | int = False,
    dominance: Granularity = "head",
    fold_gamma: bool = False,
    spectral: bool = True,
    partial: bool = False,
    tie_rtol: float = TIE_RTOL,
    progress: bool = False,
    cache: bool = True,
    value_spectra: Sequence[BlockSpectra] | None = None,
    threads: int | None = None,
) -> AuditResult:
    """Audit a model: per-layer smoothing of real inputs, dominating eigenvalues, value spectra.

    Parameters
    ----------
    model : str, path or OnnxModel
        An ONNX file or a zoo name (``oversmooth models``; fetched on first use), or a model already
        loaded with :func:`importers.graph.load_model` (it is not parsed again).
    inputs : Inputs, optional
        Default: the bundled photographs (image models) or sentences (text models).
    entry : ZooModel, optional
        The zoo entry of an already loaded ``model`` (preprocessing, prefix tokens, display name);
        looked up automatically when ``model`` is a zoo name.
    provider : {"auto", "cpu", "cuda"}
        onnxruntime execution provider; ``"cuda"`` fails unless the session really runs on CUDA.
    batch_size : int
        Inputs per onnxruntime call (bounds memory). A graph that fixes its batch size runs at
        that size; one with nodes that mix the inputs of a batch (``DynamicQuantizeLinear``) runs
        every input alone, so the numbers never depend on it (a note says so; see
        :mod:`importers.run.batching`).
    exclude_prefix : bool or int
        Leave prefix tokens out of the metrics: True uses the zoo's count (CLS = 1), an int counts.
    dominance : {"head", "layer", "none"}
        H granularity of the dominance table, or skip it (no attention tensors fetched).
    fold_gamma : bool
        Fold the pre-LN γ into H for the dominance table.
    spectral : bool
        Compute the singular-value metrics (sigma_ratio, rank1_residual, effective_rank). They
        need one min(T, D)² Gram matrix per input and layer from the device, most of what an
        audit on a GPU moves; without them those columns are NaN and a note says so.
    partial : bool
        Audit a model whose attention is only partly matched; the first note then names the
        missing blocks (else :class:`~importers.match.IncompleteMatchError`, exit status 1).
    tie_rtol : float
        Relative tolerance for ties of |μ|.
    progress : bool
        Show a progress bar (stderr).
    cache : bool
        Reuse (and store) the input-independent value spectra in the per-user cache, keyed by
        the model file's sha256 (:mod:`importers.run.cache`); False computes them afresh.
    value_spectra : sequence of BlockSpectra, optional
        Those value spectra already computed for this model, one per matched block (the sharded
        audit computes them once and sends them to its workers); then ``cache`` is not used.
    threads : int, optional
        The cores the audit may use: onnxruntime's intra-op threads and the threads of the host
        work (metrics, dominance). Default: every core this process may use
        (:func:`~importers.run.runner.default_threads`).

    Returns
    -------
    AuditResult
    """
    check_dominance_options(dominance, fold_gamma)
    batch_size = check_positive_int(batch_size, "batch_size", error=ImporterInputError)
    threads = default_threads() if threads is None else threads
    threads = check_positive_int(threads, "threads", error=ImporterInputError)
    ref = _open(model, entry)
    prefix = _prefix_count(exclude_prefix, ref.entry)
    graph = model if isinstance(model, OnnxModel) else load_model(ref.path)
    report = find_attention_blocks(graph)
    check_complete(report, partial=partial)
    blocks = [block_weights(graph, block) for block in report.blocks]
    notes = [missing_blocks_note(report)] if report.unmatched else []
    departed = departures_note(report.blocks)
    notes += [departed] if departed else []
    inputs = default_inputs(graph.inputs, ref.entry) if inputs is None else inputs
    if inputs.batch_size == 0:
        raise ImporterInputError("`inputs` must hold at least one item; got none")
    if inputs.random:
        notes.append(
            "inputs are RANDOM, not real data: smoothing of noise says little about the model"
        )
    session = audit_session(
        graph,
        blocks,
        inputs,
        prefix=prefix,
        attention=dominance != "none",
        spectral=spectral,
        provider=provider,
        threads=threads,
        partial=bool(report.unmatched),
    )
    if not spectral:
        notes.append(f"not computed (spectral=False): {', '.join(SPECTRAL_METRICS)}")
    runner = session.runner
    notes += session.notes
    items, batch_notes = items_per_call(graph, batch_size)
    notes += batch_notes
    sha256 = file_sha256(ref.path)
    spectra = (
        cached_value_spectra(blocks, sha256, use_cache=cache)
        if value_spectra is None
        else checked_spectra(value_spectra, blocks)
    )
    eig_H = dominance_spectra(blocks, spectra, dominance, fold_gamma) if dominance != "none" else []
    if fold_gamma and dominance != "none":
        notes += unfolded_blocks_note(spectra)
    shape = (inputs.batch_size, len(session.layers))
    per_input = {name: np.full(shape, np.nan) for name in METRICS}
    batches = session.batches(items, progress=progress)
    measure = functools.partial(_measure_batch, session, blocks, eig_H, tie_rtol, per_input)
    cases = _pipelined(batches, measure, threads)
    return AuditResult(
        model=ModelInfo(ref.name, str(ref.path), sha256, len(blocks)),
        inputs=InputsInfo(
            inputs.source, inputs.digest, inputs.batch_size, inputs.random, tuple(inputs.labels)
        ),
        provider=ProviderInfo(provider, tuple(runner.provider_used), runner.provider_note),
        blocks=blocks,
        metrics=per_input,
        dominance=cases,
        spectra=spectrum_rows(spectra),
        config=AuditConfig(
            batch_size=batch_size,
            exclude_prefix=prefix,
            dominance=dominance,
            fold_gamma=fold_gamma,
            tie_rtol=tie_rtol,
            metrics=tuple(m for m in METRICS if spectral or m not in SPECTRAL_METRICS),
        ),
        provenance=Provenance(
            python=platform.python_version(),
            versions=package_versions(_PACKAGES),
            runner=runner.provenance(),
            inputs_digest=inputs.digest,
        ),
        notes=notes,
    )
