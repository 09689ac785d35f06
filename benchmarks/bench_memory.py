"""Peak memory of ``oversmooth audit`` against the number of inputs: it should not grow.

Inputs are read batch by batch (:class:`~oversmooth.importers.inputs.feeds.Inputs` with a reader) and at most
two batches of outputs are alive at a time (one reduced while the next runs), so the peak resident
set of an audit of 1024 random inputs should be within 10 % of one of 64 (what remains per
input: the metric arrays, O(inputs x layers), and the dominance cases, about 280 bytes per
(input, block, head)). Each audit runs in a fresh interpreter; its peak RSS is the child's
``ru_maxrss`` from ``os.wait4``.

The same holds on a local Dask cluster (``--scheduler local --workers 2``, default for MiniLM-L3):
shards are capped in size and read only a window at a time (:mod:`oversmooth.sharding`). There
every process of the tree is sampled every :data:`SAMPLE_S` seconds (psutil; ``ru_maxrss`` would
be the largest of the client and the workers it reaped): printed are the peaks of the client and of
the largest worker, and the sum of every process's peak (shared pages counted once per process; an
upper bound of the tree's peak that does not depend on whether the workers peak at the same moment),
whose growth is checked.

Run with ``python -m benchmarks.bench_memory [--models NAME ...] [--counts N ...]
[--dominance head|layer|none] [--scheduler local --workers N]``. Without ``--models`` and
``--scheduler``: MiniLM-L3 and DINOv2 in one process, then MiniLM-L3 on a local cluster of two
workers. DINOv2 on 1024 inputs
takes long on a few cores (its dominance step solves 72 eigenproblems of 257 x 257 per input):
``--dominance none`` leaves that step out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_audit import AuditExitError, audit_command
from oversmooth.commands.common import positive_int

__all__ = ["Peak", "audit_peak", "main"]

DEFAULT_MODELS = ("minilm-l3", "dinov2-vits14")
DEFAULT_COUNTS = (64, 1024)
#: The models and workers of the default run on a local cluster.
CLUSTER_MODELS = ("minilm-l3",)
CLUSTER_WORKERS = 2
#: Allowed growth of the peak RSS from the smallest to the largest count.
GROWTH_TARGET = 0.10
#: Seconds between two samples of the process tree's resident sets.
SAMPLE_S = 0.05
MIB = 2**20


@dataclass(frozen=True)
class Peak:
    """One audit in a fresh interpreter: its peak resident set and wall time.

    ``peak_mib`` is the audit process's own (exact in one process, sampled on a cluster); on a
    cluster ``worker_mib`` is the largest peak of one of its child processes and ``tree_mib`` the
    sum of its and all its children's peaks (sampled), else None.
    """

    model: str
    n_inputs: int
    dominance: str
    peak_mib: float
    wall_s: float
    worker_mib: float | None = None
    tree_mib: float | None = None

    @property
    def total_mib(self) -> float:
        """What the growth is checked on: the tree's summed peaks on a cluster, else the process's."""
        return self.tree_mib if self.tree_mib is not None else self.peak_mib


class _TreeSampler:
    """Samples the resident sets of a process and its descendants until stopped.

    ``peaks`` holds every process's largest sample, by pid (the audit's own first).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peaks: dict[int, int] = {pid: 0}
        self.stopped = threading.Event()

    def _sample(self) -> None:
        import psutil

        try:
            processes = [psutil.Process(self.pid)]
            processes += processes[0].children(recursive=True)
        except psutil.Error:
            return
        for process in processes:
            try:
                rss = process.memory_info().rss
            except psutil.Error:  # ended between the listing and the reading
                continue
            self.peaks[process.pid] = max(self.peaks.get(process.pid, 0), rss)

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_S):
            self._sample()


@contextmanager
def _sampled(pid: int, enabled: bool) -> Iterator[_TreeSampler | None]:
    if not enabled:
        yield None
        return
    sampler = _TreeSampler(pid)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stopped.set()
        thread.join()


def audit_peak(
    model: str, n_inputs: int, dominance: str = "head", scheduler: Sequence[str] = ()
) -> Peak:
    """Run ``oversmooth audit MODEL --random N [SCHEDULER]`` in a fresh interpreter; its peak RSS.

    ``scheduler``: extra options such as ``("--scheduler", "local", "--workers", "2")``; then the
    process tree is sampled too.

    Raises
    ------
    AuditExitError
        The audit exited with a non-zero status (its last output line is in the message).
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report"
        options = ("--random", str(n_inputs), "--dominance", dominance, *scheduler)
        command = audit_command(model, out, *options)
        start = time.perf_counter()
        with subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        ) as child:
            with _sampled(child.pid, bool(scheduler)) as sampler:
                errors = child.stderr.read() if child.stderr else ""  # until the audit exits
                _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
    if child.returncode != 0:
        last = errors.strip().splitlines()[-1:] or ["no output"]
        raise AuditExitError(model, child.returncode, last[0])
    peak = Peak(model, n_inputs, dominance, usage.ru_maxrss / 1024, wall)
    if sampler is None:
        return peak
    own, *others = sampler.peaks.values()
    return dataclasses.replace(
        peak,
        peak_mib=own / MIB,
        worker_mib=max(others, default=0) / MIB,
        tree_mib=(own + sum(others)) / MIB,
    )


def _growth_text(peak: Peak, base: float) -> str:
    growth = peak.total_mib / base - 1
    flag = "" if growth <= GROWTH_TARGET else f"  (above the {GROWTH_TARGET:.0%} target)"
    return f"{growth:>+8.1%}{peak.wall_s:>9.1f} s{flag}"


def _print_model(model: str, counts: Sequence[int], dominance: str) -> None:
    base = None
    for count in counts:
        peak = audit_peak(model, count, dominance)
        base = base or peak.total_mib
        print(
            f"{model:<16}{peak.n_inputs:>7}  {dominance:<6}{peak.peak_mib:>9.0f} MiB"
            f"{_growth_text(peak, base)}",
            flush=True,
        )


def _print_cluster(model: str, counts: Sequence[int], dominance: str, workers: int) -> None:
    base = None
    scheduler = ("--scheduler", "local", "--workers", str(workers))
    for count in counts:
        peak = audit_peak(model, count, dominance, scheduler)
        base = base or peak.total_mib
        print(
            f"{model:<16}{peak.n_inputs:>7}  {dominance:<6}{peak.peak_mib:>9.0f} MiB"
            f"{peak.worker_mib or 0:>9.0f} MiB{peak.total_mib:>9.0f} MiB{_growth_text(peak, base)}",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Print the peak RSS of audits of each model on each number of random inputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--counts", nargs="+", type=positive_int, default=list(DEFAULT_COUNTS))
    parser.add_argument("--dominance", choices=("head", "layer", "none"), default="head")
    parser.add_argument("--scheduler", choices=("local",), help="only a local cluster")
    parser.add_argument("--workers", type=positive_int, default=CLUSTER_WORKERS)
    args = parser.parse_args(argv)
    counts = sorted(set(args.counts))
    both = args.models is None and args.scheduler is None
    if args.scheduler is None:
        print(f"peak RSS of `oversmooth audit MODEL --random N` (growth against N = {counts[0]})")
        print(f"{'model':<16}{'inputs':>7}  {'dom.':<6}{'peak':>13}{'growth':>8}{'wall':>11}")
        for model in args.models or DEFAULT_MODELS:
            _print_model(model, counts, args.dominance)
    if args.scheduler is not None or both:
        print(
            f"peak RSS of `oversmooth audit MODEL --random N --scheduler local --workers "
            f"{args.workers}` (growth of the summed peaks against N = {counts[0]})"
        )
        print(
            f"{'model':<16}{'inputs':>7}  {'dom.':<6}{'client':>13}{'worker':>13}{'sum':>13}"
            f"{'growth':>8}{'wall':>11}"
        )
        for model in args.models or CLUSTER_MODELS:
            _print_cluster(model, counts, args.dominance, args.workers)


if __name__ == "__main__":
    main()
