"""``oversmooth audit`` end to end: wall time and where it goes.

``oversmooth audit`` (default: dinov2-vits14 on the bundled photographs, as ``make demo`` runs it)
in a fresh interpreter, median wall time (target < 60 s on 2 cores); then once more under cProfile,
for a breakdown: model loading and matching, session creation, inference (with the in-graph
reductions), the metrics finished on the host, dominance eigenvalues, value spectra, figures and
files. With ``--blas-threads N`` both are repeated with ``OPENBLAS_NUM_THREADS=N`` (the audit's many
small eigenvalue problems are sensitive to BLAS threading on a busy machine). Plain inference
against the audit's session is :mod:`benchmarks.bench_runner`.

The load average is printed beside the numbers: on a shared machine they are only as good as it.

Run with ``python -m benchmarks.bench_audit [--audit-model NAME] [--audit-runs N]
[--blas-threads N]``.
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Breakdown", "audit_breakdown", "audit_command", "command_seconds", "main"]

DEFAULT_AUDIT_MODEL = "dinov2-vits14"


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, and the usable cores."""
    one, five, fifteen = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {cores} cores"


def audit_command(model: str, out: Path, *options: str) -> list[str]:
    """The command line of ``oversmooth audit MODEL --out OUT --no-progress OPTIONS`` in a fresh
    interpreter."""
    command = [sys.executable, "-m", "simulator.cli", "audit", model, "--out", str(out)]
    return [*command, "--no-progress", *options]


def command_seconds(model: str, runs: int, env: dict[str, str] | None = None) -> float:
    """Median wall seconds of ``oversmooth audit MODEL`` in a fresh interpreter."""
    times = []
    with tempfile.TemporaryDirectory() as folder:
        command = audit_command(model, Path(folder) / "report")
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
    "metrics (host: Gram eigenvalues)": ("importers/run/audit.py", "_measure_layers"),
    # The eigenproblems run in worker threads, which cProfile does not see: time the wait.
    "dominance (worker threads)": ("importers/run/audit.py", "_measure_dominance"),
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
    n_cases: int


def _cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    return sum(
        entry[3]
        for (filename, _, function), entry in stats.stats.items()  # type: ignore[attr-defined]
        if function == name and filename.replace(os.sep, "/").endswith(suffix)
    )


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
    return Breakdown(model, total, phases, n_cases)


def breakdown_in_fresh_interpreter(model: str, env: dict[str, str] | None = None) -> Breakdown:
    """:func:`audit_breakdown` in a new interpreter (so that ``env`` can set BLAS threads)."""
    command = [sys.executable, "-m", "benchmarks.bench_audit", "--breakdown-json", model]
    result = subprocess.run(
        command, check=True, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    return Breakdown(**json.loads(result.stdout))


def _print_breakdown(breakdown: Breakdown, title: str) -> None:
    print(f"{title}: {breakdown.total_s:.1f} s under cProfile ({breakdown.n_cases} cases)")
    for label, seconds in sorted(breakdown.phases.items(), key=lambda item: -item[1]):
        share = 100 * seconds / breakdown.total_s
        print(f"  {label:<34}{seconds:>8.2f} s {share:>5.1f}%")


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
    """Print the audit's wall time and its breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audit-model", default=DEFAULT_AUDIT_MODEL)
    parser.add_argument("--audit-runs", type=int, default=1, help="fresh-interpreter runs")
    parser.add_argument("--blas-threads", type=int, default=None, metavar="N")
    parser.add_argument("--breakdown-json", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.breakdown_json:
        print(json.dumps(asdict(audit_breakdown(args.breakdown_json))))
        return
    _print_audit(args.audit_model, max(1, args.audit_runs), args.blas_threads)


if __name__ == "__main__":
    main()
