"""Gram spectra: the symmetric eigensolvers the layer metrics could use, on real Gram matrices.

The layer metrics need every eigenvalue of each layer's Gram matrix (for DINOv2, 25 per input of
order 257, float64). On this 2-core CPU that is 49-50 ms per input, the tridiagonal reduction
being 1.83 of the 2.05 ms per matrix. On a GPU the audit called CuPy's batched ``eigvalsh``,
cuSOLVER's Jacobi solver ``syevjBatched`` at every order (PyTorch keeps that solver for orders
up to 32): 0.70 ms per matrix on an H100, the audit's bottleneck there; it now tridiagonalises
the stack and bisects on the device (:mod:`oversmooth.importers.runtime.device_spectra`), 0.051
ms per matrix on an H200 (0.686 for ``eigvalsh`` on the same lease). This
times, on the model's own Gram matrices (the audit's session on the bundled inputs, tiled to
``--count``):

- ``host, 1 thread``: NumPy's ``eigvalsh`` (LAPACK), one matrix after another, one BLAS thread;
- ``host, N threads``: the same on a pool of N threads, one chunk of matrices each (the copy from
  the GPU included where the matrices are there);
- ``device, fused``: Householder tridiagonalisation (two fused kernels per step) and bisection on
  the whole stack with the Frobenius check that redoes a failed spectrum on the host
  (:func:`~oversmooth.importers.runtime.gram_spectra.gram_eigenvalues`);
- ``device, raw`` and ``device, block``: the same with the tridiagonalisation as four raw kernels
  per step or as one launch of a thread block per matrix
  (:data:`~oversmooth.importers.runtime.gram_spectra.TRIDIAGONALISATIONS`); ``block`` is
  how the audit runs it on a GPU;
- ``device, batched``: CuPy's ``eigvalsh`` on the whole stack (cuSOLVER's Jacobi solver) with the
  same check (:func:`~oversmooth.simulator.statistics.gram_eigenvalues`), as the audit ran it
  before; how many spectra of each device solver failed the check is printed;
- ``device, one by one``: CuPy's ``eigvalsh`` per matrix (cuSOLVER's ``syevd``);

in milliseconds per matrix (median of ``--repeats``), each with its largest eigenvalue difference
from the first solver's, relative to the matrix's largest eigenvalue; on a GPU also the device
solver's parts (each tridiagonalisation, the bisection) on the whole stack and on an eighth of
it. The device rows need a CUDA session and CuPy (``--provider cuda``); elsewhere only the host
rows run.

Run with ``python -m benchmarks gram [--model NAME] [--provider cpu|cuda] [--count N]
[--threads N] [--repeats K]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.bench_runner import _repeated, installed_models
from oversmooth.commands.common import positive_int
from oversmooth.importers import zoo
from oversmooth.importers.audit.session import audit_session
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime import device_spectra, gram_spectra
from oversmooth.importers.runtime.gram_spectra import TRIDIAGONALISATIONS
from oversmooth.importers.runtime.runner import default_threads
from oversmooth.importers.weights import block_weights
from oversmooth.simulator.backend import array_module, to_numpy
from oversmooth.simulator.statistics import gram_eigenvalues, unconverged

__all__ = ["GramTiming", "gram_stack", "host_pool", "main", "time_device_parts", "time_solvers"]


@dataclass(frozen=True)
class GramTiming:
    """One solver's milliseconds per matrix and its largest relative eigenvalue difference."""

    solver: str
    ms_per_matrix: float
    max_relative_difference: float


def gram_stack(name: str, provider: str, count: int) -> Any:
    """``(count, k, k)`` float64 Gram matrices of the zoo model ``name``'s layers, on its bundled
    inputs, tiled; where the audit's session keeps them (a CuPy array on a GPU with CuPy)."""
    _, graph, inputs = next(iter(installed_models([name])))
    blocks = [block_weights(graph, block) for block in find_attention_blocks(graph).blocks]
    session = audit_session(
        graph,
        blocks,
        _repeated(inputs, inputs.batch_size),
        prefix=zoo.get_model(name).prefix_tokens,
        attention=False,
        provider=provider,  # type: ignore[arg-type]
    )
    outputs = next(iter(session.runner.run(session.feeds)))
    grams = [value for key, value in outputs.items() if key.endswith(".gram")]
    xp = array_module(grams[0])
    stack = xp.concatenate([xp.asarray(gram, dtype=xp.float64) for gram in grams])
    return stack[xp.asarray(np.resize(np.arange(len(stack)), count))]


def host_pool(threads: int) -> Callable[[Any], np.ndarray]:
    """LAPACK's ``eigvalsh`` of a stack on ``threads`` host threads, a chunk of its first axis
    each, after a copy to the host where the stack is on a GPU."""

    def solve(stack: Any) -> np.ndarray:
        host = to_numpy(stack)
        chunks = np.array_split(np.arange(len(host)), threads)
        with ThreadPoolExecutor(threads) as pool:
            parts = pool.map(lambda part: np.linalg.eigvalsh(host[part]), chunks)
            return np.concatenate(list(parts))

    return solve


def _solvers(stack: Any, threads: int) -> dict[str, Callable[[Any], np.ndarray]]:
    solvers: dict[str, Callable[[Any], np.ndarray]] = {
        "host, 1 thread": lambda s: np.linalg.eigvalsh(to_numpy(s)),
        f"host, {threads} threads": host_pool(threads),
    }
    xp = array_module(stack)
    if xp is not np:
        for name, tridiagonalise in TRIDIAGONALISATIONS.items():
            solvers[f"device, {name}"] = functools.partial(
                gram_spectra.gram_eigenvalues, tridiagonalise=tridiagonalise
            )
        solvers["device, batched"] = gram_eigenvalues
        solvers["device, one by one"] = lambda s: np.stack(
            [to_numpy(xp.linalg.eigvalsh(matrix)) for matrix in s]
        )
    return solvers


def time_device_parts(stack: Any, repeats: int) -> dict[str, dict[int, float]]:
    """Milliseconds per matrix of the device solver's parts, on the whole stack and on an
    eighth of it (a part whose time per matrix grows as the stack shrinks is bound by its
    launches, not by the device's throughput): ``{part: {matrices: ms per matrix}}``."""
    xp = array_module(stack)
    sizes = sorted({max(1, len(stack) // 8), len(stack)})
    tridiagonal = {
        size: device_spectra.householder_tridiagonal(stack[:size].copy()) for size in sizes
    }
    parts: dict[str, Callable[[int], Any]] = {
        f"tridiagonalisation, {name}": functools.partial(_on_a_copy, tridiagonalise, stack)
        for name, tridiagonalise in TRIDIAGONALISATIONS.items()
    }
    parts["bisection"] = lambda size: device_spectra.tridiagonal_eigenvalues(*tridiagonal[size])
    times: dict[str, dict[int, float]] = {}
    for part, run in parts.items():
        times[part] = {}
        for size in sizes:
            run(size)  # warm-up: compiles the kernels
            seconds = []
            for _ in range(repeats):
                xp.cuda.Device().synchronize()
                began = time.perf_counter()
                run(size)
                xp.cuda.Device().synchronize()
                seconds.append(time.perf_counter() - began)
            times[part][size] = 1000 * statistics.median(seconds) / size
    return times


def _on_a_copy(tridiagonalise: Callable[[Any], Any], stack: Any, size: int) -> Any:
    """``tridiagonalise`` of a copy of the stack's first ``size`` matrices."""
    return tridiagonalise(stack[:size].copy())


def time_solvers(stack: Any, threads: int, repeats: int) -> list[GramTiming]:
    """Each solver's median time per matrix over ``repeats`` runs (after one warm-up) and its
    largest eigenvalue difference from the first solver's, relative to each matrix's largest."""
    timings = []
    reference: np.ndarray | None = None
    with threadpool_limits(limits=1, user_api="blas"):
        for solver, solve in _solvers(stack, threads).items():
            values = solve(stack)
            seconds = []
            for _ in range(repeats):
                began = time.perf_counter()
                solve(stack)
                seconds.append(time.perf_counter() - began)
            if reference is None:
                reference = values
            scale = np.maximum(np.abs(reference[:, -1:]), np.finfo(np.float64).tiny)
            difference = float(np.max(np.abs(values - reference) / scale))
            timings.append(
                GramTiming(solver, 1000 * statistics.median(seconds) / len(values), difference)
            )
    return timings


def _unchecked_device_spectra(stack: Any) -> dict[str, Any]:
    """Each device solver's spectra of ``stack`` before the check that redoes failures."""
    xp = array_module(stack)
    spectra = {
        name: device_spectra.tridiagonal_eigenvalues(
            *tridiagonalise(device_spectra.from_lower_triangle(stack))
        )
        for name, tridiagonalise in TRIDIAGONALISATIONS.items()
    }
    spectra["batched"] = xp.linalg.eigvalsh(stack)
    return spectra


def main(argv: Sequence[str] | None = None) -> list[GramTiming]:
    """Print each solver's milliseconds per Gram matrix."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dinov2-vits14")
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--count", type=positive_int, default=200)
    parser.add_argument("--threads", type=positive_int, default=default_threads())
    parser.add_argument("--repeats", type=positive_int, default=3)
    args = parser.parse_args(argv)
    if zoo.model_status(args.model) not in ("installed", "cached"):
        print(f"{args.model}: not installed or cached (skipped)")
        return []
    stack = gram_stack(args.model, args.provider, args.count)
    where = "GPU (CuPy)" if array_module(stack) is not np else "host"
    print(f"{args.model}: {len(stack)} Gram matrices of order {stack.shape[-1]}, on the {where}")
    timings = time_solvers(stack, args.threads, args.repeats)
    xp = array_module(stack)
    if xp is not np:
        for solver, eig in _unchecked_device_spectra(stack).items():
            failed = int(unconverged(stack, eig).sum())
            print(f"  the {solver} solver's spectra failing the Frobenius check: {failed}")
    for timing in timings:
        print(
            f"  {timing.solver:<20}{timing.ms_per_matrix:>9.3f} ms per matrix"
            f"   max |Δλ| / λ_max {timing.max_relative_difference:.1e}"
        )
    if xp is not np:
        print("  the device solver's parts, ms per matrix:")
        for part, by_size in time_device_parts(stack, args.repeats).items():
            cells = ", ".join(f"{ms:.3f} on {size}" for size, ms in by_size.items())
            print(f"    {part:<36}{cells}")
    return timings


if __name__ == "__main__":
    main()
