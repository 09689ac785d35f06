"""Where the audit's session spends its time, node by node, by onnxruntime's own profiler.

``python -m benchmarks runner`` says how much slower the audit's session is than plain inference
(on an H200 at batch 64: 1.65×; the gap per call was about 10.5 ms at batch 1 and at batch 8
alike, 24 ms at batch 64). This says where: its sessions (plain, ``reduced``, ``scalars``,
``+attention``, built as that benchmark builds them) are built with onnxruntime's profiling on,
run ``--runs`` times after ``--warm-up`` runs (the variants in turn, a call each per round), and
per variant it prints per call (one
onnxruntime run: a model that runs one input at a time makes several per benchmark call, and
then the counts are per run)

- ``run``: onnxruntime's whole ``model_run``, in ms;
- ``nodes``: the kernels it ran and the sum of their times; ``run`` minus that sum is
  onnxruntime's own work between kernels (dispatch, allocation, copies of the outputs);
- the time on each execution provider (on a CUDA session a node on the CPU, or a ``Memcpy``,
  means a tensor crossed between the host and the device);
- the ``--top`` operator types by time, each with its count and time per call;
- the operator types that cost the session (``reduced``) most more than plain inference;

then the same layers reduced a chain per layer and stacked along the batch axis
(:mod:`benchmarks.stacked`): nodes, ms per call, and whether the bits agree.

On a CUDA session a kernel's time is what the host spent launching it (the device runs it
asynchronously); a synchronising node (a copy to the host) then shows the device work it waited
for. So on a GPU the per-node times tell dispatch from work only together with ``run``.

Run with ``python -m benchmarks ops [--model NAME] [--provider cpu|cuda] [--batch B]
[--runs N] [--warm-up N] [--top K]``.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import statistics
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

from benchmarks.bench_runner import installed_models, variant_calls
from benchmarks.stacked import StackedCalls, stacked_calls
from oversmooth.commands.common import positive_int
from oversmooth.importers import zoo
from oversmooth.importers.graph import OnnxModel
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.runtime import runner

__all__ = [
    "OpProfile",
    "extra_over",
    "main",
    "op_profile",
    "profiled_sessions",
    "session_profiles",
    "stacked_lines",
    "stacked_profiles",
]

#: What a builder of profiled sessions returns beside them (:func:`_profiled`).
_Extra = TypeVar("_Extra")


@dataclass(frozen=True)
class OpProfile:
    """One session's profile, per call (the warm-up calls left out).

    Attributes
    ----------
    calls : int
        The calls summarised.
    run_ms : float
        Median of onnxruntime's ``model_run`` per call.
    node_ms : float
        Median over calls of the sum of the kernels' times.
    between_ms : float
        Median over calls of ``model_run`` minus the kernels' sum: onnxruntime's own work.
    nodes : float
        Mean kernels run per call.
    providers : dict of str to float
        Mean ms per call on each execution provider.
    ops : dict of str to (float, float)
        Per operator type, the mean count and ms per call.
    """

    calls: int
    run_ms: float
    node_ms: float
    between_ms: float
    nodes: float
    providers: dict[str, float] = field(default_factory=dict)
    ops: dict[str, tuple[float, float]] = field(default_factory=dict)


def op_profile(events: Sequence[Mapping[str, Any]], warm_up: int) -> OpProfile:
    """The per-call profile of a session from its profiler's events, the first ``warm_up``
    calls left out.

    A call is an event of category ``Session`` named ``model_run``; its kernels are the events of
    category ``Node`` named ``*_kernel_time`` that start within its span (``ts`` to ``ts + dur``,
    microseconds), whatever the order the events were written in.
    """
    calls_in_order = sorted(
        (
            event
            for event in events
            if event.get("cat") == "Session" and event.get("name") == "model_run"
        ),
        key=lambda event: event["ts"],
    )
    starts = [event["ts"] for event in calls_in_order]
    nodes: list[list[Mapping[str, Any]]] = [[] for _ in calls_in_order]
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            k = bisect.bisect_right(starts, event["ts"]) - 1
            if k >= 0 and event["ts"] <= starts[k] + calls_in_order[k]["dur"]:
                nodes[k].append(event)
    runs = [event["dur"] / 1000.0 for event in calls_in_order][warm_up:]
    nodes = nodes[warm_up:]
    if not runs:
        raise ValueError(f"the profile holds no call after the {warm_up} warm-up calls")
    calls = len(runs)
    providers: defaultdict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    times: defaultdict[str, float] = defaultdict(float)
    for call in nodes:
        for event in call:
            args = event.get("args", {})
            ms = event["dur"] / 1000.0
            providers[str(args.get("provider", "?"))] += ms / calls
            counts[str(args.get("op_name", "?"))] += 1
            times[str(args.get("op_name", "?"))] += ms / calls
    kernels = [sum(event["dur"] for event in call) / 1000.0 for call in nodes]
    return OpProfile(
        calls=calls,
        run_ms=statistics.median(runs),
        node_ms=statistics.median(kernels),
        between_ms=statistics.median([r - k for r, k in zip(runs, kernels, strict=True)]),
        nodes=sum(len(call) for call in nodes) / calls,
        providers=dict(providers),
        ops={op: (counts[op] / calls, times[op]) for op in times},
    )


@contextlib.contextmanager
def profiled_sessions(folder: str | Path) -> Iterator[None]:
    """Every onnxruntime session built inside the block profiles its calls into ``folder``
    (the options every session here takes, :func:`oversmooth.importers.runtime.runner.session_options`,
    with profiling on)."""
    original = runner.session_options
    numbers = itertools.count()

    def with_profiling(*args: Any, **kwargs: Any) -> Any:
        options = original(*args, **kwargs)
        options.enable_profiling = True
        # a prefix of its own: onnxruntime adds only a timestamp, which two sessions may share
        options.profile_file_prefix = str(Path(folder) / f"session-{next(numbers)}")
        return options

    with mock.patch.object(runner, "session_options", with_profiling):
        yield


def session_profiles(
    graph: OnnxModel,
    inputs: Inputs,
    name: str,
    provider: str,
    batch: int,
    runs: int,
    warm_up: int,
) -> dict[str, OpProfile]:
    """:class:`OpProfile` of each of ``benchmarks runner``'s variants
    (:func:`benchmarks.bench_runner.variant_calls`) for zoo model ``name`` on ``inputs``,
    repeated to fill ``batch``."""
    calls, _ = _profiled(
        lambda: (variant_calls(graph, inputs, provider, batch, name), None), runs, warm_up
    )
    return calls


def stacked_profiles(
    graph: OnnxModel,
    inputs: Inputs,
    name: str,
    provider: str,
    batch: int,
    runs: int,
    warm_up: int,
) -> tuple[dict[str, OpProfile], StackedCalls] | None:
    """:class:`OpProfile` of the same layers reduced a chain per layer (``layers``) and stacked
    along the batch axis (``stacked``, :mod:`benchmarks.stacked`), and how their outputs compare;
    None where the layers are time-major."""
    prefix = int(zoo.get_model(name).prefix_tokens)

    def build() -> tuple[Mapping[str, tuple[Any, Callable[[], object]]], StackedCalls | None]:
        stacked = stacked_calls(graph, inputs, provider, batch, prefix)
        return ({} if stacked is None else stacked.calls), stacked

    profiles, stacked = _profiled(build, runs, warm_up)
    return None if stacked is None else (profiles, stacked)


def _profiled(
    build: Callable[[], tuple[Mapping[str, tuple[Any, Callable[[], object]]], _Extra]],
    runs: int,
    warm_up: int,
) -> tuple[dict[str, OpProfile], _Extra]:
    """``build()``'s sessions, created with profiling on, each called ``warm_up + runs`` times:
    their :class:`OpProfile`, and what else ``build`` returned.

    The variants are called in turn, one call each per round, so that a machine that drifts
    (another job, the clock) moves them alike: called one variant after another, two chains of
    the same reductions once differed by 10 % here, and by nothing when alternated.
    """
    with tempfile.TemporaryDirectory(prefix="oversmooth-ops-") as folder:
        with profiled_sessions(folder):
            calls, extra = build()
        for _ in range(warm_up + runs):
            for _, call in calls.values():
                call()
        profiles = {
            variant: op_profile(json.loads(Path(session.end_profiling()).read_text()), warm_up)
            for variant, (session, _) in calls.items()
        }
    return profiles, extra


def stacked_lines(profiles: Mapping[str, OpProfile], stacked: StackedCalls) -> list[str]:
    """What stacking the layers' reductions changes: nodes added, run ms, and the bits."""
    each, one = profiles["layers"], profiles["stacked"]
    bits = (
        "bit for bit the same"
        if stacked.same_bits
        else f"different: largest relative difference {stacked.largest_difference:.1e}"
    )
    return [
        f"  the same layers' reductions, a chain each against one stacked chain: "
        f"{stacked.nodes['layers']} against {stacked.nodes['stacked']} nodes added, "
        f"{each.run_ms:.2f} against {one.run_ms:.2f} ms per call; statistics and Gram "
        f"matrices {bits}"
    ]


def profile_lines(profiles: Mapping[str, OpProfile], top: int) -> list[str]:
    """The profiles as text: a line per variant, then its ``top`` operator types by time."""
    lines = [
        f"  {'variant':<12}{'run ms':>9}{'nodes':>8}{'node ms':>9}{'between':>9}  per provider (ms)"
    ]
    for variant, profile in profiles.items():
        providers = ", ".join(
            f"{name.removesuffix('ExecutionProvider')} {ms:.2f}"
            for name, ms in sorted(profile.providers.items(), key=lambda item: -item[1])
        )
        lines.append(
            f"  {variant:<12}{profile.run_ms:>9.2f}{profile.nodes:>8.0f}{profile.node_ms:>9.2f}"
            f"{profile.between_ms:>9.2f}  {providers}"
        )
    for variant, profile in profiles.items():
        ranked = sorted(profile.ops.items(), key=lambda item: -item[1][1])[:top]
        lines.append(
            f"  {variant}: the {len(ranked)} costliest operator types, count and ms per call"
        )
        lines += [f"    {op:<28}{count:>6.0f}{ms:>9.3f}" for op, (count, ms) in ranked]
    if "plain" in profiles and "reduced" in profiles:
        lines.append("  reduced against plain: the operator types that cost most more, per call")
        lines.append(f"    {'operator':<28}{'count':>13}{'ms more':>9}")
        for op, before, after, more in extra_over(profiles["plain"], profiles["reduced"])[:top]:
            lines.append(f"    {op:<28}{before:>6.0f} → {after:<4.0f}{more:>9.3f}")
    return lines


def extra_over(base: OpProfile, other: OpProfile) -> list[tuple[str, float, float, float]]:
    """Per operator type: its count per call in ``base`` and in ``other`` and how many ms per
    call more it took in ``other``, costliest difference first (ties by name)."""
    rows = []
    for op in set(base.ops) | set(other.ops):
        count_base, ms_base = base.ops.get(op, (0.0, 0.0))
        count_other, ms_other = other.ops.get(op, (0.0, 0.0))
        rows.append((op, count_base, count_other, ms_other - ms_base))
    return sorted(rows, key=lambda row: (-row[3], row[0]))


def main(argv: Sequence[str] | None = None) -> dict[str, OpProfile]:
    """Print where plain inference and the audit's session spend each call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dinov2-vits14")
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--runs", type=positive_int, default=5)
    parser.add_argument("--warm-up", type=int, default=2)
    parser.add_argument("--top", type=positive_int, default=8)
    args = parser.parse_args(argv)
    if args.warm_up < 0:
        parser.error(f"--warm-up must be 0 or more, not {args.warm_up}")
    profiles: dict[str, OpProfile] = {}
    for name, graph, inputs in installed_models([args.model]):
        profiles = session_profiles(
            graph, inputs, name, args.provider, args.batch, args.runs, args.warm_up
        )
        print(
            f"{name}, {args.provider}, batch {args.batch}: {args.runs} calls per variant "
            f"after {args.warm_up} warm-up calls (onnxruntime's profiler)"
        )
        for line in profile_lines(profiles, args.top):
            print(line)
        stacked = stacked_profiles(
            graph, inputs, name, args.provider, args.batch, args.runs, args.warm_up
        )
        if stacked is None:
            print("  stacked reductions: not measured (time-major layers)")
            continue
        for line in [*profile_lines(stacked[0], args.top)[:3], *stacked_lines(*stacked)]:
            print(line)
        profiles = {**profiles, **stacked[0]}
    return profiles


if __name__ == "__main__":
    main()
