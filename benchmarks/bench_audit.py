"""The audit's cost: instrumented inference overhead, and ``oversmooth audit`` end to end.

1. Overhead. For each installed zoo model, the audit's own :class:`importers.run.Runner` (the
   layer tensors of :func:`importers.run.audit.layer_tensors` exposed, no attention probabilities)
   against :func:`importers.run.plain_session` (the unmodified, fully fused graph) on the same
   batch of bundled inputs, on the CPU, in one process: one warm-up each, then interleaved runs;
   the ratio of the medians is printed (target ≤ 1.15).
2. The whole command. ``oversmooth audit`` (default: dinov2-vits14 on the bundled photographs, as
   ``make demo`` runs it) in a fresh interpreter, median wall time (target < 60 s on 2 cores); then
   once more under cProfile, for a breakdown: model loading and matching, session creation,
   inference, metrics, dominance eigenvalues, value spectra, figures and files. With
   ``--blas-threads N`` both are repeated with ``OPENBLAS_NUM_THREADS=N`` (the audit's many small
   eigen- and singular-value problems are sensitive to BLAS threading on a busy machine).

The load average is printed beside the numbers: on a shared machine they are only as good as it.

Run with ``python -m benchmarks.bench_audit [--repeats N] [--batch B] [--models NAME ...]
[--audit-model NAME] [--audit-runs N] [--blas-threads N] [--skip-overhead] [--skip-audit]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from importers import zoo
from importers.graph import load_model
from importers.run.audit import layer_tensors
from importers.run.runner import Runner, plain_session
from importers.run.sources import bundled_inputs
from importers.weights import extract

__all__ = ["Breakdown", "Overhead", "audit_breakdown", "command_seconds", "main", "overhead"]

DEFAULT_AUDIT_MODEL = "dinov2-vits14"


@dataclass(frozen=True)
class Overhead:
    """Median seconds per batch of the plain session and of the audit's runner on one model."""

    model: str
    batch: int
    n_exposed: int
    plain_s: float
    audit_runner_s: float
    repeats: int

    @property
    def ratio(self) -> float:
        """Audit runner over plain median time."""
        return self.audit_runner_s / self.plain_s


def _seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, and the usable cores."""
    one, five, fifteen = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {cores} cores"


def overhead(name: str, *, batch: int = 4, repeats: int = 9) -> Overhead:
    """Interleaved median timings of the plain session and the audit's runner on zoo ``name``."""
    path = zoo.lookup(name, allow_fetch=False).path
    graph = load_model(path)  # parsed once, as the audit does
    fed = {spec.name for spec in graph.inputs}
    exposed = [t for t in layer_tensors(extract(graph)) if t not in fed]
    runner = Runner(graph, expose=exposed, provider="cpu")
    plain = plain_session(graph, provider="cpu")
    kind = zoo.get_model(name).kind
    feeds = bundled_inputs(kind, graph=runner.inputs).subset(slice(0, batch)).feeds

    def run_plain() -> object:
        return plain.run(None, feeds)

    def run_audit_runner() -> object:
        return list(runner.run(feeds))

    run_plain()
    run_audit_runner()
    plain_times, runner_times = [], []
    for _ in range(repeats):
        plain_times.append(_seconds(run_plain))
        runner_times.append(_seconds(run_audit_runner))
    return Overhead(
        model=name,
        batch=batch,
        n_exposed=len(exposed),
        plain_s=statistics.median(plain_times),
        audit_runner_s=statistics.median(runner_times),
        repeats=repeats,
    )


def command_seconds(model: str, runs: int, env: dict[str, str] | None = None) -> float:
    """Median wall seconds of ``oversmooth audit MODEL`` in a fresh interpreter."""
    times = []
    with tempfile.TemporaryDirectory() as folder:
        command = [
            sys.executable,
            "-m",
            "simulator.cli",
            "audit",
            model,
            "--out",
            str(Path(folder) / "report"),
            "--no-progress",
        ]
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(
                command, check=True, capture_output=True, env={**os.environ, **(env or {})}
            )
            times.append(time.perf_counter() - start)
    return statistics.median(times)


#: Breakdown rows: label -> (file suffix, function name) whose cumulative time is reported.
PHASES: dict[str, tuple[str, str]] = {
    "load model": ("importers/graph/load.py", "load_model"),
    "match attention blocks": ("importers/match/__init__.py", "find_attention_blocks"),
    "extract weights": ("importers/weights.py", "block_weights"),
    "runner setup + session": ("importers/run/runner.py", "__init__"),
    "inference (onnxruntime)": ("importers/run/runner.py", "_run_batch"),
    "metrics (SVD etc.)": ("simulator/metrics.py", "all_metrics"),
    "dominance cases": ("importers/run/audit.py", "_dominance_cases"),
    "value spectra (W_V W_O)": ("importers/value_spectra.py", "model_spectra"),
    "H spectra for dominance": ("importers/run/audit.py", "_value_spectra"),
    "figures + files": ("importers/run/report.py", "save_audit"),
}


@dataclass(frozen=True)
class Breakdown:
    """Seconds per phase of one profiled ``oversmooth audit`` run (cumulative, cProfile)."""

    model: str
    total_s: float
    phases: dict[str, float]
    eigvals_in_dominance_s: float
    n_cases: int


def _cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    return sum(
        entry[3]
        for (filename, _, function), entry in stats.stats.items()  # type: ignore[attr-defined]
        if function == name and filename.replace(os.sep, "/").endswith(suffix)
    )


def _called_from(stats: pstats.Stats, callee: str, suffix: str, caller: str) -> float:
    """Cumulative seconds spent in functions named ``callee`` when called from ``caller``."""
    total = 0.0
    for (_, _, function), entry in stats.stats.items():  # type: ignore[attr-defined]
        if function != callee:
            continue
        for (filename, _, name), timing in entry[4].items():
            if name == caller and filename.replace(os.sep, "/").endswith(suffix):
                total += timing[3]
    return total


def audit_breakdown(model: str = DEFAULT_AUDIT_MODEL) -> Breakdown:
    """Run ``oversmooth audit MODEL`` once in this process under cProfile and split its time."""
    from simulator.cli import main as oversmooth

    profiler = cProfile.Profile()
    argv = ["audit", model, "--no-progress", "--out"]
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        out = Path(folder) / "report"
        start = time.perf_counter()
        code = profiler.runcall(oversmooth, [*argv, str(out)])
        total = time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"oversmooth audit {model} exited with {code}")
        n_cases = sum(1 for _ in (out / "dominance.csv").open(encoding="utf-8")) - 1
    stats = pstats.Stats(profiler)
    phases = {label: _cumulative(stats, *where) for label, where in PHASES.items()}
    eigvals = _called_from(stats, "eigvals", "importers/audit.py", "_dominance_cases")
    return Breakdown(model, total, phases, eigvals, n_cases)


def breakdown_in_fresh_interpreter(model: str, env: dict[str, str] | None = None) -> Breakdown:
    """:func:`audit_breakdown` in a new interpreter (so that ``env`` can set BLAS threads)."""
    command = [sys.executable, "-m", "benchmarks.bench_audit", "--breakdown-json", model]
    result = subprocess.run(
        command, check=True, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    return Breakdown(**json.loads(result.stdout))


def _print_overheads(models: Sequence[str], batch: int, repeats: int) -> list[Overhead]:
    print(f"instrumented inference overhead ({load_average()})")
    print(f"{'model':<16}{'batch':>6}{'exposed':>9}{'plain ms':>10}{'audit ms':>10}{'ratio':>7}")
    results = []
    for name in models:
        if zoo.model_status(name) not in ("installed", "cached"):
            print(f"{name:<16}not installed or cached (skipped)")
            continue
        result = overhead(name, batch=batch, repeats=repeats)
        results.append(result)
        print(
            f"{result.model:<16}{result.batch:>6}{result.n_exposed:>9}"
            f"{1e3 * result.plain_s:>10.1f}{1e3 * result.audit_runner_s:>10.1f}"
            f"{result.ratio:>7.2f}"
        )
    print(f"target: ratio <= 1.15 (median of {repeats} interleaved runs; {load_average()})")
    return results


def _print_breakdown(breakdown: Breakdown, title: str) -> None:
    print(f"{title}: {breakdown.total_s:.1f} s under cProfile ({breakdown.n_cases} cases)")
    for label, seconds in sorted(breakdown.phases.items(), key=lambda item: -item[1]):
        share = 100 * seconds / breakdown.total_s
        print(f"  {label:<26}{seconds:>8.2f} s {share:>5.1f}%")
    seconds = breakdown.eigvals_in_dominance_s
    print(
        f"  {'of which eig(A) per case':<26}{seconds:>8.2f} s {100 * seconds / breakdown.total_s:>5.1f}%"
    )


def _print_audit(model: str, runs: int, blas_threads: int | None) -> None:
    print(f"\noversmooth audit {model} ({load_average()})")
    wall = command_seconds(model, runs)
    print(f"fresh interpreter, median of {runs}: {wall:.1f} s (target < 60 s)")
    limited_env = None if blas_threads is None else {"OPENBLAS_NUM_THREADS": str(blas_threads)}
    if limited_env is not None:
        limited = command_seconds(model, runs, limited_env)
        print(f"same with OPENBLAS_NUM_THREADS={blas_threads}: {limited:.1f} s")
    print(f"({load_average()})")
    _print_breakdown(breakdown_in_fresh_interpreter(model), "breakdown, default BLAS threads")
    if limited_env is not None:
        _print_breakdown(
            breakdown_in_fresh_interpreter(model, limited_env),
            f"breakdown, OPENBLAS_NUM_THREADS={blas_threads}",
        )
    print(f"({load_average()})")


def main(argv: Sequence[str] | None = None) -> None:
    """Print the overhead table and the audit's wall time with its breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per session (>= 7)")
    parser.add_argument("--batch", type=int, default=4, help="inputs per run (the audit's default)")
    parser.add_argument("--models", nargs="*", default=[model.name for model in zoo.models()])
    parser.add_argument("--audit-model", default=DEFAULT_AUDIT_MODEL)
    parser.add_argument("--audit-runs", type=int, default=1, help="fresh-interpreter runs")
    parser.add_argument("--blas-threads", type=int, default=None, metavar="N")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-audit", action="store_true")
    parser.add_argument("--breakdown-json", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.breakdown_json:
        print(json.dumps(asdict(audit_breakdown(args.breakdown_json))))
        return
    if not args.skip_overhead:
        _print_overheads(args.models, args.batch, max(7, args.repeats))
    if not args.skip_audit:
        _print_audit(args.audit_model, max(1, args.audit_runs), args.blas_threads)


if __name__ == "__main__":
    main()
