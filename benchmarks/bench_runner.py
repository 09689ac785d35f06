"""Instrumentation overhead: exposing hidden states vs the plain, fully fused onnxruntime session.

For each installed zoo model, at batch 4 of the bundled real inputs, time the plain session
(original outputs, every fusion available) and a :class:`importers.run.Runner` that exposes the
block-boundary hidden states (every ``LayerNormalization`` output and every residual ``Add`` that
feeds a decomposed LayerNorm's ``ReduceMean``). Both live in the same process with the same session
options; runs are interleaved after one warm-up each, and the ratio of the medians is printed.

Run with ``python -m benchmarks.bench_runner [--repeats N] [--batch B] [--models NAME ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx

from importers import zoo
from importers.graph import load_model
from importers.run.runner import Runner, plain_session
from importers.run.sources import bundled_inputs

__all__ = ["Overhead", "hidden_state_names", "main", "measure"]


@dataclass(frozen=True)
class Overhead:
    """Median wall times (seconds) of the plain and instrumented sessions on one model."""

    model: str
    batch: int
    n_tokens: int
    n_exposed: int
    plain_s: float
    instrumented_s: float
    repeats: int
    provider: str

    @property
    def ratio(self) -> float:
        """Instrumented over plain median time."""
        return self.instrumented_s / self.plain_s


def hidden_state_names(model: onnx.ModelProto) -> list[str]:
    """Block-boundary tensors: LayerNormalization outputs, and Adds feeding a ReduceMean.

    Tensors that already are graph outputs are left out (they are fetched anyway).
    """
    consumers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    outputs = {value.name for value in model.graph.output}
    names = []
    for node in model.graph.node:
        tensor = node.output[0]
        fused = node.op_type == "LayerNormalization"
        residual = node.op_type == "Add" and "ReduceMean" in consumers.get(tensor, set())
        if (fused or residual) and tensor not in outputs:
            names.append(tensor)
    return names


def _time(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(name: str, *, batch: int = 4, repeats: int = 9, threads: int | None = None) -> Overhead:
    """Interleaved median timings of plain vs instrumented inference on zoo model ``name``."""
    path = zoo.lookup(name, allow_fetch=False).path
    spec = zoo.get_model(name)
    exposed = hidden_state_names(onnx.load(path, load_external_data=False))
    model = load_model(path)
    runner = Runner(model, expose=exposed, provider="cpu", threads=threads)
    plain = plain_session(model, provider="cpu", threads=threads)
    feeds = bundled_inputs(spec.kind, graph=runner.inputs).subset(slice(0, batch)).feeds

    def run_plain() -> object:
        return plain.run(None, feeds)

    def run_instrumented() -> object:
        return list(runner.run(feeds))

    run_plain()
    run_instrumented()
    plain_times, instrumented_times = [], []
    for _ in range(repeats):
        plain_times.append(_time(run_plain))
        instrumented_times.append(_time(run_instrumented))
    first = next(iter(feeds.values()))
    return Overhead(
        model=name,
        batch=batch,
        n_tokens=int(first.shape[1]) if spec.kind == "text" else 0,
        n_exposed=len(exposed),
        plain_s=statistics.median(plain_times),
        instrumented_s=statistics.median(instrumented_times),
        repeats=repeats,
        provider=runner.provider_used[0],
    )


def _installed(names: Sequence[str]) -> list[str]:
    return [name for name in names if zoo.model_status(name) in ("installed", "cached")]


def main(argv: Sequence[str] | None = None) -> list[Overhead]:
    """Print the instrumented/plain time ratio for each installed zoo model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per session (>= 7)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="*", default=[model.name for model in zoo.models()])
    args = parser.parse_args(argv)
    results = []
    print(
        f"{'model':<16}{'batch':>6}{'tokens':>8}{'exposed':>9}{'plain ms':>10}"
        f"{'instr. ms':>11}{'ratio':>7}"
    )
    for name in _installed(args.models):
        result = measure(name, batch=args.batch, repeats=max(7, args.repeats), threads=args.threads)
        results.append(result)
        tokens = str(result.n_tokens) if result.n_tokens else "image"
        print(
            f"{result.model:<16}{result.batch:>6}{tokens:>8}{result.n_exposed:>9}"
            f"{1e3 * result.plain_s:>10.1f}{1e3 * result.instrumented_s:>11.1f}"
            f"{result.ratio:>7.2f}"
        )
    skipped = sorted(set(args.models) - {result.model for result in results})
    if skipped:
        print(f"not installed or cached (skipped): {', '.join(skipped)}")
    return results


if __name__ == "__main__":
    main()
