"""The cluster executor survives a lost worker (issue 34): a task whose worker dies is sent again
to the workers left, its result taken once; a task that kills every worker it meets ends the run
with one line (:class:`~oversmooth.importers.errors.ClusterError`, exit status 1), nothing left running.

Each test starts its own two-worker local cluster: a worker is killed on purpose, which the other
tests' shared cluster must not see.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oversmooth.executor import open_executor
from oversmooth.importers.errors import ClusterError
from tests.cluster import started_cluster


def _square_or_die(task: tuple[int, str]) -> int:
    """``value²``; the first time value 3 runs, its worker process dies at once (a marker file
    remembers it, so the run on another worker succeeds). Dask runs a task where its scattered
    data lies, so the data dies with the worker."""
    value, marker = task
    if value == 3 and not Path(marker).exists():
        Path(marker).touch()
        os._exit(1)
    return value * value


def _always_die(_task: int) -> int:
    os._exit(1)


def test_a_task_whose_worker_dies_runs_again_on_the_workers_left(tmp_path: Path) -> None:
    marker = tmp_path / "died"
    with started_cluster(tmp_path / "dask") as address, open_executor(address) as executor:
        results = list(executor.map(_square_or_die, [(v, str(marker)) for v in range(8)]))
    assert marker.exists()  # a worker died holding task 3
    assert sorted(index for index, _ in results) == list(range(8))  # each result taken once
    assert dict(results) == {v: v * v for v in range(8)}


def test_a_task_that_kills_every_worker_it_meets_ends_the_run_in_one_line(tmp_path: Path) -> None:
    with started_cluster(tmp_path / "dask") as address, open_executor(address) as executor:
        with pytest.raises(ClusterError, match="died") as raised:
            dict(executor.map(_always_die, [0]))
    assert "\n" not in str(raised.value)


class _FlakyClient:
    """A client whose scatter fails ``failures`` times as a dying worker's connection does."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def scatter(self, values: list[object], hash: bool) -> list[object]:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError("in <TCP (closed) ConnectionPool.scatter>: Stream is closed")
        return [("stored", values[0])]


@pytest.mark.parametrize(("failures", "sent"), [(0, True), (2, True), (3, False)])
def test_a_task_sent_to_a_worker_that_dies_is_sent_again_then_named(
    monkeypatch: pytest.MonkeyPatch, failures: int, sent: bool
) -> None:
    from oversmooth import executor as executor_module

    monkeypatch.setattr(executor_module, "SCATTER_RETRY_S", 0.0)
    window = executor_module._Window.__new__(executor_module._Window)
    window._client = _FlakyClient(failures)
    if sent:
        assert window._scattered("task") == ("stored", "task")
        assert window._client.calls == failures + 1
    else:
        with pytest.raises(ClusterError, match="took no task after 3 attempts"):
            window._scattered("task")
