"""The audit on many workers: inputs split into shards, each audited where an executor runs it, merged.

:func:`sharded_audit` gives the :class:`~importers.run.records.AuditResult` of
:func:`importers.run.audit.audit` on the same model and inputs. Each shard is a run of whole batches
(``batch_size`` inputs each, the last one possibly short), so every onnxruntime call sees exactly
the inputs it sees in a single-process run; a shard's result is its per-input metric rows and its
dominance cases (input indices shifted by the shard's start), and the merge concatenates them in
input order. Means, standard deviations and dominance fractions are then computed from the same
per-input values as in one process.

While the workers run, this process matches the model's attention blocks, reads their weights and
computes the value spectra the report needs (the workers send back no weights).

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
    Split ``n`` inputs into at most ``k`` runs of whole batches.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from importers.errors import ImporterInputError
from importers.executor import Executor, progress_bar
from importers.graph import OnnxModel, load_model
from importers.graph.index import uses_external_data
from importers.match import check_complete, find_attention_blocks
from importers.run.audit import audit
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
from importers.value_spectra import model_spectra
from importers.weights import block_weights
from importers.zoo import ModelRef, ZooModel, file_sha256, lookup
from simulator.validation import check_positive_int

__all__ = ["ModelFile", "plan_shards", "sharded_audit"]


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


def plan_shards(n_items: int, batch_size: int, shards: int) -> list[slice]:
    """Split items ``0 .. n_items`` into at most ``shards`` runs of whole batches.

    Returns contiguous slices in order, each of a whole number of ``batch_size`` batches (the last
    may end with a short batch), as equal in batches as possible; fewer slices when there are
    fewer batches.
    """
    n_batches = -(-n_items // batch_size)
    count = max(1, min(shards, n_batches))
    bounds = [(i * n_batches) // count for i in range(count + 1)]
    return [
        slice(bounds[i] * batch_size, min(bounds[i + 1] * batch_size, n_items))
        for i in range(count)
    ]


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


def _audit_shard(shard: _Shard, model: ModelFile) -> _ShardResult:
    """On a worker: :func:`~importers.run.audit.audit` of one shard."""
    result = audit(load_model(_local_copy(model)), shard.inputs, entry=shard.entry, **shard.options)
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
    spectra: list[Any],
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
        spectra=spectra,
        config=first.config,
        provenance=dataclasses.replace(
            first.provenance, runner=runner, inputs_digest=inputs.digest
        ),
        notes=[*first.notes, *_provider_notes(results)],
    )


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
        How many shards (default: the executor's ``slots``, one per worker thread: each shard
        builds its own onnxruntime session, so more shards cost more set-up).
    partial : bool
        Audit a model whose attention is only partly matched.
    progress : bool
        A progress bar of inputs done (stderr), moving as shards finish.
    **options
        The other keyword arguments of :func:`~importers.run.audit.audit` (``provider``,
        ``exclude_prefix``, ``dominance``, ``fold_gamma``, ``spectral``, ``tie_rtol``).

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
    options = {**options, "batch_size": batch_size, "partial": partial}
    parts = plan_shards(inputs.batch_size, batch_size, shards or executor.slots)
    tasks = [_Shard(part.start, inputs.subset(part), ref.entry, options) for part in parts]
    finished: dict[int, _ShardResult] = {}
    with progress_bar(inputs.batch_size, "input", enabled=progress) as advance:
        running = executor.map(_audit_shard, tasks, shared={"model": _model_file(graph, executor)})
        # while the workers run: what the report needs besides their results
        blocks = [block_weights(graph, block) for block in report.blocks]
        with threadpool_limits(limits=1, user_api="blas"):
            spectra = model_spectra(blocks)
        for index, result in running:
            finished[index] = result
            advance(tasks[index].inputs.batch_size)
    ordered = [finished[index] for index in range(len(tasks))]
    return _merged_result(ref, inputs, ordered, blocks, spectra, executor.describe())
