"""The audit on many workers: inputs split into shards, each audited where an executor runs it, merged.

:func:`sharded_audit` gives the :class:`~oversmooth.importers.audit.records.AuditResult` of
:func:`oversmooth.importers.audit.pipeline.audit` on the same model and inputs. Each shard is a run of whole batches
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
This process prepares the audit once (:func:`oversmooth.importers.audit.pipeline.prepare`: matching, weights, the
value spectra from the per-user cache, the notes) before any shard starts, exactly as the audit in
one process does; every worker receives the prepared block structure once with the model
(:meth:`~oversmooth.importers.audit.pipeline.PreparedAudit.structure`: tensor names, column indices and the
dominance step's H eigenvalues, no weights) and only measures
(:func:`oversmooth.importers.audit.pipeline.measure`), so no worker matches the graph, reads weights or computes
spectra. The result is built here by the same :func:`~oversmooth.importers.audit.pipeline.audit_result`.

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
    The audit of ``model`` on ``inputs``, its shards run by an :class:`~oversmooth.executor.Executor`.
plan_shards
    Split ``n`` inputs into runs of whole batches: ``k`` of them, more when one would be too big.
SHARD_INPUTS, SHARD_BYTES, IN_FLIGHT_PER_SLOT
    The shard size cap and the window of shards in flight.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oversmooth.executor import Executor, own_threads, progress_bar
from oversmooth.importers.audit.pipeline import (
    AuditOptions,
    Measurement,
    PreparedAudit,
    audit_result,
    measure,
    open_model,
    prepare,
)
from oversmooth.importers.audit.records import AuditResult, Note
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import OnnxModel, load_model
from oversmooth.importers.graph.index import uses_external_data
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.zoo import ZooModel, file_sha256

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
    """One task: the inputs ``start .. start + len(inputs)``."""

    start: int
    inputs: Inputs


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
    :class:`~oversmooth.importers.inputs.feeds.Inputs` has the same shape).
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


def _measure_shard(
    shard: _Shard, model: ModelFile, prepared: PreparedAudit, threads: dict[str, int]
) -> Measurement:
    """On a worker: :func:`~oversmooth.importers.audit.pipeline.measure` of one shard, inputs counted from 0.

    Unless the options fix ``threads``, the shard uses its worker's share of the host's cores
    (:meth:`~oversmooth.executor.Executor.task_threads`); the graph is loaded, never matched.
    """
    graph = load_model(_local_copy(model))
    return measure(  # every dominance case: the merge applies --dominance-inputs to all inputs
        prepared,
        graph,
        shard.inputs,
        threads=own_threads(threads),
        first_input=shard.start,
        stop_early=False,
    )


def _merged(parts: Sequence[Measurement], where: Mapping[str, object]) -> Measurement:
    """The shards' measurements as one, in input order (``parts`` already shifted)."""
    metrics = {
        name: np.concatenate([part.metrics[name] for part in parts], axis=0)
        for name in parts[0].metrics
    }
    attention_part = {
        name: np.concatenate([part.attention_part[name] for part in parts], axis=0)
        for name in parts[0].attention_part
    }
    runner = {**parts[0].runner, "executor": dict(where), "shards": len(parts)}
    one_per_call = [part.runner.get("one_input_per_call") for part in parts]  # any shard's
    runner["one_input_per_call"] = next((note for note in one_per_call if note), None)
    cases = [case for part in parts for case in part.dominance]
    exact = [case for part in parts for case in part.operator]
    to_host = {
        key: sum(part.attention_to_host.get(key, 0) for part in parts)
        for key in parts[0].attention_to_host
    }
    heads = [case for part in parts for case in part.heads]
    stream = {
        name: np.concatenate([part.stream[name] for part in parts], axis=0)
        for name in parts[0].stream
    }
    return Measurement(
        metrics,
        cases,
        parts[0].provider,
        runner,
        attention_part,
        exact,
        to_host,
        heads,
        stream,
        [case for part in parts for case in part.operating],
        [case for part in parts for case in part.attribution],
    )


def _provider_notes(parts: Sequence[Measurement]) -> list[Note]:
    used = {part.provider.used for part in parts}
    if len(used) == 1:
        return []
    kinds = "; ".join(", ".join(providers) for providers in sorted(used))
    return [Note("providers", f"the workers ran different onnxruntime providers: {kinds}")]


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


def _shards(inputs: Inputs, parts: Sequence[slice], batch_size: int) -> Iterator[_Shard]:
    """The shards in order, each one's inputs read (into memory) only when it is taken."""
    for part in parts:
        yield _Shard(part.start, _read_shard(inputs, part, batch_size))


def sharded_audit(
    model: str | os.PathLike[str] | OnnxModel,
    inputs: Inputs | None = None,
    options: AuditOptions | None = None,
    *,
    executor: Executor,
    entry: ZooModel | None = None,
    shards: int | None = None,
) -> AuditResult:
    """:func:`~oversmooth.importers.audit.pipeline.run_audit` with the measurement split into shards on ``executor``.

    Parameters
    ----------
    model : str, path or OnnxModel
        As for :func:`~oversmooth.importers.audit.pipeline.open_model` (a model loaded from a file).
    inputs : Inputs, optional
        Default: the bundled inputs of the model's kind.
    options : AuditOptions, optional
        As for the audit in one process; ``threads`` are the cores of each shard (default its
        worker's share of its host's cores, :meth:`~oversmooth.executor.Executor.task_threads`),
        ``progress`` a bar of inputs done, moving as shards finish.
    executor : Executor
        Where the shards run (:func:`oversmooth.executor.open_executor`).
    entry : ZooModel, optional
        The zoo entry of an already loaded ``model``.
    shards : int, optional
        How many shards at least (default: the executor's ``slots``, one per worker thread: each
        shard builds its own onnxruntime session, so more shards cost more set-up); more when a
        shard would exceed :data:`SHARD_INPUTS` or :data:`SHARD_BYTES`.

    Returns
    -------
    AuditResult
        Its provenance's ``runner`` record also names the executor and the number of shards.
    """
    options = AuditOptions() if options is None else options
    ref, graph = open_model(model, entry)
    prepared, inputs = prepare(ref, graph, inputs, options)  # refused here, before any worker
    batch_size, slots = options.batch_size, executor.slots
    parts = plan_shards(
        inputs.batch_size, batch_size, shards or slots, _batches_per_shard(inputs, batch_size)
    )
    shared = {
        "model": _model_file(graph, executor),
        "prepared": prepared.structure(),
        "threads": executor.task_threads(),
    }
    finished: dict[int, Measurement] = {}
    with (
        progress_bar(inputs.batch_size, "input", enabled=options.progress) as advance,
        contextlib.closing(
            executor.map(
                _measure_shard,
                _shards(inputs, parts, batch_size),
                shared=shared,
                max_in_flight=IN_FLIGHT_PER_SLOT * slots,
            )
        ) as running,
    ):
        for index, part in running:
            finished[index] = part.shifted(parts[index].start)
            advance(parts[index].stop - parts[index].start)
    ordered = [finished[index] for index in range(len(parts))]
    merged = _merged(ordered, executor.describe())
    return audit_result(prepared, inputs, merged, notes=_provider_notes(ordered))
