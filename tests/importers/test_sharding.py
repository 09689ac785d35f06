"""The audit split into shards: the same result as one process, in this process and on a cluster.

A shard is a run of whole batches, so every onnxruntime call sees the inputs it sees in one
process; the merged per-input metrics and dominance cases must then equal the single-process ones
(the issue asks for layers.csv and the dominance fractions to 1e-9 relative; they are in fact
bitwise equal here). The cluster tests use a local Dask cluster of two worker processes, reached by
its tcp:// address like an existing cluster.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from importers.errors import ImporterInputError
from importers.executor import LocalExecutor, open_executor, progress_bar
from importers.graph import load_model
from importers.run.audit import audit
from importers.run.records import AuditResult
from importers.run.sharding import (
    ModelFile,
    _audit_shard,
    _model_file,
    _sees_file,
    _Shard,
    plan_shards,
    sharded_audit,
)
from importers.run.sources import random_inputs
from importers.zoo import file_sha256, lookup
from tests.cluster import WORKERS, started_cluster
from tests.importers.builders import assemble
from tests.realmodels import require_real_model

#: The issue's bound for the distributed report against the single-process one.
MERGE_RTOL = 1e-9
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
    assert [(c.input, c.layer, c.head, c.kind) for c in other.dominance] == [
        (c.input, c.layer, c.head, c.kind) for c in one.dominance
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
    merged = sharded_audit(
        graph, inputs, executor=LocalExecutor(), batch_size=2, shards=4, provider="cpu"
    )
    assert_same_report(one, merged)
    assert merged.provenance.runner["shards"] == 4
    assert merged.provenance.runner["executor"]["kind"] == "local"


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


def test_a_model_sent_by_value_is_audited_on_a_worker_like_one_read_by_path(
    cluster: str, builder_model: Path
) -> None:
    graph = load_model(builder_model)
    inputs = random_inputs(graph.inputs, seed=2, batch=5, seq=6, vocab_size=50)
    one = audit(graph, inputs, batch_size=2, provider="cpu")
    elsewhere = ModelFile(
        "/elsewhere/m.onnx", file_sha256(builder_model), builder_model.read_bytes()
    )
    shard = _Shard(0, inputs, None, {"batch_size": 2, "provider": "cpu"})
    with open_executor(cluster) as executor:
        ((_, result),) = executor.map(_audit_shard, [shard], shared={"model": elsewhere})
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
    monkeypatch.setattr("importers.executor.CONNECT_TIMEOUT_S", 2)
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
        merged = sharded_audit(
            graph, inputs, executor=executor, entry=entry, batch_size=3, provider="cpu"
        )
        by_value = [
            result
            for _, result in executor.map(
                _audit_shard,
                [_Shard(0, inputs, entry, {"batch_size": 3, "provider": "cpu"})],
                shared={
                    "model": ModelFile(
                        "/elsewhere/model.onnx", file_sha256(path), path.read_bytes()
                    )
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
