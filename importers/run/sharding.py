"""The audit on many workers: inputs split into shards, each audited where an executor runs it, merged.

:func:`sharded_audit` gives the :class:`~importers.run.records.AuditResult` of
:func:`importers.run.audit.audit` on the same model and inputs. Each shard is a run of whole batches
(``batch_size`` inputs each, the last one possibly short), so every onnxruntime call sees exactly
the inputs it sees in a single-process run; a shard's result is its per-input metric rows and its
dominance cases (input indices shifted by the shard's start), and the merge concatenates them in
input order. Means, standard deviations and dominance fractions are then computed from the same
per-input values as in one process.

Memory
------
A shard holds at most :data:`SHARD_INPUTS` inputs and :data:`SHARD_BYTES` of feeds (at least one
batch), so the number of shards grows with the inputs while a shard's size does not. A shard's
inputs are read (from their file, decoded, drawn) only when it is submitted, and at most
:data:`IN_FLIGHT_PER_SLOT` shards per worker thread are submitted and not yet merged (a sliding
window: the next is read when one finishes). So neither this process nor a worker holds more than
a few shards' inputs, whatever their number; what grows is only what one process keeps too, the
per-input metrics and dominance cases.

Input-independent work
----------------------
This process matches the model's attention blocks, reads their weights and takes their value
spectra from the per-user cache (:func:`~importers.run.cache.cached_value_spectra`, computed and
stored on a miss) before any shard starts; the spectra (a few numbers per head) are sent to every
worker once with the model, so no worker computes them (the workers send back no weights).

How the model reaches the workers
---------------------------------
By path when every worker sees a file at the model's path with the same sha256 (a local cluster,
or a filesystem the workers share); otherwise by value: the file's bytes are sent to every worker
once and written into the worker's local directory (removed with the worker). A model whose
weights live in external data files must be on a shared filesystem. Inputs always travel by value,
each worker receiving only its shards.

Public API
----------
sharded_audit
    The audit of ``model`` on ``inputs``, its shards run by an :class:`~importers.executor.Executor`.
plan_shards
    Split ``n`` inputs into runs of whole batches: ``k`` of them, more when one would be too big.
SHARD_INPUTS, SHARD_BYTES, IN_FLIGHT_PER_SLOT
    The shard size cap and the window of shards in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from importers.errors import ImporterInputError
from importers.executor import Executor, own_threads, progress_bar
from importers.graph import OnnxModel, load_model
from importers.graph.index import uses_external_data
from importers.match import check_complete, find_attention_blocks
from importers.run.audit import audit, check_dominance_options
from importers.run.cache import cached_value_spectra
from importers.run.feeds import Inputs
from importers.run.records import (
    AuditResult,
    DominanceCase,
    InputsInfo,
    ModelInfo,
    Provenance,
    ProviderInfo,
)
from importers.run.sources import default_inputs
from importers.value_spectra import BlockSpectra, spectrum_rows
from importers.weights import block_weights
from importers.zoo import ModelRef, ZooModel, file_sha256, lookup
from simulator.validation import check_positive_int

__all__ = [
    "IN_FLIGHT_PER_SLOT",
    "SHARD_BYTES",
    "SHARD_INPUTS",
    "ModelFile",
    "plan_shards",
    "sharded_audit",
]

#: Most inputs in one shard (rounded down to whole batches, at least one batch). Each shard builds
#: its own onnxruntime session (about 1 s for MiniLM-L3, as long as ~90 of its inputs), so shards
#: are large; the cap keeps a shard's inputs and results bounded.
SHARD_INPUTS = 512
#: Most bytes of feeds in one shard (the same rounding): 53 images of 224 x 224, for instance. This
#: process holds one shard's inputs while it sends them, a worker about two (the window).
SHARD_BYTES = 32 * 2**20
#: Shards submitted and not yet merged, per worker thread: one running, one waiting on its worker.
IN_FLIGHT_PER_SLOT = 2


@dataclass(frozen=True)
class ModelFile:
    """The model as a worker gets it: by path (``data`` None) or by value (the file's bytes)."""

    path: str
    sha256: str
    data: bytes | None = None


@dataclass(frozen=True)
class _Shard:
    """One task: the inputs ``start .. start + len(inputs)`` and the audit's options."""

    start: int
    inputs: Inputs
    entry: ZooModel | None
    options: dict[str, Any]


@dataclass(frozen=True)
class _ShardResult:
    """What a worker sends back: per-input metrics, dominance cases and how it ran."""

    start: int
    metrics: dict[str, np.ndarray]
    dominance: list[DominanceCase]
    provider: ProviderInfo
    provenance: Provenance
    config: Any
    notes: list[str]


def plan_shards(
    n_items: int, batch_size: int, shards: int, max_batches: int | None = None
) -> list[slice]:
    """Split items ``0 .. n_items`` into ``shards`` runs of whole batches, more when they are too big.

    Returns contiguous slices in order, each of a whole number of ``batch_size`` batches (the last
    may end with a short batch), as equal in batches as possible: ``shards`` of them, fewer when
    there are fewer batches, more when a slice would hold more than ``max_batches`` batches
    (``ceil(n_batches / max_batches)`` then).
    """
    n_batches = -(-n_items // batch_size)
    count = max(1, min(shards, n_batches))
    if max_batches is not None:
        count = max(count, -(-n_batches // max_batches))
    bounds = [(i * n_batches) // count for i in range(count + 1)]
    return [
        slice(bounds[i] * batch_size, min(bounds[i + 1] * batch_size, n_items))
        for i in range(count)
    ]


def _batches_per_shard(inputs: Inputs, batch_size: int) -> int:
    """Most whole batches in one shard: :data:`SHARD_INPUTS` and :data:`SHARD_BYTES`, at least one.

    The bytes of an item are those of the first one (feeds and token mask; every item of
    :class:`~importers.run.feeds.Inputs` has the same shape).
    """
    first = inputs.read(0, 1)
    mask = first.token_mask
    item_bytes = sum(np.asarray(array).nbytes for array in first.feeds.values())
    item_bytes += 0 if mask is None else mask.nbytes
    items = min(SHARD_INPUTS, SHARD_BYTES // max(1, item_bytes))
    return max(1, items // batch_size)


def _sees_file(path: str, sha256: str) -> bool:
    """On a worker: is there a file at ``path`` with this sha256?"""
    try:
        return Path(path).is_file() and file_sha256(path) == sha256
    except OSError:
        return False


def _model_file(graph: OnnxModel, executor: Executor) -> ModelFile:
    """By path when every worker sees the same file, else by value (see the module docstring)."""
    assert graph.path is not None
    path, sha256 = str(graph.path.resolve()), file_sha256(graph.path)
    if all(executor.on_workers(_sees_file, path, sha256).values()):
        return ModelFile(path, sha256)
    if uses_external_data(graph.proto.graph):
        raise ImporterInputError(
            f"`model` keeps its weights in external data files, so every Dask worker must see "
            f"{path} (sha256 {sha256[:12]}…); put it on a filesystem the workers share"
        )
    return ModelFile(path, sha256, graph.path.read_bytes())


def _local_copy(model: ModelFile) -> str:
    """On a worker: the path of the model, written into the worker's folder when sent by value."""
    if model.data is None:
        return model.path
    from distributed import get_worker

    folder = Path(get_worker().local_directory) / "oversmooth-models"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{model.sha256}.onnx"
    if not target.is_file():
        partial = folder / f".{model.sha256}.{os.getpid()}.partial"
        partial.write_bytes(model.data)
        os.replace(partial, target)
    return str(target)


def _audit_shard(
    shard: _Shard, model: ModelFile, spectra: list[BlockSpectra], threads: dict[str, int]
) -> _ShardResult:
    """On a worker: :func:`~importers.run.audit.audit` of one shard, with the client's spectra.

    Unless the options fix ``threads``, the shard uses its worker's share of the host's cores
    (:meth:`~importers.executor.Executor.task_threads`).
    """
    graph = load_model(_local_copy(model))
    options = dict(shard.options)
    if options.get("threads") is None:
        options["threads"] = own_threads(threads)
    result = audit(graph, shard.inputs, entry=shard.entry, value_spectra=spectra, **options)
    cases = [dataclasses.replace(case, input=case.input + shard.start) for case in result.dominance]
    return _ShardResult(
        shard.start,
        result.metrics,
        cases,
        result.provider,
        result.provenance,
        result.config,
        result.notes,
    )


def _merged_metrics(results: Sequence[_ShardResult]) -> dict[str, np.ndarray]:
    return {
        name: np.concatenate([result.metrics[name] for result in results], axis=0)
        for name in results[0].metrics
    }


def _provider_notes(results: Sequence[_ShardResult]) -> list[str]:
    used = {result.provider.used for result in results}
    if len(used) == 1:
        return []
    kinds = "; ".join(", ".join(providers) for providers in sorted(used))
    return [f"the workers ran different onnxruntime providers: {kinds}"]


def _model_ref(model: str | os.PathLike[str] | OnnxModel, entry: ZooModel | None) -> ModelRef:
    if not isinstance(model, OnnxModel):
        return lookup(model)
    if model.path is None:
        raise ImporterInputError(
            "`model` must have been loaded from a file; got an in-memory model"
        )
    return ModelRef(model.path, entry)


def _merged_result(
    ref: ModelRef,
    inputs: Inputs,
    results: Sequence[_ShardResult],
    blocks: list[Any],
    spectra: list[BlockSpectra],
    where: Mapping[str, Any],
) -> AuditResult:
    first = results[0]
    runner = {**first.provenance.runner, "executor": dict(where), "shards": len(results)}
    return AuditResult(
        model=ModelInfo(ref.name, str(ref.path), file_sha256(ref.path), len(blocks)),
        inputs=InputsInfo(
            inputs.source, inputs.digest, inputs.batch_size, inputs.random, tuple(inputs.labels)
        ),
        provider=first.provider,
        blocks=blocks,
        metrics=_merged_metrics(results),
        dominance=[case for result in results for case in result.dominance],
        spectra=spectrum_rows(spectra),
        config=first.config,
        provenance=dataclasses.replace(
            first.provenance, runner=runner, inputs_digest=inputs.digest
        ),
        notes=[*first.notes, *_provider_notes(results)],
    )


def _read_shard(inputs: Inputs, part: slice, batch_size: int) -> Inputs:
    """Items ``part`` held in memory, read a batch at a time into arrays of the whole shard.

    So reading holds the shard plus one batch (a reader asked for the whole range may hold its
    pieces and their concatenation, twice the shard).
    """
    if inputs.in_memory:
        return inputs.read(part.start, part.stop)
    first = inputs.read(part.start, part.start + batch_size)
    size, mask = part.stop - part.start, first.token_mask
    feeds = {
        name: np.empty((size, *array.shape[1:]), array.dtype) if array.ndim else array
        for name, array in first.feeds.items()
    }
    whole_mask = None if mask is None else np.empty((size, mask.shape[1]), bool)
    for start in range(part.start, part.stop, batch_size):
        batch = first if start == part.start else inputs.read(start, start + batch_size)
        rows = slice(start - part.start, start - part.start + batch.batch_size)
        for name, array in batch.feeds.items():
            if array.ndim:
                feeds[name][rows] = array
        if whole_mask is not None and batch.token_mask is not None:
            whole_mask[rows] = batch.token_mask
    return Inputs(
        feeds=feeds,
        token_mask=whole_mask,
        labels=inputs.labels[part],
        source=inputs.source,
        random=inputs.random,
    )


def _shards(
    inputs: Inputs, parts: Sequence[slice], entry: ZooModel | None, options: dict[str, Any]
) -> Iterator[_Shard]:
    """The shards in order, each one's inputs read (into memory) only when it is taken."""
    for part in parts:
        yield _Shard(part.start, _read_shard(inputs, part, options["batch_size"]), entry, options)


def sharded_audit(
    model: str | os.PathLike[str] | OnnxModel,
    inputs: Inputs | None = None,
    *,
    executor: Executor,
    entry: ZooModel | None = None,
    batch_size: int = 4,
    shards: int | None = None,
    partial: bool = False,
    progress: bool = False,
    cache: bool = True,
    **options: Any,
) -> AuditResult:
    """Audit ``model`` on ``inputs`` with the shards run by ``executor``; the result of :func:`audit`.

    Parameters
    ----------
    model : str, path or OnnxModel
        As for :func:`~importers.run.audit.audit` (a model loaded from a file).
    inputs : Inputs, optional
        Default: the bundled inputs of the model's kind.
    executor : Executor
        Where the shards run (:func:`importers.executor.open_executor`).
    entry : ZooModel, optional
        The zoo entry of an already loaded ``model``.
    batch_size : int
        Inputs per onnxruntime call; shards are whole batches.
    shards : int, optional
        How many shards at least (default: the executor's ``slots``, one per worker thread: each
        shard builds its own onnxruntime session, so more shards cost more set-up); more when a
        shard would exceed :data:`SHARD_INPUTS` or :data:`SHARD_BYTES`.
    partial : bool
        Audit a model whose attention is only partly matched.
    progress : bool
        A progress bar of inputs done (stderr), moving as shards finish.
    cache : bool
        Take the value spectra from the per-user cache (and store them there), here, once; False
        computes them afresh. The workers never compute them.
    **options
        The other keyword arguments of :func:`~importers.run.audit.audit` (``provider``,
        ``exclude_prefix``, ``dominance``, ``fold_gamma``, ``spectral``, ``tie_rtol``,
        ``threads``: the cores of each shard; default its worker's share of its host's cores,
        :meth:`~importers.executor.Executor.task_threads`).

    Returns
    -------
    AuditResult
        Its provenance's ``runner`` record also names the executor and the number of shards.
    """
    batch_size = check_positive_int(batch_size, "batch_size", error=ImporterInputError)
    ref = _model_ref(model, entry)
    graph = model if isinstance(model, OnnxModel) else load_model(ref.path)
    report = find_attention_blocks(graph)  # refused here, before any worker starts
    check_complete(report, partial=partial)
    inputs = default_inputs(graph.inputs, ref.entry) if inputs is None else inputs
    if inputs.batch_size == 0:
        raise ImporterInputError("`inputs` must hold at least one item; got none")
    blocks = [block_weights(graph, block) for block in report.blocks]
    spectra = cached_value_spectra(blocks, file_sha256(ref.path), use_cache=cache)
    if options.get("threads") is not None:  # refused here, not on every worker
        check_positive_int(options["threads"], "threads", error=ImporterInputError)
    check_dominance_options(options.get("dominance", "head"), options.get("fold_gamma", False))
    options = {**options, "batch_size": batch_size, "partial": partial}
    slots = executor.slots
    parts = plan_shards(
        inputs.batch_size, batch_size, shards or slots, _batches_per_shard(inputs, batch_size)
    )
    shared = {
        "model": _model_file(graph, executor),
        "spectra": spectra,
        "threads": executor.task_threads(),
    }
    finished: dict[int, _ShardResult] = {}
    with (
        progress_bar(inputs.batch_size, "input", enabled=progress) as advance,
        contextlib.closing(
            executor.map(
                _audit_shard,
                _shards(inputs, parts, ref.entry, options),
                shared=shared,
                max_in_flight=IN_FLIGHT_PER_SLOT * slots,
            )
        ) as running,
    ):
        for index, result in running:
            finished[index] = result
            advance(parts[index].stop - parts[index].start)
    ordered = [finished[index] for index in range(len(parts))]
    return _merged_result(ref, inputs, ordered, blocks, spectra, executor.describe())
