"""The audit split into shards: the same result as one process, in this process and on a cluster.

A shard is a run of whole batches, so every onnxruntime call sees the inputs it sees in one
process; the merged per-input metrics and dominance cases must then equal the single-process ones
(the issue asks for layers.csv and the dominance fractions to 1e-9 relative; they are in fact
bitwise equal here). The cluster tests use a local Dask cluster of two worker processes, reached by
its tcp:// address like an existing cluster.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import itertools
import os
import pickle
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.executor import LocalExecutor, open_executor, own_threads, progress_bar
from oversmooth.importers.audit import cache as audit_cache
from oversmooth.importers.audit.cache import cached_value_spectra
from oversmooth.importers.audit.pipeline import AuditOptions, audit, open_model, prepare
from oversmooth.importers.audit.records import AuditResult
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import random_inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.runner import default_threads
from oversmooth.importers.value_spectra import blocks_spectra
from oversmooth.importers.zoo import file_sha256, lookup
from oversmooth.sharding import (
    IN_FLIGHT_PER_SLOT,
    SHARD_BYTES,
    SHARD_INPUTS,
    ModelFile,
    _batches_per_shard,
    _measure_shard,
    _model_file,
    _sees_file,
    _Shard,
    plan_shards,
    sharded_audit,
)
from tests.cluster import WORKERS, started_cluster
from tests.importers.builders import assemble
from tests.importers.head_split_blocks import batch_one_inside
from tests.realmodels import require_real_model

#: The audit module itself (the package attribute ``oversmooth.importers.audit.pipeline`` is the function).
audit_module = importlib.import_module("oversmooth.importers.audit.pipeline")
#: The issue's bound for the distributed report against the single-process one.
MERGE_RTOL = 1e-9
#: Seconds the scheduler may take to forget cancelled tasks.
CANCEL_WAIT_S = 10
SEED = 5


@given(n_items=st.integers(1, 200), batch_size=st.integers(1, 16), shards=st.integers(1, 12))
def test_shards_are_contiguous_runs_of_whole_batches(n_items, batch_size, shards) -> None:
    parts = plan_shards(n_items, batch_size, shards)
    n_batches = -(-n_items // batch_size)
    assert len(parts) == min(shards, n_batches)
    assert parts[0].start == 0
    assert parts[-1].stop == n_items
    for before, after in itertools.pairwise(parts):
        assert before.stop == after.start
        assert (before.stop - before.start) % batch_size == 0
    sizes = [-(-(part.stop - part.start) // batch_size) for part in parts]
    assert max(sizes) - min(sizes) <= 1


@given(
    n_items=st.integers(1, 200),
    batch_size=st.integers(1, 16),
    shards=st.integers(1, 12),
    max_batches=st.integers(1, 20),
)
def test_capped_shards_hold_at_most_the_cap_and_grow_with_the_inputs(
    n_items, batch_size, shards, max_batches
) -> None:
    parts = plan_shards(n_items, batch_size, shards, max_batches)
    n_batches = -(-n_items // batch_size)
    assert len(parts) == max(min(shards, n_batches), -(-n_batches // max_batches))
    assert [part.start for part in parts[1:]] == [part.stop for part in parts[:-1]]
    assert (parts[0].start, parts[-1].stop) == (0, n_items)
    assert all(part.stop - part.start <= max_batches * batch_size for part in parts)
    assert all((part.stop - part.start) % batch_size == 0 for part in parts[:-1])


def _image_inputs(n_items: int) -> Inputs:
    pixels = np.zeros((n_items, 3, 224, 224), np.float32)
    return Inputs(feeds={"pixels": pixels}, labels=[str(i) for i in range(n_items)], source="t")


def test_a_shard_is_capped_by_inputs_and_by_bytes(builder_model: Path) -> None:
    texts = random_inputs(load_model(builder_model).inputs, seed=0, batch=3, seq=6)
    assert _batches_per_shard(texts, 4) == SHARD_INPUTS // 4
    image_bytes = 3 * 224 * 224 * 4
    assert _batches_per_shard(_image_inputs(2), 4) == SHARD_BYTES // image_bytes // 4
    assert _batches_per_shard(_image_inputs(2), 1000) == 1  # at least one batch


def assert_same_report(one: AuditResult, other: AuditResult) -> None:
    """layers.csv rows and the dominance fractions agree to MERGE_RTOL; cases and blocks match."""
    rows, others = one.layer_rows(), other.layer_rows()
    assert [(r["layer"], r["metric"], r["n"]) for r in rows] == [
        (r["layer"], r["metric"], r["n"]) for r in others
    ]
    for key in ("mean", "std"):
        np.testing.assert_allclose(
            [r[key] for r in others], [r[key] for r in rows], rtol=MERGE_RTOL, equal_nan=True
        )
    summary, merged = one.dominance_summary(), other.dominance_summary()
    assert merged.cases == summary.cases
    for key in ("perron", "non_perron", "balanced"):
        assert getattr(merged, key) == pytest.approx(getattr(summary, key), rel=MERGE_RTOL)
    assert [(c.input, c.block, c.head, c.kind) for c in other.dominance] == [
        (c.input, c.block, c.head, c.kind) for c in one.dominance
    ]
    assert other.model == one.model
    assert other.inputs == one.inputs
    assert other.config == one.config
    assert other.notes == one.notes
    assert len(other.spectra) == len(one.spectra)


@pytest.fixture(scope="module")
def builder_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small post-LN BERT with a padding mask (bert_legacy)."""
    path = tmp_path_factory.mktemp("models") / "bert_legacy.onnx"
    onnx.save(assemble("bert_legacy", SEED).built.model, path)
    return path


def test_shards_in_this_process_merge_to_the_single_process_audit(builder_model: Path) -> None:
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=1, batch=11, seq=6, vocab_size=50)
    one = audit(graph, inputs, batch_size=2, provider="cpu")
    options = AuditOptions(batch_size=2, provider="cpu")
    merged = sharded_audit(graph, inputs, options, executor=LocalExecutor(), shards=4)
    assert_same_report(one, merged)
    assert merged.provenance.runner["shards"] == 4
    assert merged.provenance.runner["executor"]["kind"] == "local"


def test_shards_of_a_graph_that_fixes_batch_1_inside_say_so_like_one_process(
    tmp_path: Path,
) -> None:
    """Each shard's runner falls back to one input per call; the merged report notes it once."""
    path = tmp_path / "view.onnx"
    onnx.save(batch_one_inside(), path)
    graph = load_model(path)
    inputs = random_inputs(graph.inputs, seed=1, batch=5)
    one = audit(graph, inputs, batch_size=2, provider="cpu")
    options = AuditOptions(batch_size=2, provider="cpu")
    merged = sharded_audit(graph, inputs, options, executor=LocalExecutor(), shards=3)
    assert_same_report(one, merged)
    [note] = [note.text for note in merged.notes if "inside the graph" in note.text]
    assert merged.provenance.runner["one_input_per_call"] == note


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"threads": 0}, "`threads`"),
        ({"dominance": "both"}, "`dominance`"),
        ({"h": "folded"}, "`h`"),
    ],
)
def test_bad_options_are_refused_before_any_shard_is_sent(
    builder_model: Path, options: dict[str, object], fragment: str
) -> None:
    class NoShards(LocalExecutor):
        def map(self, *args, **kwargs):
            raise AssertionError("a shard was sent before the options were checked")

    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=1, batch=2, seq=6, vocab_size=50)
    with pytest.raises(ImporterInputError, match=fragment):
        sharded_audit(graph, inputs, AuditOptions(provider="cpu", **options), executor=NoShards())


class _Workers(LocalExecutor):
    """An executor whose workers answer ``sees`` to the question "do you see the model file?"."""

    def __init__(self, *sees: bool) -> None:
        self.sees = sees

    def on_workers(self, fn, *args):
        return {f"w{i}": answer for i, answer in enumerate(self.sees)}


def test_the_model_goes_by_path_only_when_every_worker_sees_it(builder_model: Path) -> None:
    graph = load_model(builder_model)
    assert _model_file(graph, _Workers(True, True)).data is None
    sent = _model_file(graph, _Workers(True, False))
    assert sent.data == builder_model.read_bytes()
    assert sent.sha256 == file_sha256(builder_model)


def test_a_worker_sees_a_file_only_with_the_same_sha256(builder_model: Path) -> None:
    digest = file_sha256(builder_model)
    assert _sees_file(str(builder_model), digest)
    assert not _sees_file(str(builder_model), "0" * 64)
    assert not _sees_file(str(builder_model.with_name("absent.onnx")), digest)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with started_cluster(tmp_path_factory.mktemp("dask")) as address:
        yield address


def _worker_pids(executor) -> list[int]:
    return sorted(executor.on_workers(os.getpid).values())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _interrupted_cluster() -> list[int]:
    """Open a local cluster, note its worker processes, press Ctrl-C inside the block."""
    pids: list[int] = []
    with open_executor("local", workers=WORKERS) as executor:
        pids += _worker_pids(executor)
        raise KeyboardInterrupt(pids)


def test_a_local_cluster_leaves_no_worker_behind_even_on_ctrl_c() -> None:
    with pytest.raises(KeyboardInterrupt) as caught:
        _interrupted_cluster()
    (pids,) = caught.value.args
    assert len(pids) == WORKERS
    assert os.getpid() not in pids
    assert not any(_alive(pid) for pid in pids)


def test_a_task_gets_its_share_of_its_hosts_cores(cluster: str) -> None:
    """Both workers of the test cluster are on this host, one thread each: half the cores each
    (at least one); in this process a task may use them all."""
    assert LocalExecutor().task_threads() == {"local": default_threads()}
    assert own_threads({"local": 3}) == 3
    share = max(1, default_threads() // WORKERS)
    with open_executor(cluster) as executor:
        threads = executor.task_threads()
        assert threads == dict.fromkeys(executor.on_workers(os.getpid), share)
        seen = executor.map(own_threads, [threads, threads])
        assert [value for _, value in seen] == [share, share]


def test_a_shard_runs_with_its_workers_share_unless_told(cluster: str, builder_model: Path) -> None:
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=4, batch=4, seq=6, vocab_size=50)
    share = max(1, default_threads() // WORKERS)
    options = {"batch_size": 2, "provider": "cpu", "cache": False}
    with open_executor(cluster) as executor:
        for threads, used in ((None, share), (3, 3)):
            chosen = AuditOptions(threads=threads, **options)
            merged = sharded_audit(graph, inputs, chosen, executor=executor)
            assert merged.provenance.runner["session_options"]["intra_op_num_threads"] == used
    one = audit(graph, inputs, threads=1, batch_size=2, provider="cpu")
    assert one.provenance.runner["session_options"]["intra_op_num_threads"] == 1
    assert_same_report(one, merged)
    with pytest.raises(ImporterInputError, match="`threads`"):
        audit(graph, inputs, threads=0)


#: This process's allocator setting, read when the tests are collected, before any cluster
#: starts (Dask's nanny writes its worker settings into the environment of the process it runs in).
_TRIM_THRESHOLD = os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_local_cluster_workers_keep_this_processs_allocator_settings(cluster: str) -> None:
    """Dask would start them with MALLOC_TRIM_THRESHOLD_=65536: an mmap per large array, so
    every batch's arrays page-faulted anew (about a fifth more CPU for a DINOv2 audit)."""
    with open_executor(cluster) as executor:
        seen = executor.on_workers(os.environ.get, "MALLOC_TRIM_THRESHOLD_")
    assert set(seen.values()) == {_TRIM_THRESHOLD}
    assert os.environ.get("MALLOC_TRIM_THRESHOLD_") == _TRIM_THRESHOLD


def test_the_cluster_executor_yields_every_task_once(cluster: str) -> None:
    """Also for two calls sending the same values: the first one's clean-up must not cancel the
    second one's (it did, while scattered values were keyed by their hash)."""
    with open_executor(cluster) as executor:
        assert executor.slots == WORKERS
        first = executor.map(pow, [2, 3, 4], shared={"exp": 3})
        second = executor.map(pow, [2, 3, 4], shared={"exp": 3})
        assert dict(first) == {0: 8, 1: 27, 2: 64}
        assert dict(second) == {0: 8, 1: 27, 2: 64}


def test_an_error_of_a_task_reaches_the_caller_as_itself(cluster: str) -> None:
    error = ImporterInputError("`batch_size` must be positive")
    with open_executor(cluster) as executor:
        running = executor.map(_raise, [error])
        with pytest.raises(ImporterInputError, match="batch_size"):
            dict(running)


def _raise(error: Exception) -> None:
    raise error


def _counted(values: Iterable[int], taken: list[int]) -> Iterator[int]:
    """``values``, each noted in ``taken`` when the executor takes it."""
    for value in values:
        taken.append(value)
        yield value


def test_the_cluster_takes_tasks_only_as_the_window_slides(cluster: str) -> None:
    window = 3
    taken: list[int] = []
    results: dict[int, int] = {}
    with open_executor(cluster) as executor:
        running = executor.map(pow, _counted(range(8), taken), shared={"exp": 2}, max_in_flight=3)
        assert len(taken) == window  # submitted at the call, the rest left in the iterator
        for index, result in running:
            results[index] = result
            assert len(taken) - len(results) < window
    assert results == {i: i**2 for i in range(8)}


def test_an_error_of_a_task_stops_taking_tasks(cluster: str) -> None:
    error = ImporterInputError("`batch_size` must be positive")
    taken: list[int] = []
    with open_executor(cluster) as executor:
        tasks = (error if value == 0 else value for value in _counted(range(5), taken))
        with pytest.raises(ImporterInputError, match="batch_size"):
            dict(executor.map(_raise, tasks, max_in_flight=1))
    assert taken == [0]


def _no_preparation(*args, **kwargs) -> None:
    raise AssertionError("a worker matched the graph or looked up the value spectra")


def _forbid_value_spectra(forbid: bool) -> None:
    """On a worker: preparing an audit (matching, value spectra from the cache) fails, or works."""
    audit_module.cached_value_spectra = _no_preparation if forbid else cached_value_spectra
    audit_module.find_attention_blocks = _no_preparation if forbid else find_attention_blocks


@contextlib.contextmanager
def _forbidden_on_workers(executor) -> Iterator[None]:
    executor.on_workers(_forbid_value_spectra, True)
    try:
        yield
    finally:
        executor.on_workers(_forbid_value_spectra, False)


def assert_same_per_input(one: AuditResult, other: AuditResult) -> None:
    assert other.metrics.keys() == one.metrics.keys()
    for name, values in one.metrics.items():
        np.testing.assert_allclose(other.metrics[name], values, rtol=MERGE_RTOL, equal_nan=True)
    assert set(other.dominance) == set(one.dominance)


@pytest.mark.parametrize("where", ["local", "cluster"])
def test_more_shards_than_slots_merge_to_the_single_process_audit(
    where: str, builder_model: Path, request: pytest.FixtureRequest, monkeypatch
) -> None:
    """One input per shard (the cap at 1): 7 shards through a window of 2 x slots; on the
    cluster the workers may not compute the value spectra (the client sends them)."""
    monkeypatch.setattr("oversmooth.sharding.SHARD_INPUTS", 1)
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=6, batch=7, seq=6, vocab_size=50)
    one = audit(graph, inputs, batch_size=1, provider="cpu")
    options = {"batch_size": 1, "provider": "cpu", "cache": False}
    with contextlib.ExitStack() as stack:
        executor = LocalExecutor()
        if where == "cluster":
            executor = stack.enter_context(open_executor(request.getfixturevalue("cluster")))
            stack.enter_context(_forbidden_on_workers(executor))
        merged = sharded_audit(graph, inputs, AuditOptions(**options), executor=executor)
    assert merged.provenance.runner["shards"] == 7
    assert_same_per_input(one, merged)
    assert_same_report(one, merged)


class _LoggedReader:
    """Reads items of ``inputs``, logging ``("read", start, stop)``."""

    def __init__(self, inputs: Inputs, log: list[tuple]) -> None:
        self.inputs, self.log, self.n_items = inputs, log, inputs.batch_size

    def read(self, start: int, stop: int):
        self.log.append(("read", start, stop))
        batch = self.inputs.read(start, stop)
        return batch.feeds, batch.token_mask

    def digest(self) -> str:
        return self.inputs.digest


class _Windowed(LocalExecutor):
    """In this process but like a cluster of ``slots`` threads: it takes ``max_in_flight`` tasks
    before running the first, one more after each; logs ``("done", index)``."""

    def __init__(self, slots: int, log: list[tuple]) -> None:
        self._slots, self.log = slots, log

    @property
    def slots(self) -> int:
        return self._slots

    def map(self, fn, tasks, *, shared=None, max_in_flight=None):
        self.max_in_flight = max_in_flight
        taken, waiting = enumerate(tasks), collections.deque()
        while True:
            while max_in_flight is None or len(waiting) < max_in_flight:
                task = next(taken, None)
                if task is None:
                    break
                waiting.append(task)
            if not waiting:
                return
            index, task = waiting.popleft()
            result = fn(task, **(shared or {}))
            self.log.append(("done", index))
            yield index, result


def test_shards_are_read_when_taken_at_most_a_window_at_once(
    builder_model: Path, monkeypatch
) -> None:
    """26 inputs, batch 2, at most 2 batches a shard: 7 shards, a window of 4 (2 slots)."""
    monkeypatch.setattr("oversmooth.sharding.SHARD_INPUTS", 4)
    graph = load_model(builder_model)
    log: list[tuple] = []
    lazy = random_inputs(graph.inputs, seed=4, batch=26, seq=6, vocab_size=50)
    executor = _Windowed(2, log)
    read = lazy.with_feeds(_LoggedReader(lazy, log))
    merged = sharded_audit(graph, read, AuditOptions(batch_size=2), executor=executor)
    starts = {part.start for part in plan_shards(26, 2, 2, 2)}
    assert len(starts) == 7
    assert executor.max_in_flight == IN_FLIGHT_PER_SLOT * 2
    reads = [entry[1:] for entry in log if entry[0] == "read" and entry[1:] != (0, 1)]
    assert reads == [(start, start + 2) for start in range(0, 26, 2)]  # each batch once, in order
    shard_events = [e for e in log if e[0] == "done" or (e[1] in starts and e[1:] != (0, 1))]
    alive = list(itertools.accumulate(-1 if e[0] == "done" else 1 for e in shard_events))
    assert max(alive) == IN_FLIGHT_PER_SLOT * 2
    assert_same_report(audit(graph, lazy, batch_size=2), merged)


class _InterruptedReader(_LoggedReader):
    """Ctrl-C while reading the item ``at``."""

    def __init__(self, inputs: Inputs, at: int) -> None:
        super().__init__(inputs, [])
        self.at = at

    def read(self, start: int, stop: int):
        if start <= self.at < stop:
            raise KeyboardInterrupt
        return super().read(start, stop)


def _scheduler_tasks(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def test_ctrl_c_while_a_shard_is_read_leaves_no_task_on_the_cluster(
    cluster: str, builder_model: Path, monkeypatch
) -> None:
    """7 shards of 2 inputs, 4 sent at once: item 9 is read while the workers run shards 0-3."""
    import distributed

    monkeypatch.setattr("oversmooth.sharding.SHARD_INPUTS", 2)
    graph = load_model(builder_model)
    lazy = random_inputs(graph.inputs, seed=7, batch=14, seq=6, vocab_size=50)
    inputs = lazy.with_feeds(_InterruptedReader(lazy, at=9))
    with open_executor(cluster) as executor, distributed.Client(cluster) as watcher:
        options = AuditOptions(batch_size=1, provider="cpu")
        with pytest.raises(KeyboardInterrupt):
            sharded_audit(graph, inputs, options, executor=executor)
        # the executor's client is still open: its tasks must be gone all the same
        deadline = time.monotonic() + CANCEL_WAIT_S
        while watcher.run_on_scheduler(_scheduler_tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watcher.run_on_scheduler(_scheduler_tasks) == 0


def test_the_value_spectra_are_computed_once_here_never_per_shard(
    builder_model: Path, monkeypatch, tmp_path: Path
) -> None:
    """Without the cache once per audit (not per shard); with it once per model."""
    monkeypatch.setenv("OVERSMOOTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("oversmooth.sharding.SHARD_INPUTS", 2)
    computed: list[int] = []

    def counted(blocks):
        computed.extend(block.index for block in blocks)
        return blocks_spectra(blocks)

    monkeypatch.setattr(audit_cache, "blocks_spectra", counted)
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=1, batch=6, seq=6, vocab_size=50)
    n_blocks = len(find_attention_blocks(graph).blocks)
    counts = []
    for cache in (False, True, True):
        computed.clear()
        options = AuditOptions(batch_size=1, provider="cpu", cache=cache)
        result = sharded_audit(graph, inputs, options, executor=LocalExecutor())
        assert result.provenance.runner["shards"] == 3
        counts.append(len(computed))
    assert counts == [n_blocks, n_blocks, 0]


def test_the_graph_is_matched_once_for_every_shard(builder_model: Path, monkeypatch) -> None:
    """The client prepares (matches, reads weights) once; a shard only measures."""
    monkeypatch.setattr("oversmooth.sharding.SHARD_INPUTS", 1)
    calls: list[str] = []

    def counted(name, function):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)

        monkeypatch.setattr(audit_module, name, wrapper)

    counted("find_attention_blocks", audit_module.find_attention_blocks)
    counted("block_weights", audit_module.block_weights)
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=1, batch=5, seq=6, vocab_size=50)
    options = AuditOptions(batch_size=1, provider="cpu")
    result = sharded_audit(graph, inputs, options, executor=LocalExecutor())
    assert result.provenance.runner["shards"] == 5
    assert calls.count("find_attention_blocks") == 1
    assert calls.count("block_weights") == result.model.n_blocks


def test_a_worker_receives_the_block_structure_without_weights(builder_model: Path) -> None:
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=1, batch=2, seq=6, vocab_size=50)
    prepared, _ = prepare(*open_model(graph), inputs, AuditOptions(provider="cpu"))
    sent = prepared.structure()
    assert not any(hasattr(block, "W_V") for block in sent.blocks)
    assert [b.attention_name for b in sent.blocks] == [b.attention_name for b in prepared.blocks]
    assert len(pickle.dumps(sent)) < len(pickle.dumps(prepared)) / 2


def test_a_model_sent_by_value_is_audited_on_a_worker_like_one_read_by_path(
    cluster: str, builder_model: Path
) -> None:
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=2, batch=5, seq=6, vocab_size=50)
    one = audit(graph, inputs, batch_size=2, provider="cpu")
    elsewhere = ModelFile(
        "/elsewhere/m.onnx", file_sha256(builder_model), builder_model.read_bytes()
    )
    prepared, _ = prepare(*open_model(graph), inputs, AuditOptions(batch_size=2, provider="cpu"))
    with open_executor(cluster) as executor:
        shared = {
            "model": elsewhere,
            "prepared": prepared.structure(),
            "threads": executor.task_threads(),
        }
        ((_, result),) = executor.map(_measure_shard, [_Shard(0, inputs)], shared=shared)
    for name, values in one.metrics.items():
        np.testing.assert_array_equal(result.metrics[name], values)
    assert result.dominance == one.dominance


@pytest.mark.parametrize(
    ("scheduler", "workers", "fragment"),
    [
        ("127.0.0.1:8786", None, "tcp://HOST:PORT"),
        ("tcp://127.0.0.1:1", None, "cannot connect"),
        (None, 2, "--scheduler local"),
        ("local", 0, "--workers"),
    ],
)
def test_a_bad_scheduler_is_refused(scheduler, workers, fragment, monkeypatch) -> None:
    monkeypatch.setattr("oversmooth.executor.CONNECT_TIMEOUT_S", 2)
    with (
        pytest.raises(ImporterInputError, match=fragment),
        open_executor(scheduler, workers=workers),
    ):
        pass


@pytest.mark.realmodel
def test_the_distributed_audit_of_minilm_l3_equals_the_local_one(cluster: str) -> None:
    path = require_real_model("minilm-l3")
    entry = lookup("minilm-l3").entry
    graph = load_model(path)
    inputs = random_inputs(graph.inputs, seed=3, batch=10, seq=16, vocab_size=1000)
    one = audit(graph, inputs, entry=entry, batch_size=3, provider="cpu")
    with open_executor(cluster) as executor:
        options = AuditOptions(batch_size=3, provider="cpu")
        merged = sharded_audit(graph, inputs, options, executor=executor, entry=entry)
        prepared, _ = prepare(*open_model(graph, entry), inputs, options)
        by_value = [
            result
            for _, result in executor.map(
                _measure_shard,
                [_Shard(0, inputs)],
                shared={
                    "model": ModelFile(
                        "/elsewhere/model.onnx", file_sha256(path), path.read_bytes()
                    ),
                    "prepared": prepared.structure(),
                    "threads": executor.task_threads(),
                },
            )
        ]
    assert_same_report(one, merged)
    assert merged.provenance.runner["executor"]["workers"] == WORKERS
    assert merged.provenance.runner["shards"] == WORKERS
    for name, values in one.metrics.items():
        np.testing.assert_array_equal(by_value[0].metrics[name], values)


def test_the_progress_bar_counts_items_with_their_rate(capsys: pytest.CaptureFixture[str]) -> None:
    with progress_bar(5, "input", enabled=True) as advance:
        advance(2)
        advance(3)
    err = capsys.readouterr().err
    assert "5/5" in err
    assert "input/s" in err
    with progress_bar(5, "input", enabled=False) as advance:
        advance(5)
    assert capsys.readouterr().err == ""
