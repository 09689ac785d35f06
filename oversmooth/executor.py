"""Where parallel work runs: in this process, or on the workers of a Dask cluster.

The distributed audit (:mod:`oversmooth.sharding`) and ``oversmooth sweep`` hand their work to
an :class:`Executor` as independent tasks, ``fn(task, **shared)``, and merge the results in task
order, so the answer does not depend on where a task ran. Three places (``--scheduler``):

``None`` (no option)
    :class:`LocalExecutor`: every task in this process, one after the other.
``"local"``
    A Dask ``LocalCluster`` on this machine (``workers`` processes, one thread each, no dashboard,
    its files in a temporary folder), started here and shut down when the executor closes.
``"tcp://host:port"`` (or ``tls://``)
    The workers of an existing Dask cluster; tasks still running when the executor closes are
    cancelled, the cluster itself is left running.

Closing always happens (a ``with`` block, Ctrl-C included): a local cluster never leaves worker
processes behind. Tasks reach the workers by value (pickled); ``shared`` values are sent to every
worker once. Tasks may come from a lazy iterable: with ``max_in_flight`` at most that many are
taken from it and submitted before one finishes (a sliding window), so tasks that carry data (the
audit's shards) are built, and held in memory, only a few at a time. Functions are pickled by
reference, so every worker must have ``oversmooth`` (and its dependencies) installed, at the same
version as this process.

``distributed`` is imported only when a cluster is asked for.

Public API
----------
Executor
    ``map(fn, tasks, shared=..., max_in_flight=...)`` yields ``(index, result)`` as tasks finish;
    ``on_workers``, ``slots``, ``task_threads()`` (the cores a task may use), ``describe()``.
own_threads
    Inside a task, its worker's entry of ``task_threads()``.
LocalExecutor
    Runs everything in this process.
local_cluster
    A Dask ``LocalCluster`` on this machine, shut down on exit.
open_executor
    The executor for a ``--scheduler`` value, as a context manager.
progress_bar
    A tqdm bar counting items (inputs, cells) with their rate and the time left.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from oversmooth.importers.errors import ClusterError, ImporterInputError
from oversmooth.importers.runtime.runner import default_threads
from oversmooth.simulator.output import package_versions
from oversmooth.simulator.validation import check_positive_int

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Executor",
    "LocalExecutor",
    "local_cluster",
    "open_executor",
    "own_threads",
    "progress_bar",
]

#: Seconds to wait for an existing scheduler to answer, and for its first worker.
CONNECT_TIMEOUT_S = 20
#: Dask settings of a local cluster's worker environment: ``None`` leaves a variable unset. Dask's
#: ``MALLOC_TRIM_THRESHOLD_=65536`` cost the DINOv2 audit 18-22 % more CPU per worker (8 inputs on
#: one core, three interleaved runs: 11.7-12.7 s against 9.6-10.8 s).
_WORKER_ENVIRONMENT = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
#: Times one task is sent to the cluster when a lost worker takes its data with it (its result
#: cancelled as "already forgotten"): once, then again on another worker, and a last time.
TASK_ATTEMPTS = 3
#: Seconds to wait before sending a task again whose worker died while it was being sent (the
#: scheduler then drops that worker from the ones it sends to).
SCATTER_RETRY_S = 1.0
#: Accepted scheduler addresses besides ``local``.
_ADDRESS = re.compile(r"^(tcp|tls)://[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")
#: What :meth:`Executor.map` returns: ``(task index, result)`` as tasks finish; closing it cancels.
Results = Generator[tuple[int, Any], None, None]


class Executor(Protocol):
    """Runs independent tasks and yields their results as they finish."""

    @property
    def slots(self) -> int:
        """How many tasks run at once (worker threads in all; 1 in this process)."""
        ...

    def map(
        self,
        fn: Callable[..., Any],
        tasks: Iterable[Any],
        *,
        shared: Mapping[str, Any] | None = None,
        max_in_flight: int | None = None,
    ) -> Results:
        """Yield ``(i, fn(task_i, **shared))`` for every task, in the order they finish.

        ``tasks`` is consumed lazily. On a cluster the first ``max_in_flight`` tasks (default: all)
        are taken and submitted at the call, before the first result is asked for, and the next
        one each time a result is taken, so at most ``max_in_flight`` are submitted and not yet
        taken; in this process each task is taken and run when its result is asked for.

        An error of a task is raised here (the task's own exception type when it is importable,
        e.g. an :class:`~oversmooth.simulator.errors.OversmoothError`); the remaining tasks are cancelled and
        no further task is taken. So are they when the returned generator is closed.
        """
        ...

    def on_workers(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """``fn(*args)`` once on every worker: ``{worker address: result}``."""
        ...

    def task_threads(self) -> dict[str, int]:
        """Per worker address (``"local"`` here), how many cores one task there may use.

        A host's usable cores shared among the tasks that run on it at once (the worker
        threads of every worker process on that host), at least one: tasks that each took every
        core would oversubscribe the host. Read it inside a task with :func:`own_threads`.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Where the work ran, for provenance records."""
        ...


class LocalExecutor:
    """Every task in this process, in order."""

    @property
    def slots(self) -> int:
        return 1

    def map(
        self,
        fn: Callable[..., Any],
        tasks: Iterable[Any],
        *,
        shared: Mapping[str, Any] | None = None,
        max_in_flight: int | None = None,
    ) -> Results:
        for index, task in enumerate(tasks):
            yield index, fn(task, **(shared or {}))

    def on_workers(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        return {"local": fn(*args)}

    def task_threads(self) -> dict[str, int]:
        return {"local": default_threads()}

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "scheduler": None, "workers": 1, "slots": 1}


class _DaskExecutor:
    """Tasks on the workers of a Dask cluster through ``client``."""

    def __init__(self, client: Any, scheduler: str) -> None:
        self._client = client
        self._scheduler = scheduler

    def _workers(self) -> dict[str, Any]:
        return dict(self._client.scheduler_info(n_workers=-1)["workers"])

    @property
    def slots(self) -> int:
        return max(1, sum(int(info.get("nthreads", 1)) for info in self._workers().values()))

    def map(
        self,
        fn: Callable[..., Any],
        tasks: Iterable[Any],
        *,
        shared: Mapping[str, Any] | None = None,
        max_in_flight: int | None = None,
    ) -> Results:
        if max_in_flight is not None:
            max_in_flight = check_positive_int(
                max_in_flight, "max_in_flight", error=ImporterInputError
            )
        # unique keys (hash=False): a value scattered again must not share its key with the
        # futures an earlier call is cancelling
        common = {
            key: self._client.scatter(value, broadcast=True, hash=False)
            for key, value in (shared or {}).items()
        }
        window = _Window(self._client, fn, common, iter(tasks))
        try:  # the first tasks start now, before the first result is asked for
            while max_in_flight is None or len(window.running) < max_in_flight:
                if not window.submit_next():
                    break
        except BaseException:
            window.cancel()
            raise
        return self._collect(window)

    def _collect(self, window: _Window) -> Results:
        try:
            for future in window.finished:
                result = _result(future)
                if result is _LOST:
                    window.resubmit(future, self._scheduler)
                    continue
                yield window.done(future), result
                window.submit_next()
        finally:  # an error, Ctrl-C or a closed generator: nothing keeps running
            window.cancel()

    def on_workers(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
        return dict(self._client.run(fn, *args))

    def task_threads(self) -> dict[str, int]:
        workers = self._workers()
        cores = self.on_workers(default_threads)
        slots_on_host: Counter[str] = Counter()
        for info in workers.values():
            slots_on_host[info.get("host", "")] += int(info.get("nthreads", 1))
        return {
            address: max(1, int(cores.get(address, 1)) // slots_on_host[info.get("host", "")])
            for address, info in workers.items()
        }

    def describe(self) -> dict[str, Any]:
        workers = self._workers()
        return {
            "kind": "dask",
            "scheduler": self._scheduler,
            "workers": len(workers),
            "slots": sum(int(info.get("nthreads", 1)) for info in workers.values()),
            "versions": package_versions(("dask", "distributed")),
        }


class _Window:
    """The tasks of one :meth:`_DaskExecutor.map` on the cluster: submitted, running, released.

    Each task is scattered on its own (its data is stored on one worker, not in the task graph)
    and released as soon as its result is taken. A worker that dies takes the data scattered to
    it along: Dask cannot run the task elsewhere and forgets it. The task itself is kept here
    until its result is taken (the window bounds how many are) and sent again, to whatever workers
    are left, up to :data:`TASK_ATTEMPTS` times (:meth:`resubmit`).
    """

    def __init__(
        self, client: Any, fn: Callable[..., Any], common: dict[str, Any], tasks: Iterator[Any]
    ) -> None:
        from distributed import as_completed

        self._client = client
        self._fn = fn
        self._common = common
        self._tasks = enumerate(tasks)
        self.finished = as_completed()
        #: future key -> the task's index, its future, its scattered data, the task, attempts
        self.running: dict[str, _Sent] = {}

    def submit_next(self) -> bool:
        """Take the next task and submit it; False when there is none left."""
        taken = next(self._tasks, None)
        if taken is None:
            return False
        self._send(*taken, attempts=1)
        return True

    def _send(self, position: int, task: Any, *, attempts: int) -> None:
        data = self._scattered(task)
        future = self._client.submit(self._fn, data, **self._common, pure=False)
        self.running[future.key] = _Sent(position, future, data, task, attempts)
        self.finished.add(future)

    def _scattered(self, task: Any) -> Any:
        """``task`` stored on a worker (a list: any task is one value). A worker that dies while
        it is being sent closes the connection: it is sent again, to the workers left, up to
        :data:`TASK_ATTEMPTS` times, then :class:`ClusterError` (one line)."""
        attempt = 1
        while True:
            try:
                (data,) = self._client.scatter([task], hash=False)
                return data
            except OSError as err:  # distributed's CommClosedError is one
                if attempt >= TASK_ATTEMPTS:
                    raise ClusterError(
                        f"the Dask cluster took no task after {attempt} attempts: a worker's "
                        f"connection closed ({type(err).__name__}); see the worker logs"
                    ) from None
                attempt += 1
                time.sleep(SCATTER_RETRY_S)

    def resubmit(self, future: Any, scheduler: str) -> None:
        """Send again a task whose data a lost worker took along, unless it has had its
        :data:`TASK_ATTEMPTS` or no worker is left (then :class:`ClusterError`, one line)."""
        sent = self.running.pop(future.key)
        workers = len(self._client.scheduler_info(n_workers=-1)["workers"])
        if sent.attempts >= TASK_ATTEMPTS or workers == 0:
            why = "no worker is left" if workers == 0 else f"{sent.attempts} times"
            raise ClusterError(
                f"the Dask cluster at {scheduler} lost task {sent.position} with a worker that "
                f"died ({why}); see the worker logs"
            )
        self._send(sent.position, sent.task, attempts=sent.attempts + 1)

    def done(self, future: Any) -> int:
        """Forget a finished task (its scattered data is released); return its index."""
        return self.running.pop(future.key).position

    def cancel(self) -> None:
        """Cancel every task still running, their data and the shared values."""
        left = [item for sent in self.running.values() for item in (sent.future, sent.data)]
        self.running.clear()
        self._client.cancel([*left, *self._common.values()])


class _Sent(NamedTuple):
    """One task on the cluster: its position, future, scattered data, the task, attempts so far."""

    position: int
    future: Any
    data: Any
    task: Any
    attempts: int


#: :func:`_result` of a task whose data a lost worker took along (sent again, not a result).
_LOST = object()


def own_threads(task_threads: Mapping[str, int]) -> int | None:
    """Inside a task: this worker's entry of :meth:`Executor.task_threads` (None if it has none).

    In this process (no Dask worker) the ``"local"`` entry.
    """
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):  # not on a Dask worker
        address = "local"
    return task_threads.get(address)


def _result(future: Any) -> Any:
    """The future's result; :data:`_LOST` where the cluster forgot the task because a worker that
    died held its data (Dask cancels it); a task that killed its workers again and again is a
    :class:`ClusterError`, one line."""
    from concurrent.futures import CancelledError

    from distributed import KilledWorker

    try:
        return future.result()
    except CancelledError:  # only the cluster cancels while results are taken
        return _LOST
    except KilledWorker as err:
        raise ClusterError(
            f"a Dask worker died running a task ({err}); see the worker logs"
        ) from None


def _check_scheduler(scheduler: str) -> str:
    if scheduler != "local" and not _ADDRESS.match(scheduler):
        raise ImporterInputError(
            f"`--scheduler` must be `local` or a Dask scheduler address tcp://HOST:PORT; "
            f"got {scheduler!r}"
        )
    return scheduler


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ImporterInputError(
            f"`--scheduler` needs the `distributed` package (pip install distributed); {err}"
        ) from None
    return distributed


@contextlib.contextmanager
def _children_ignore_ctrl_c() -> Iterator[None]:
    """Processes started inside inherit an ignored SIGINT (this process's own handling returns after).

    The terminal sends Ctrl-C to the whole process group: the workers of a local cluster would
    each print a traceback. This process handles it instead, shutting them down. A Ctrl-C while
    the workers start (a second or two) is lost. Outside the main thread nothing is changed.
    """
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def local_cluster(workers: int, folder: str | None = None) -> Iterator[tuple[Any, str]]:
    """Start a Dask ``LocalCluster`` here; yield a client and the scheduler's address.

    ``workers`` processes of one thread each, no dashboard, the workers' files in ``folder``
    (default: a temporary folder removed afterwards). Shut down on exit, Ctrl-C included.

    The workers keep glibc's own allocator settings: Dask starts its workers with
    ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand freed memory back to the system at once), which
    also fixes the threshold above which every allocation is a fresh ``mmap``, so each batch's
    attention stacks and Gram matrices were page-faulted in anew (:data:`_WORKER_ENVIRONMENT`).
    A variable set in this process's own environment still reaches the workers.
    """
    distributed = _distributed()
    import dask

    scratch = folder or tempfile.mkdtemp(prefix="oversmooth-dask-")
    cluster_options = {
        "n_workers": workers,
        "threads_per_worker": 1,
        "processes": True,
        "dashboard_address": None,
        # its HTTP server (metrics, health) on a free port: 8787 may be taken
        "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"},
        "worker_dashboard_address": None,
        # Dask's own log lines are not ours to print: even at CRITICAL it logs a traceback when a
        # Ctrl-C closes the scheduler's connections mid-message. Failures reach the user as one
        # line through the futures (ClusterError, the task's own error).
        "silence_logs": logging.CRITICAL + 1,
        "local_directory": scratch,
    }
    try:
        # the scheduler keeps its folder under dask's temporary-directory: there too
        with dask.config.set({"temporary-directory": scratch, **_WORKER_ENVIRONMENT}):
            with _children_ignore_ctrl_c():
                cluster = distributed.LocalCluster(**cluster_options)
            with cluster, distributed.Client(cluster) as client:
                yield client, cluster.scheduler_address
    finally:
        if folder is None:
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _remote_cluster(scheduler: str) -> Iterator[tuple[Any, str]]:
    distributed = _distributed()
    try:
        client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as err:
        raise ImporterInputError(
            f"`--scheduler` must be a reachable Dask scheduler; cannot connect to {scheduler!r}: "
            f"{err}"
        ) from None
    try:
        try:
            client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
        except TimeoutError:
            raise ImporterInputError(
                f"`--scheduler` must have workers; the cluster at {scheduler!r} has none after "
                f"{CONNECT_TIMEOUT_S} s"
            ) from None
        yield client, scheduler
    finally:
        client.close()


@contextlib.contextmanager
def open_executor(
    scheduler: str | None = None, *, workers: int | None = None
) -> Iterator[Executor]:
    """The executor for a ``--scheduler`` value; closed (a local cluster shut down) on exit.

    Parameters
    ----------
    scheduler : str, optional
        None (this process), ``"local"`` (a new local cluster) or ``"tcp://host:port"``.
    workers : int, optional
        Worker processes of a local cluster (default: the cores this process may use); only with
        ``scheduler="local"``.

    Raises
    ------
    ImporterInputError
        A malformed address, ``workers`` without ``"local"``, a scheduler that cannot be reached
        or has no workers.
    """
    if workers is not None:
        workers = check_positive_int(workers, "--workers", error=ImporterInputError)
        if scheduler != "local":
            raise ImporterInputError(
                f"`--workers` needs `--scheduler local` (it sizes a local cluster); got "
                f"--scheduler {scheduler!r}"
            )
    if scheduler is None:
        yield LocalExecutor()
        return
    cluster = (
        local_cluster(workers or default_threads())
        if _check_scheduler(scheduler) == "local"
        else _remote_cluster(scheduler)
    )
    with cluster as (client, address):
        yield _DaskExecutor(client, address)


@contextlib.contextmanager
def progress_bar(total: int, unit: str, *, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A callback ``advance(n)`` moving a tqdm bar on stderr (items per second, time left)."""
    if not enabled:
        yield lambda _n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, unit=unit, desc="oversmooth", smoothing=0.1) as bar:
        yield bar.update
