"""The audit on a local Dask cluster (``--scheduler local``) against one process: the speed-up.

The same model and inputs (default: minilm-l3 on 64 random inputs of 32 tokens, batch 4) are
audited by :func:`oversmooth.importers.audit.pipeline.audit` in this process and by
:func:`oversmooth.sharding.sharded_audit` on a ``LocalCluster`` of N worker processes (one
thread each, one shard per worker). Printed: the single-process time; the cluster's start-up; the
first distributed audit (cold workers: they import onnxruntime and build their sessions) and the
median of the next runs (warm workers: they still build one session per shard); the speed-ups
of the warm run and of start-up plus the cold run (what one ``oversmooth audit --scheduler local``
costs) over the single process; and whether the two reports agree (they must, exactly).

One process uses every core for onnxruntime's intra-op threads and two threads for the dominance
eigenproblems; each worker process does the same on its own, so on few cores the workers compete.
The load average is printed beside the numbers: on a shared machine they are only as good as it.

Run with ``python -m benchmarks.bench_scheduler [--model NAME] [--inputs N] [--workers N]
[--runs N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import numpy as np

from benchmarks.bench_audit import load_average
from oversmooth.commands.common import positive_int

__all__ = ["main"]


def _seconds(run, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _same(one, other) -> bool:
    same_metrics = all(
        np.array_equal(values, other.metrics[name], equal_nan=True)
        for name, values in one.metrics.items()
    )
    return same_metrics and one.dominance == other.dominance


def main(argv: Sequence[str] | None = None) -> None:
    """Print the single-process and local-cluster audit times and the speed-up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l3")
    parser.add_argument("--inputs", type=positive_int, default=64)
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument("--runs", type=positive_int, default=3, help="timed runs after the first")
    args = parser.parse_args(argv)

    from oversmooth.executor import open_executor
    from oversmooth.importers.audit.pipeline import AuditOptions, run_audit
    from oversmooth.importers.audit.records import AuditResult
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs.sources import default_inputs, random_inputs
    from oversmooth.importers.zoo import lookup
    from oversmooth.sharding import sharded_audit

    ref = lookup(args.model)
    graph = load_model(ref.path)
    if ref.entry is not None and ref.entry.image_size:  # an image model: repeat the photographs
        photos = default_inputs(graph.inputs, ref.entry)
        inputs = photos.subset([i % photos.batch_size for i in range(args.inputs)])
    else:
        inputs = random_inputs(graph.inputs, seed=0, batch=args.inputs, seq=32, vocab_size=1000)
    options = AuditOptions(provider="cpu", batch_size=4)
    print(f"audit of {args.model} on {inputs.batch_size} inputs ({load_average()})")
    single, one = _seconds(lambda: run_audit(graph, inputs, options, entry=ref.entry), args.runs)
    print(f"one process, median of {args.runs}: {single:.2f} s")
    start = time.perf_counter()
    with open_executor("local", workers=args.workers) as executor:
        started = time.perf_counter() - start

        def sharded() -> AuditResult:
            return sharded_audit(graph, inputs, options, executor=executor, entry=ref.entry)

        cold, _ = _seconds(sharded, 1)
        warm, merged = _seconds(sharded, args.runs)
    print(
        f"local cluster of {args.workers} workers: start {started:.2f} s, first audit {cold:.2f} s"
    )
    print(f"  warm workers, median of {args.runs}: {warm:.2f} s")
    print(f"speed-up, warm workers: {single / warm:.2f}x")
    print(f"speed-up, start + first audit (one command): {single / (started + cold):.2f}x")
    print(f"reports identical: {_same(one, merged)}  ({load_average()})")


if __name__ == "__main__":
    main()
