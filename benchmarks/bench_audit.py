"""``oversmooth audit`` end to end: wall time and where it goes.

``oversmooth audit`` (default: dinov2-vits14 on the bundled photographs, as ``make demo`` runs it)
in a fresh interpreter, median wall time (target < 60 s on 2 cores); then once more under cProfile,
for a breakdown: model loading and matching, session creation, inference (with the in-graph
reductions), the metrics finished on the host, dominance eigenvalues, value spectra, figures and
files. With ``--blas-threads N`` both are repeated with ``OPENBLAS_NUM_THREADS=N`` (the audit's many
small eigenvalue problems are sensitive to BLAS threading on a busy machine). Plain inference
against the audit's session is :mod:`benchmarks.bench_runner`.

Then, since the per-model cache (:mod:`oversmooth.importers.audit.cache`): the same command with an empty cache
(cold) and once more (warm); the dominance step on the default inputs' attention matrices, dense
(every spectrum) against certified (:mod:`oversmooth.simulator.perron`), with the share of cases the bound
decides; and the whole audit (dominance on, warm cache) of ``--ratio-inputs`` inputs (the bundled
ones repeated) at batch ``--ratio-batch`` against plain onnxruntime inference of the same inputs
(``session.run`` of the unmodified model, batch by batch), per model of ``--ratio-models``,
with the cost of one more input (the runs on the first batch alone subtracted), in wall and in
CPU seconds, and where the audit's CPU time goes per input (dominance threads, layer metrics, the
rest: onnxruntime, the main thread, reading inputs) against plain inference's.

The load average is printed beside the numbers: on a shared machine they are only as good as it.

Run with ``python -m benchmarks.bench_audit [--audit-model NAME] [--audit-runs N]
[--blas-threads N] [--ratio-models NAME ...] [--ratio-inputs N] [--ratio-batch B]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
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

from benchmarks.stages import AUDIT_STAGES, timed_stages
from oversmooth.commands.common import positive_int
from oversmooth.simulator.errors import OversmoothError

__all__ = [
    "RATIO_TARGETS",
    "AuditExitError",
    "AuditRatio",
    "Breakdown",
    "CpuSplit",
    "DominanceTiming",
    "audit_against_inference",
    "audit_breakdown",
    "audit_command",
    "cold_and_warm_seconds",
    "command_seconds",
    "dominance_timing",
    "main",
    "ratio_runs",
    "ratio_target",
]

DEFAULT_AUDIT_MODEL = "dinov2-vits14"
#: The whole audit's targets against plain inference on the CPU, per input beyond the first batch,
#: with ``--dominance-inputs auto``: (model, from this many inputs) -> the largest ratio.
RATIO_TARGETS: dict[tuple[str, int], float] = {
    ("dinov2-vits14", 64): 3.0,
    ("minilm-l6-int8", 64): 2.0,
    ("dinov2-vits14", 1024): 1.5,
}
#: A ratio whose plain inference took less than this many seconds is measured again ...
SHORT_PLAIN_SECONDS = 2.0
#: ... up to this many runs in all, and the median reported (:func:`ratio_runs`).
MAX_RATIO_RUNS = 5
#: The audit's parts whose worker-thread CPU :func:`audit_against_inference` reports.
_CPU_PARTS = {
    "stacked_cases": AUDIT_STAGES["dominance stacks"],
    "measure_layers": AUDIT_STAGES["layer metrics"],
}


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, and the usable cores."""
    one, five, fifteen = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {cores} cores"


def audit_command(model: str, out: Path, *options: str) -> list[str]:
    """The command line of ``oversmooth audit MODEL --out OUT --no-progress OPTIONS`` in a fresh
    interpreter."""
    command = [sys.executable, "-m", "oversmooth.cli", "audit", model, "--out", str(out)]
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
    "load model": ("oversmooth/importers/graph/load.py", "load_model"),
    "match attention blocks": ("oversmooth/importers/match/__init__.py", "find_attention_blocks"),
    "extract weights": ("oversmooth/importers/weights.py", "block_weights"),
    "runner setup + session": ("oversmooth/importers/runtime/runner.py", "__init__"),
    "inference (onnxruntime)": ("oversmooth/importers/runtime/runner.py", "_run_batch"),
    # The eigenproblems run in worker threads, which cProfile does not see: time the wait. The
    # batch's Gram eigenvalues (host metrics) run as one more job beside them, mostly inside it.
    "dominance + metrics (worker threads)": ("oversmooth/importers/audit/dominance.py", "result"),
    "value spectra (W_V W_O, cached)": (
        "oversmooth/importers/audit/cache.py",
        "cached_value_spectra",
    ),
    "figures + files": ("oversmooth/report.py", "save_audit"),
}


class AuditExitError(OversmoothError):
    """An ``oversmooth audit`` a benchmark ran ended with a non-zero status: the benchmark ends
    with the same status and the audit's own last line (``python -m benchmarks`` prints it as one
    line, as the command does)."""

    def __init__(self, model: str, exit_code: int, last_line: str = "") -> None:
        detail = f": {last_line}" if last_line else ""
        super().__init__(f"oversmooth audit {model} exited with {exit_code}{detail}")
        self.exit_code = exit_code


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
    from oversmooth.cli import main as oversmooth

    profiler = cProfile.Profile()
    argv = ["audit", model, "--no-progress", "--out"]
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        out = Path(folder) / "report"
        start = time.perf_counter()
        code = profiler.runcall(oversmooth, [*argv, str(out)])
        total = time.perf_counter() - start
        if code != 0:
            raise AuditExitError(model, code)
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


def cold_and_warm_seconds(model: str) -> tuple[float, float]:
    """Wall seconds of ``oversmooth audit MODEL`` with an empty cache, then with the one it left."""
    from oversmooth.importers.zoo import lookup

    path = str(lookup(model).path)  # the cache folder below is empty: it must not hold the model
    with tempfile.TemporaryDirectory() as folder:
        env = {"OVERSMOOTH_CACHE": folder}
        return command_seconds(path, 1, env), command_seconds(path, 1, env)


@dataclass(frozen=True)
class DominanceTiming:
    """The dominance step on one audit's attention matrices: dense against certified."""

    model: str
    cases: int
    certified: int
    dense_s: float
    certified_s: float


def dominance_timing(model: str) -> DominanceTiming:
    """Time the dominance step of the default audit of ``model`` both ways, as the audit runs it.

    One BLAS thread per stack of problems (:func:`oversmooth.importers.audit.dominance.stacks`), the stacks
    spread over ``default_threads()`` worker threads; the attention probabilities are computed
    first, outside the timing.
    """
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    from oversmooth.importers.audit.cache import cached_value_spectra
    from oversmooth.importers.audit.dominance import (
        dominance_problems,
        dominance_spectra,
        stacked_cases,
        stacks,
    )
    from oversmooth.importers.audit.session import audit_session
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs.sources import default_inputs
    from oversmooth.importers.match import find_attention_blocks
    from oversmooth.importers.runtime.runner import default_threads
    from oversmooth.importers.weights import block_weights
    from oversmooth.importers.zoo import file_sha256, lookup
    from oversmooth.simulator.perron import dominating_modes
    from oversmooth.simulator.tolerances import TIE_RTOL

    ref = lookup(model)
    graph = load_model(ref.path)
    blocks = [block_weights(graph, block) for block in find_attention_blocks(graph).blocks]
    inputs = default_inputs(graph.inputs, ref.entry)
    session = audit_session(graph, blocks, inputs, provider="cpu", spectral=False)
    outputs = session.runner.collect(session.feeds, batch_size=4)
    spectra = cached_value_spectra(blocks, file_sha256(ref.path))
    eig_H = dominance_spectra(blocks, spectra, "head", "effective")  # as the audit does
    problems = dominance_problems(outputs, blocks, session.attention, inputs, 0, eig_H)
    seconds = {}
    with (
        threadpool_limits(limits=1, user_api="blas"),
        ThreadPoolExecutor(max_workers=default_threads()) as pool,
    ):
        groups = [[problems[i] for i in stack] for stack in stacks(problems)]
        for certify in (False, True):
            start = time.perf_counter()
            list(pool.map(lambda g, c=certify: stacked_cases(g, TIE_RTOL, certify=c), groups))
            seconds[certify] = time.perf_counter() - start
        certified = sum(
            int(dominating_modes(p.attention(), p.eig_H).certified.sum()) for p in problems
        )
    cases = sum(len(p.eig_H) for p in problems)
    return DominanceTiming(model, cases, certified, seconds[False], seconds[True])


@dataclass(frozen=True)
class CpuSplit:
    """CPU milliseconds per input of one audit, by part, and of plain inference of its inputs."""

    model: str
    n_inputs: int
    dominance_ms: float
    metrics_ms: float
    total_ms: float
    plain_ms: float

    @property
    def rest_ms(self) -> float:
        """onnxruntime, the main thread and the inputs' reading: what the two parts leave."""
        return self.total_ms - self.dominance_ms - self.metrics_ms


@dataclass(frozen=True)
class AuditRatio:
    """Seconds of the whole audit and of plain inference, on all inputs and on the first batch.

    ``*_s`` are wall seconds, ``*_cpu_s`` the CPU seconds of this process (every thread) in the
    same spans: their ratio is the work the audit adds, whatever the overlap of its parts.
    """

    model: str
    n_inputs: int
    batch: int
    audit_s: float
    plain_s: float
    audit_batch_s: float
    plain_batch_s: float
    audit_cpu_s: float
    plain_cpu_s: float
    audit_batch_cpu_s: float
    plain_batch_cpu_s: float
    dominance_cpu_s: float
    metrics_cpu_s: float
    dominance_batch_cpu_s: float
    metrics_batch_cpu_s: float

    @property
    def ratio(self) -> float:
        """Whole audit over plain inference, every cost included (set-up too)."""
        return self.audit_s / self.plain_s

    @property
    def per_input_ratio(self) -> float:
        """The cost of one more input: ``(T(n) − T(batch)) / (n − batch)``, audit over plain.

        Costs paid once per run (matching, session creation, the report) cancel.
        """
        return (self.audit_s - self.audit_batch_s) / (self.plain_s - self.plain_batch_s)

    @property
    def per_input_cpu_ratio(self) -> float:
        """:attr:`per_input_ratio` in CPU seconds: with both cores busy either way, the least
        wall-time ratio any overlap of the audit's parts could reach on this machine."""
        audit = self.audit_cpu_s - self.audit_batch_cpu_s
        return audit / (self.plain_cpu_s - self.plain_batch_cpu_s)

    def cpu_split(self) -> CpuSplit:
        """The audit's CPU time per input beyond the first batch, by part, and plain's."""
        more = self.n_inputs - self.batch

        def per_input(total: float, first_batch: float) -> float:
            return (total - first_batch) * 1000.0 / more

        return CpuSplit(
            self.model,
            self.n_inputs,
            per_input(self.dominance_cpu_s, self.dominance_batch_cpu_s),
            per_input(self.metrics_cpu_s, self.metrics_batch_cpu_s),
            per_input(self.audit_cpu_s, self.audit_batch_cpu_s),
            per_input(self.plain_cpu_s, self.plain_batch_cpu_s),
        )


def audit_against_inference(
    model: str, n_inputs: int, batch: int, dominance_inputs: int | str = "all"
) -> AuditRatio:
    """Seconds of the whole audit (dominance on) and of plain inference of the same inputs (CPU).

    ``dominance_inputs`` as the audit's option: ``"all"`` (the default here) times the dominance
    step on every input, the cost the figures before ``--dominance-inputs`` measured; ``"auto"``
    what an audit with the default option costs.

    The inputs are the bundled ones repeated to ``n_inputs``; a one-input audit first fills the
    value-spectra cache and loads the libraries, so that the timed audits are warm ones. Plain
    inference is ``session.run`` of the unmodified model, ``batch`` inputs a call (its session
    created outside the timing), timed before and after each audit; the faster of the two counts
    (a drifting machine then errs against the audit). Both are timed on all inputs and on the
    first batch alone, in
    wall and CPU seconds; inside the audit the dominance stacks (``stacked_cases``) and the layer
    metrics (``measure_layers``, the Gram spectra) are timed on the worker threads that run them.
    """
    import numpy as np

    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs.sources import default_inputs
    from oversmooth.importers.runtime.runner import plain_session
    from oversmooth.importers.zoo import lookup

    # The module, not the function `audit` that the package exports under the same name.
    audit_module = importlib.import_module("oversmooth.importers.audit.pipeline")
    ref = lookup(model)
    graph = load_model(ref.path)
    inputs = default_inputs(graph.inputs, ref.entry)
    inputs = inputs.subset(list(np.resize(np.arange(inputs.batch_size), n_inputs)))
    audit_module.audit(graph, inputs.subset([0]), entry=ref.entry, provider="cpu")
    session = plain_session(graph, provider="cpu")
    session.run(None, inputs.subset(range(batch)).feeds)  # warm-up
    seconds: list[float] = []
    cpu_seconds: list[float] = []
    parts: list[float] = []

    def plain(count: int) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        for first in range(0, count, batch):
            session.run(None, inputs.subset(range(first, min(first + batch, count))).feeds)
        return time.perf_counter() - start, time.process_time() - cpu

    for count in (n_inputs, batch):
        before = plain(count)
        start, cpu = time.perf_counter(), time.process_time()
        with timed_stages(_CPU_PARTS) as totals:
            audit_module.audit(
                graph,
                inputs.subset(range(count)),
                entry=ref.entry,
                provider="cpu",
                batch_size=batch,
                dominance_inputs=dominance_inputs,
            )
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu)
        parts += [totals["stacked_cases"].cpu, totals["measure_layers"].cpu]
        after = plain(count)
        seconds.append(min(before[0], after[0]))
        cpu_seconds.append(min(before[1], after[1]))
    return AuditRatio(model, n_inputs, batch, *seconds, *cpu_seconds, *parts)


def _print_cache_and_dominance(model: str) -> None:
    cold, warm = cold_and_warm_seconds(model)
    print(f"fresh interpreter, empty cache: {cold:.1f} s; warm cache: {warm:.1f} s")
    timing = dominance_timing(model)
    share = 100 * timing.certified / timing.cases
    print(
        f"dominance step, {timing.cases} cases: dense {timing.dense_s:.2f} s, certified "
        f"{timing.certified_s:.2f} s ({timing.dense_s / timing.certified_s:.1f}x; "
        f"{share:.0f}% decided by the bound)"
    )
    print(f"({load_average()})")


def ratio_target(model: str, n_inputs: int) -> float | None:
    """The target of :data:`RATIO_TARGETS` for ``model`` at ``n_inputs`` (that of the largest
    count not above it), or None."""
    counts = [count for name, count in RATIO_TARGETS if name == model and count <= n_inputs]
    return RATIO_TARGETS[model, max(counts)] if counts else None


def _target_text(model: str, n_inputs: int, ratio: float) -> str:
    target = ratio_target(model, n_inputs)
    if target is None:
        return "no target"
    return f"target <= {target:.1f}x: {'met' if ratio <= target else 'not met'}"


def ratio_runs(model: str, n_inputs: int, batch: int, dominance_inputs: str) -> list[AuditRatio]:
    """:func:`audit_against_inference`, repeated while the plain inference timed so far is under
    :data:`SHORT_PLAIN_SECONDS` (at most :data:`MAX_RATIO_RUNS` runs): a short comparison's ratio
    moves by a fifth between runs on this machine. Sorted by the per-input ratio."""
    runs = [audit_against_inference(model, n_inputs, batch, dominance_inputs)]
    while runs[0].plain_s * len(runs) < SHORT_PLAIN_SECONDS and len(runs) < MAX_RATIO_RUNS:
        runs.append(audit_against_inference(model, n_inputs, batch, dominance_inputs))
    return sorted(runs, key=lambda run: run.per_input_ratio)


def _print_ratios(models: Sequence[str], n_inputs: int, batch: int) -> None:
    print(
        f"\nwhole audit (dominance on) vs plain inference, {n_inputs} inputs, batch {batch}, CPU:"
    )
    for model in models:
        for dominance_inputs in ("all", "auto"):
            runs = ratio_runs(model, n_inputs, batch, dominance_inputs)
            timing = runs[len(runs) // 2]
            spread = (
                f" (median of {len(runs)} runs: {runs[0].per_input_ratio:.2f}-"
                f"{runs[-1].per_input_ratio:.2f})"
                if len(runs) > 1
                else ""
            )
            print(
                f"  {model:<16} --dominance-inputs {dominance_inputs:<4}  audit "
                f"{timing.audit_s:6.1f} s  plain {timing.plain_s:6.1f} s  ratio "
                f"{timing.ratio:.2f}; per input beyond the first batch "
                f"{timing.per_input_ratio:.2f}{spread} (CPU time {timing.per_input_cpu_ratio:.2f})"
                f"  ({load_average()})"
            )
            if dominance_inputs == "auto":
                print(f"  {'':<16} {_target_text(model, n_inputs, timing.per_input_ratio)}")
            split = timing.cpu_split()
            print(
                f"  {'':<16} CPU ms per input: dominance {split.dominance_ms:.0f}, layer metrics "
                f"{split.metrics_ms:.0f}, onnxruntime and the rest {split.rest_ms:.0f}; "
                f"plain inference {split.plain_ms:.0f}"
            )


def main(argv: Sequence[str] | None = None) -> None:
    """Print the audit's wall time and its breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audit-model", default=DEFAULT_AUDIT_MODEL)
    parser.add_argument("--audit-runs", type=positive_int, default=1, help="fresh-interpreter runs")
    parser.add_argument("--blas-threads", type=positive_int, default=None, metavar="N")
    parser.add_argument(
        "--ratio-models", nargs="*", default=[DEFAULT_AUDIT_MODEL, "minilm-l6-int8"]
    )
    parser.add_argument("--ratio-inputs", type=positive_int, default=64)
    parser.add_argument("--ratio-batch", type=positive_int, default=8)
    parser.add_argument("--breakdown-json", metavar="MODEL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.breakdown_json:
        print(json.dumps(asdict(audit_breakdown(args.breakdown_json))))
        return
    _print_audit(args.audit_model, max(1, args.audit_runs), args.blas_threads)
    _print_cache_and_dominance(args.audit_model)
    _print_ratios(args.ratio_models, args.ratio_inputs, args.ratio_batch)


if __name__ == "__main__":
    main()
