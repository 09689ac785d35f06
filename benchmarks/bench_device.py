"""Inputs per second where the model runs: plain inference, the audit's session, the whole audit.

For each installed zoo model, each provider that works here (the CPU; CUDA where a CUDA session
can really be created) and each batch size (default 1, 8 and 64), inputs per second of

- ``plain``: the unmodified model returning its own outputs (``session.run``);
- ``session``: the audit's session without dominance (layer statistics reduced in the graph and
  their Gram matrices; only these come back, or stay on the GPU with CuPy);
- ``audit``: the whole measurement with the dominance step (``oversmooth.importers.audit.pipeline.measure``:
  the layer metrics and every (input, block, head) case, the host work overlapped with the next
  batch), its session built once beforehand;

and ``to host``: the attention bytes per input the dominance step handed to the host's dense
eigensolver (the undecided heads; ``device`` where they crossed from a GPU). Each line names the
device. The session is timed as the audit runs it (outputs reused), alternating with plain, after
one warm-up each, for at least ``--min-seconds``; the audit runs on ``--batches-per-audit``
batches of repeated bundled inputs, once after a warm-up run on the first
:data:`WARM_UP_BATCHES` of them (the same session, so every kernel is compiled and every pool
filled, at an eighth of the target's 16 batches' cost). With ``--stages``, each line is
followed by where the timed audit's time went: wall and CPU milliseconds per input inside
onnxruntime's calls, the layer metrics (the Gram spectra among them), the dominance stacks (the
certificate, the copies to the host, the dense spectra) and the other stages of
:data:`benchmarks.stages.AUDIT_STAGES`, summed over threads.

Run with ``python -m benchmarks device [--batches 1 8 64] [--providers cpu cuda]
[--models NAME ...] [--min-seconds S] [--batches-per-audit K] [--stages]
[--dominance-inputs auto|all|N] [--gram-solver fused|raw|block|panel|host] [--held-share S]``
(``--gram-on-host``: ``--gram-solver host``; ``--held-share 0``: every batch's dominance cases
waited for before the batch after next runs, as before they could outlive their batch).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from unittest import mock

import numpy as np

from benchmarks.bench_gram import host_pool
from benchmarks.bench_runner import _repeated, _timed, available_providers, installed_models
from benchmarks.stages import Spent, stage_lines, timed_stages
from oversmooth.commands.common import count_or_rule, positive_int
from oversmooth.importers import zoo
from oversmooth.importers.audit import host_work
from oversmooth.importers.audit.cases import DominanceCase
from oversmooth.importers.audit.dominance_inputs import dominance_stop
from oversmooth.importers.audit.pipeline import (
    AuditOptions,
    PreparedAudit,
    measure,
    measure_session,
    prepare,
)
from oversmooth.importers.audit.session import AuditSession
from oversmooth.importers.graph import OnnxModel
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.runtime import gram_spectra, reductions
from oversmooth.importers.runtime.cuda import device_arrays, gpu_info
from oversmooth.importers.runtime.gram_spectra import (
    AUDIT_TRIDIAGONALISATION,
    TRIDIAGONALISATIONS,
)
from oversmooth.importers.runtime.runner import default_threads, plain_session

__all__ = ["GRAM_SOLVERS", "DeviceRates", "main", "parser", "rates"]


@dataclass(frozen=True)
class DeviceRates:
    """Inputs per second of one (model, provider, batch), and what reached the host."""

    model: str
    provider: str
    batch: int
    device: str
    plain: float
    session: float
    audit: float
    to_host_per_input: float
    device_bytes_per_input: float
    stages: tuple[str, ...] = ()
    dominance: str = ""

    def line(self) -> str:
        return (
            f"{self.model:<16}{self.provider:<6}{self.batch:>6}{self.plain:>10.1f}"
            f"{self.session:>10.1f}{self.plain / self.session:>7.2f}{self.audit:>9.2f}"
            f"{100 * self.audit / self.plain:>8.2f}%{self.to_host_per_input / 2**20:>9.2f}"
            f"{self.device_bytes_per_input / 2**20:>9.2f}  {self.device}"
        )


#: How the benchmark may compute the audit's Gram spectra: on the device, by each of the
#: tridiagonalisations (:data:`AUDIT_TRIDIAGONALISATION`, ``block``, is the audit's own), or by
#: LAPACK on the host threads.
GRAM_SOLVERS = (*TRIDIAGONALISATIONS, "host")

#: Batches of the audit's warm-up run (the timed run has ``--batches-per-audit``): two, so that
#: the dominance step's first look, after 32 inputs, falls inside it at batch 16 and above.
WARM_UP_BATCHES = 2

#: The whole audit's target on a GPU, as a share of plain inference's inputs per second.
GPU_AUDIT_TARGET = 0.25

HEADER = (
    f"{'model':<16}{'prov':<6}{'batch':>6}{'plain/s':>10}{'session/s':>10}{'ratio':>7}"
    f"{'audit/s':>9}{'of plain':>9}{'host MiB':>9}{'dev MiB':>9}  device"
)


def _device_name(provider: str) -> str:
    if provider == "cuda":
        gpus = gpu_info()
        name = gpus[0]["name"] if gpus else "a GPU (nvidia-smi not found)"
        return f"{name}, {'CuPy' if device_arrays() is not None else 'host copies (no CuPy)'}"
    return f"CPU, {default_threads()} threads"


def rates(
    graph: OnnxModel,
    name: str,
    inputs: Inputs,
    provider: str,
    batch: int,
    *,
    min_seconds: float,
    batches_per_audit: int,
    stages: bool = False,
    dominance_inputs: int | str = "auto",
    gram_solver: str = AUDIT_TRIDIAGONALISATION,
    held_share: float = host_work.HELD_ATTENTION_SHARE,
) -> DeviceRates:
    """Plain, session and whole-audit inputs per second of one model at one batch size.

    ``stages``: also where the timed audit's time went (:func:`benchmarks.stages.stage_lines`);
    the wrappers that time the stages cost a few microseconds per call, in the audit's time too.
    ``dominance_inputs``: the audit's ``--dominance-inputs`` (``"all"`` times the dominance step on
    every input; the default ``"auto"`` stops where the audit's rule does). ``gram_solver``:
    how the audit's Gram spectra are computed where the matrices stay on a GPU, one of
    :data:`GRAM_SOLVERS`: the device's tridiagonalisation and bisection with one launch of a
    thread block per matrix (``block``, the audit's own), the same in panels (``panel``), the
    fused kernels (``fused``) or the raw kernels per step (``raw``); or ``host``: LAPACK on every
    host thread after a copy.
    ``held_share``: the audit's
    :data:`~oversmooth.importers.audit.host_work.HELD_ATTENTION_SHARE` (0: no dominance cases
    outlive their batch).
    """
    ref = zoo.lookup(name, allow_fetch=False)  # the graph is already parsed: not again
    items = _repeated(inputs, batch)
    options = AuditOptions(
        provider=provider,  # type: ignore[arg-type]
        batch_size=batch,
        exclude_prefix=True,
        dominance_inputs=dominance_inputs,  # type: ignore[arg-type]
    )
    quiet = AuditOptions(
        provider=provider,  # type: ignore[arg-type]
        batch_size=batch,
        exclude_prefix=True,
        dominance="none",
    )
    without, _ = prepare(ref, graph, items, quiet)
    seconds = _plain_and_session_seconds(graph, without, items, provider, min_seconds)
    many = _repeated(inputs, batch * batches_per_audit)
    prepared, _ = prepare(ref, graph, many, options)
    prebuilt = measure_session(prepared, graph, many)
    totals: dict[str, Spent] = {}
    with contextlib.ExitStack() as timing:
        if gram_solver != AUDIT_TRIDIAGONALISATION:
            timing.enter_context(
                mock.patch.object(reductions, "gram_eigenvalues", _gram_solver(gram_solver))
            )
        timing.enter_context(mock.patch.object(host_work, "HELD_ATTENTION_SHARE", held_share))
        few, warm = _warm_up(prebuilt, many, batch)
        measure(prepared, graph, few, session=warm)
        if stages:
            totals = timing.enter_context(timed_stages())
        began = time.perf_counter()
        measured = measure(prepared, graph, many, session=prebuilt)
        elapsed = time.perf_counter() - began
    copied = measured.attention_to_host
    return DeviceRates(
        name,
        provider,
        batch,
        _device_name(provider)
        + _gram_solver_note(gram_solver, provider)
        + _held_share_note(held_share),
        batch / seconds["plain"],
        batch / seconds["session"],
        many.batch_size / elapsed,
        copied.get("bytes", 0) / many.batch_size,
        copied.get("device_bytes", 0) / many.batch_size,
        tuple(stage_lines(totals, many.batch_size, elapsed)) if stages else (),
        _dominance_line(measured.dominance, dominance_inputs, many.batch_size),
    )


def _warm_up(session: AuditSession, inputs: Inputs, batch: int) -> tuple[Inputs, AuditSession]:
    """The warm-up's inputs, the first :data:`WARM_UP_BATCHES` batches of ``inputs``, and
    ``session`` on them (its runner, so that its onnxruntime session is the one warmed)."""
    few = inputs.subset(slice(0, min(inputs.batch_size, WARM_UP_BATCHES * batch)))
    return few, replace(session, inputs=few)


def _dominance_line(cases: Sequence[DominanceCase], mode: int | str, n_inputs: int) -> str:
    """How many inputs' dominance cases the audit computed and how many its rule uses, with the
    widest 95 % interval over those (what the audit's ``--dominance-inputs`` decided)."""
    computed = len({case.input for case in cases})
    stop = dominance_stop(cases, mode, n_inputs)  # type: ignore[arg-type]
    return (
        f"  dominance: cases of {computed} of {n_inputs} inputs computed, {stop.inputs} used "
        f"(--dominance-inputs {mode}; widest 95 % interval {stop.width:.3f})"
    )


def _gram_solver_note(name: str, provider: str) -> str:
    """What the device column adds for a Gram solver that is not the audit's: a device
    tridiagonalisation only applies where the Gram matrices stay on a GPU (elsewhere LAPACK
    solves them, whatever was asked), and the line says which held."""
    if name == AUDIT_TRIDIAGONALISATION:
        return ""
    if name == "host":
        return ", Gram spectra on the host"
    if provider == "cuda" and device_arrays() is not None:
        return f", Gram tridiagonal by the {name} kernels"
    return f", --gram-solver {name} unused (the Gram matrices are on the host: LAPACK)"


def _held_share_note(share: float) -> str:
    """What the device column adds for a held share that is not the audit's."""
    if share == host_work.HELD_ATTENTION_SHARE:
        return ""
    return f", --held-share {share:g}"


def _gram_solver(name: str) -> Callable[[Any], np.ndarray]:
    """The Gram spectra's function for :data:`GRAM_SOLVERS` entry ``name`` (not the audit's)."""
    if name == "host":
        return _gram_eigenvalues_on_the_host
    return functools.partial(
        gram_spectra.gram_eigenvalues, tridiagonalise=TRIDIAGONALISATIONS[name]
    )


def _gram_eigenvalues_on_the_host(gram: Any) -> np.ndarray:
    """The Gram matrices' eigenvalues by LAPACK, after a copy to the host where they are on a GPU,
    on every host thread: a batch whose matrices were on the GPU hands all its layers' in one
    stack (one task), which one thread would otherwise solve alone."""
    return host_pool(default_threads())(gram)


def _plain_and_session_seconds(
    graph: OnnxModel, without: PreparedAudit, items: Inputs, provider: str, min_seconds: float
) -> dict[str, float]:
    """Seconds per batch of plain inference and of the audit's session without dominance.

    Both onnxruntime sessions are gone when this returns: each keeps its arena's peak, and with
    the audit's own session three together needed over 24 GiB at batch 64 on a CPU.
    """
    session = measure_session(without, graph, items)
    plain = plain_session(graph, provider=provider)  # type: ignore[arg-type]
    calls: dict[str, Callable[[], object]] = {
        "plain": lambda: plain.run(None, items.feeds),
        "session": lambda: list(session.runner.run(session.feeds, reuse_outputs=2)),
    }
    return _timed(calls, min_seconds)


def _share(text: str) -> float:
    """A share in [0, 1], else one line from argparse (exit 2)."""
    try:
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0 <= share <= 1:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}")
    return share


def parser() -> argparse.ArgumentParser:
    """The benchmark's options (``--dominance-inputs`` parsed as the audit command parses it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=positive_int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--providers", nargs="+", default=None, help="default: all that work")
    parser.add_argument("--models", nargs="*", default=[model.name for model in zoo.models()])
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--batches-per-audit", type=positive_int, default=2)
    parser.add_argument(
        "--stages", action="store_true", help="also print where the audit's time went, per stage"
    )
    parser.add_argument(
        "--dominance-inputs",
        type=count_or_rule,
        default="auto",
        help="the audit's --dominance-inputs (default auto)",
    )
    parser.add_argument(
        "--gram-solver",
        choices=GRAM_SOLVERS,
        default=AUDIT_TRIDIAGONALISATION,
        help="the audit's Gram spectra on a GPU: its tridiagonalisation by one launch of a block "
        "per matrix (block, the audit's), the same in panels (panel), the fused kernels or the "
        "raw kernels; or LAPACK on the host threads",
    )
    parser.add_argument(
        "--held-share",
        type=_share,
        default=host_work.HELD_ATTENTION_SHARE,
        help="the share of the GPU's free memory that finished batches' attention may keep while "
        "their dominance cases are computed (default %(default)s; 0: none outlive their batch)",
    )
    parser.add_argument(
        "--gram-on-host",
        dest="gram_solver",
        action="store_const",
        const="host",
        help="the same as --gram-solver host",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> list[DeviceRates]:
    """Print one line per model, provider and batch size."""
    args = parser().parse_args(argv)
    providers = args.providers or available_providers()
    print(
        "ratio = session time / plain time; of plain = audit inputs/s as a share of plain's; "
        "host/dev MiB = attention per input handed to the host's dense eigensolver / copied "
        "from the GPU"
    )
    if "cuda" in providers:
        print(
            f"target on a GPU: whole audit >= {GPU_AUDIT_TARGET:.0%} of plain inference's "
            "inputs/s at batch 64 (1,024 inputs: --batches-per-audit 16)"
        )
    print(HEADER)
    results = []
    for name, graph, inputs in installed_models(args.models):
        for provider in providers:
            for batch in args.batches:
                result = rates(
                    graph,
                    name,
                    inputs,
                    provider,
                    batch,
                    min_seconds=args.min_seconds,
                    batches_per_audit=args.batches_per_audit,
                    stages=args.stages,
                    dominance_inputs=args.dominance_inputs,
                    gram_solver=args.gram_solver,
                    held_share=args.held_share,
                )
                results.append(result)
                print("\n".join([result.line(), result.dominance, *result.stages]), flush=True)
    return results


if __name__ == "__main__":
    main()
