"""Throughput: plain inference against the audit's session, per provider and batch size.

For each installed zoo model, each provider that can run here (the CPU; CUDA where a CUDA
session can really be created) and each batch size, inputs per second of

- ``plain``: the unmodified, fully fused model returning its own outputs (``session.run``);
- ``reduced``: the audit's session with dominance off — the layer statistics reduced in the graph
  (:mod:`oversmooth.importers.runtime.reductions`), only they come back;
- ``scalars``: the same without the Gram matrices (``--no-spectral``: only eight numbers per input
  and layer come back);
- ``+attention``: the audit's session with dominance on — also the attention probabilities of
  every block come back (what ``oversmooth audit`` runs by default).

Each measurement repeats after one warm-up until ``--min-seconds`` have passed (at least 3 runs);
the three sessions alternate, and medians are compared. Inputs are the bundled photographs or
sentences, repeated to fill the batch. Then the whole audit (``oversmooth.importers.audit.pipeline.audit``, with
the dominance step) on ``--audit-inputs`` inputs, per provider, as inputs per second.

The device is printed before the figures (GPU name and driver, or the CPU cores and load).

Run with ``python -m benchmarks.bench_runner [--batches 1 8 64] [--providers cpu cuda]
[--models NAME ...] [--min-seconds S] [--audit-inputs N] [--audit-batch B]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oversmooth.commands.common import positive_int
from oversmooth.importers import zoo
from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.session import audit_session
from oversmooth.importers.errors import ProviderError
from oversmooth.importers.graph import OnnxModel, load_model
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import default_inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.cuda import gpu_info
from oversmooth.importers.runtime.runner import open_session, plain_session
from oversmooth.importers.weights import block_weights

__all__ = [
    "Throughput",
    "available_providers",
    "installed_models",
    "main",
    "throughput",
    "variant_calls",
]

VARIANTS = ("plain", "reduced", "scalars", "+attention")


@dataclass(frozen=True)
class Throughput:
    """Median inputs per second of each variant for one (model, provider, batch)."""

    model: str
    provider: str
    batch: int
    per_second: dict[str, float]

    def ratio(self, variant: str) -> float:
        """Time of ``variant`` over time of plain (1.0 = no overhead)."""
        return self.per_second["plain"] / self.per_second[variant]


def available_providers() -> list[str]:
    """``cpu``, plus ``cuda`` where a CUDA session can really be created."""
    import onnx

    probe = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
    )
    try:
        open_session(probe.SerializeToString(), "cuda")
    except ProviderError:
        return ["cpu"]
    return ["cpu", "cuda"]


def _repeated(inputs: Inputs, size: int) -> Inputs:
    return inputs.subset(list(np.resize(np.arange(inputs.batch_size), size)))


def _timed(calls: dict[str, Callable[[], object]], min_seconds: float) -> dict[str, float]:
    """Median seconds per call of each callable, alternating, after one warm-up each."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    start = time.perf_counter()
    while len(times[next(iter(calls))]) < 3 or time.perf_counter() - start < min_seconds:
        for name, call in calls.items():
            began = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) for name, values in times.items()}


def variant_calls(
    graph: OnnxModel, inputs: Inputs, provider: str, batch: int, name: str
) -> dict[str, tuple[Any, Callable[[], object]]]:
    """Per variant of :data:`VARIANTS`, its onnxruntime session and one call of it on ``inputs``
    repeated to fill ``batch``, as the audit runs it (zoo model ``name``'s prefix tokens)."""
    entry = zoo.get_model(name)
    blocks = [block_weights(graph, block) for block in find_attention_blocks(graph).blocks]
    items = _repeated(inputs, batch)
    plain = plain_session(graph, provider=provider)  # type: ignore[arg-type]
    calls: dict[str, tuple[Any, Callable[[], object]]] = {
        "plain": (plain, lambda: plain.run(None, items.feeds))
    }
    for variant in VARIANTS[1:]:
        session = audit_session(
            graph,
            blocks,
            items,
            prefix=int(entry.prefix_tokens),
            attention=variant == "+attention",
            spectral=variant != "scalars",
            provider=provider,  # type: ignore[arg-type]
        )
        calls[variant] = (
            session.runner.session,
            lambda s=session: list(s.runner.run(s.feeds, reuse_outputs=True)),
        )
    return calls


def throughput(
    graph: OnnxModel, inputs: Inputs, provider: str, batch: int, *, min_seconds: float, name: str
) -> Throughput:
    """Inputs per second of plain inference and of the audit's sessions at one batch size."""
    calls = variant_calls(graph, inputs, provider, batch, name)
    seconds = _timed({variant: call for variant, (_, call) in calls.items()}, min_seconds)
    return Throughput(name, provider, batch, {v: batch / seconds[v] for v in VARIANTS})


def _audit_per_second(graph: OnnxModel, inputs: Inputs, provider: str, batch: int) -> float:
    start = time.perf_counter()
    audit(graph, inputs, provider=provider, batch_size=batch)  # type: ignore[arg-type]
    return inputs.batch_size / (time.perf_counter() - start)


def installed_models(names: Sequence[str]) -> Iterator[tuple[str, OnnxModel, Inputs]]:
    """``(name, graph, bundled inputs)`` of each named zoo model installed or cached here; a line
    says which are skipped."""
    for name in names:
        if zoo.model_status(name) not in ("installed", "cached"):
            print(f"{name}: not installed or cached (skipped)")
            continue
        graph = load_model(zoo.lookup(name, allow_fetch=False).path)
        yield name, graph, default_inputs(graph.inputs, zoo.get_model(name))


def _device(providers: Sequence[str]) -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0]
    text = f"CPU: {cores} cores, load {load:.2f}"
    if "cuda" in providers:
        gpus = ", ".join(f"{g['name']} ({g['memory']}, driver {g['driver']})" for g in gpu_info())
        text += f"; GPU: {gpus or 'nvidia-smi not found'}"
    return text


def main(argv: Sequence[str] | None = None) -> list[Throughput]:
    """Print inputs per second per model, provider and batch, then the whole audit's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--providers", nargs="+", default=None, help="default: all that work")
    parser.add_argument("--models", nargs="*", default=[model.name for model in zoo.models()])
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--audit-inputs", type=positive_int, default=16)
    parser.add_argument("--audit-batch", type=positive_int, default=8)
    args = parser.parse_args(argv)
    providers = args.providers or available_providers()
    print(_device(providers))
    print(
        f"{'model':<16}{'provider':<9}{'batch':>6}{'plain/s':>10}{'reduced/s':>11}"
        f"{'ratio':>7}{'scalars/s':>11}{'ratio':>7}{'+attn/s':>10}{'ratio':>7}"
    )
    results = []
    audits: list[tuple[str, str, float]] = []
    for name, graph, inputs in installed_models(args.models):
        for provider in providers:
            for batch in args.batches:
                result = throughput(
                    graph, inputs, provider, batch, min_seconds=args.min_seconds, name=name
                )
                results.append(result)
                rate = result.per_second
                print(
                    f"{name:<16}{provider:<9}{batch:>6}{rate['plain']:>10.1f}"
                    f"{rate['reduced']:>11.1f}{result.ratio('reduced'):>7.2f}"
                    f"{rate['scalars']:>11.1f}{result.ratio('scalars'):>7.2f}"
                    f"{rate['+attention']:>10.1f}{result.ratio('+attention'):>7.2f}"
                )
            rate = _audit_per_second(
                graph, _repeated(inputs, args.audit_inputs), provider, args.audit_batch
            )
            audits.append((name, provider, rate))
    print(f"whole audit (dominance on), {args.audit_inputs} inputs, batch {args.audit_batch}:")
    for name, provider, rate in audits:
        print(f"  {name:<16}{provider:<6}{rate:>8.1f} inputs/s")
    return results


if __name__ == "__main__":
    main()
