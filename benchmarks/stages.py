"""Where an audit's time goes: wall and CPU seconds spent inside named functions, on any thread.

A sampling profiler did not serve on a GPU: py-spy recording the device benchmark on an H200 did
not finish within its 150 s (cause not established), and a GPU's asynchronous work hides from
CPU profiles anyway. These totals need no sampling: each named function is replaced, for the
duration of a ``with`` block, by a wrapper that adds the wall seconds and the calling thread's
CPU seconds of every call. A function that hands its result to the host (``to_numpy``, a device
synchronisation) then counts the device work it waited for in its wall time.

The totals are summed over threads: worker threads overlap each other and the main thread, so
the stages add up to more than the elapsed time; a stage's total against the elapsed time says
how many threads it kept busy. The CPU seconds are the calling thread's only: work a function
hands to other threads (onnxruntime's intra-op pool, a multithreaded BLAS) shows in its wall time
alone. Nested stages (the certificate inside the dominance stacks) are counted in both. The last
stage, the pipeline waiting for a batch's metrics and cases before it runs the one after next
(or for dominance cases it may no longer leave running), is the main thread's alone: what of
the elapsed time the host work did not overlap.

Public API
----------
AUDIT_STAGES
    The audit's stages: label -> (module or class path, attribute).
Spent
    One stage's calls, wall and CPU seconds.
timed_stages
    Context manager that times the stages.
stage_lines
    The totals as text, per input.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AUDIT_STAGES", "Spent", "stage_lines", "timed_stages"]

#: The audit pipeline's stages, in the order a batch meets them: label -> (the module, or
#: ``module:Class``, whose attribute is looked up at call time; the attribute).
AUDIT_STAGES: dict[str, tuple[str, str]] = {
    "onnxruntime calls": ("oversmooth.importers.runtime.runner:Runner", "_call"),
    "finite check": ("oversmooth.importers.audit.host_work", "check_finite_outputs"),
    "dominance problems": ("oversmooth.importers.audit.host_work", "dominance_problems"),
    "layer metrics": ("oversmooth.importers.audit.host_work", "measure_layers"),
    "  Gram spectra": ("oversmooth.importers.runtime.reductions", "gram_eigenvalues"),
    "dominance stacks": ("oversmooth.importers.audit.dominance", "stacked_cases"),
    "  certificate": ("oversmooth.simulator.perron", "perron_certified"),
    "    squarings": ("oversmooth.simulator.perron", "radius_bounds"),
    "    estimates": ("oversmooth.simulator.perron", "nonperron_estimate"),
    "  to the host": ("oversmooth.simulator.backend:HostCopies", "__call__"),
    "  dense spectra": ("oversmooth.simulator.perron", "_dense_modes"),
    "depth step's heads": ("oversmooth.importers.audit.host_work", "head_cases"),
    "attribution": ("oversmooth.importers.audit.host_work", "sublayer_cases"),
    "waiting for a batch": ("oversmooth.importers.audit.host_work", "_wait"),
}


@dataclass
class Spent:
    """Calls of one stage and their wall and CPU seconds, summed over threads."""

    calls: int = 0
    wall: float = 0.0
    cpu: float = 0.0


def _owner(path: str) -> Any:
    """The module, or ``module:Class``'s class, that ``path`` names."""
    module, _, cls = path.partition(":")
    owner = importlib.import_module(module)
    return getattr(owner, cls) if cls else owner


def _timed(function: Callable[..., Any], spent: Spent, lock: threading.Lock) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            with lock:
                spent.calls += 1
                spent.wall += wall
                spent.cpu += cpu

    return timed


@contextlib.contextmanager
def timed_stages(
    stages: Mapping[str, tuple[str, str]] = AUDIT_STAGES,
) -> Iterator[dict[str, Spent]]:
    """Time every call of each stage's function inside the block.

    Parameters
    ----------
    stages : mapping of label to (owner path, attribute)
        The owner is a module, or ``module:Class`` for a method; the attribute must be looked up
        there at call time (a name imported elsewhere with ``from ... import`` is a different
        binding: name the module that calls it).

    Yields
    ------
    dict of label to Spent
        Filled while the block runs; the functions are restored when it ends, also on an error.
    """
    lock = threading.Lock()
    totals = {label: Spent() for label in stages}
    restore: list[tuple[Any, str, Any]] = []
    try:
        for label, (path, name) in stages.items():
            owner = _owner(path)
            original = getattr(owner, name)
            restore.append((owner, name, original))
            setattr(owner, name, _timed(original, totals[label], lock))
        yield totals
    finally:
        for owner, name, original in reversed(restore):
            setattr(owner, name, original)


def stage_lines(totals: Mapping[str, Spent], n_inputs: int, elapsed: float) -> list[str]:
    """One line per stage: calls, wall and CPU milliseconds per input, and the elapsed time's."""
    lines = [f"  {'stage':<22}{'calls':>7}{'wall ms/input':>15}{'CPU ms/input':>14}"]
    for label, spent in totals.items():
        lines.append(
            f"  {label:<22}{spent.calls:>7}{1000 * spent.wall / n_inputs:>15.1f}"
            f"{1000 * spent.cpu / n_inputs:>14.1f}"
        )
    lines.append(f"  {'elapsed':<22}{'':>7}{1000 * elapsed / n_inputs:>15.1f}")
    return lines
