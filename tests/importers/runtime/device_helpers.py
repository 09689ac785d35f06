"""Helpers of the device-spectra tests: Gram matrices to solve, the agreement with LAPACK, CuPy
or a skip, and CUDA kernel sources run on the host (:data:`SHIMS`)."""

from __future__ import annotations

import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers.errors import ProviderError
from oversmooth.importers.runtime.device_spectra import (
    finish_tridiagonal,
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.importers.runtime.runner import open_session
from oversmooth.simulator.tolerances import EPS
from tests.importers.builders import assemble

#: Eigenvalues of an order-n Gram matrix agree with LAPACK's to this many n·ε·‖G‖₂ (both
#: backward stable: each is within a small multiple of ε‖G‖₂ of the exact one).
AGREEMENT_ULPS = 4.0


def random_grams(seed: int, count: int, n: int, d: int, rank: int | None = None) -> np.ndarray:
    """``(count, n, n)`` Gram matrices ``X Xᵀ`` of normal ``(n, d)`` matrices X (of ``rank``)."""
    rng = np.random.default_rng(seed)
    if rank is None:
        X = rng.normal(size=(count, n, d))
    else:
        X = rng.normal(size=(count, n, rank)) @ rng.normal(size=(count, rank, d))
    return X @ np.swapaxes(X, -1, -2)


def assert_same_spectra(eig: np.ndarray, gram: np.ndarray) -> None:
    """``eig`` is LAPACK's spectrum of ``gram`` to :data:`AGREEMENT_ULPS` · n ε ‖G‖₂."""
    reference = np.linalg.eigvalsh(gram)
    n = gram.shape[-1]
    scale = np.abs(reference).max(axis=-1, keepdims=True)
    assert np.all(np.abs(eig - reference) <= AGREEMENT_ULPS * max(n, 1) * EPS * scale)


def special_grams() -> np.ndarray:
    """Order 40: a zero matrix, one with padded (zero) rows and columns, one of rank 1, one
    scaled by 1e-30, one already diagonal, one already tridiagonal with a zero subdiagonal."""
    grams = random_grams(7, 6, 40, 60)
    grams[0] = 0.0
    grams[1][30:, :] = grams[1][:, 30:] = 0.0
    x = np.arange(40.0)
    grams[2] = np.outer(x, x)
    grams[3] *= 1e-30
    grams[4] = np.diag(np.arange(40.0) - 20.0)
    grams[5] = np.diag(np.ones(40)) + np.diag(np.r_[np.ones(19), 0.0, np.ones(19)], -1)
    grams[5] += np.tril(grams[5], -1).T
    return grams


#: What lets a CUDA kernel's source run under a host C++ compiler: thread indices as globals,
#: and LAUNCH running every (block, thread) of a grid one after another. Exact for kernels whose
#: threads share no memory and never synchronise, as the kernels here are written.
SHIMS = r"""
#include <cmath>
#include <cstdio>
#include <vector>
using std::fabs; using std::fmin; using std::fmax; using std::sqrt;
struct Index { long long x, y; };
static Index blockIdx, threadIdx, blockDim;
#define LAUNCH(grid_x, grid_y, threads, call) \
    for (blockIdx.y = 0; blockIdx.y < (grid_y); ++blockIdx.y) \
        for (blockIdx.x = 0; blockIdx.x < (grid_x); ++blockIdx.x) \
            for (blockDim.x = (threads), threadIdx.x = 0; threadIdx.x < (threads); ++threadIdx.x) \
                call;
#define __global__
"""


#: What lets a CUDA kernel whose threads synchronise run under a host C++ compiler: LAUNCH_BLOCKS
#: runs the grid's blocks one after another and each block's threads as host threads, with
#: ``threadIdx`` their own, ``__syncthreads`` a barrier among them (which also orders their
#: memory), and ``__shared__`` memory one array that the block in hand owns.
THREADED_SHIMS = r"""
#include <barrier>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>
using std::fabs; using std::fmin; using std::fmax; using std::sqrt;
struct Index { long long x, y; };
static Index blockIdx, blockDim;
static thread_local Index threadIdx;
static std::barrier<>* oversmooth_block_barrier = nullptr;
#define __syncthreads() oversmooth_block_barrier->arrive_and_wait()
#define __device__
#define __global__
#define __shared__
double oversmooth_shared[1 << 16];
#define LAUNCH_BLOCKS(grid_x, threads, call) \
    for (blockIdx.x = 0; blockIdx.x < (grid_x); ++blockIdx.x) { \
        blockDim.x = (threads); \
        std::barrier<> barrier_(threads); \
        oversmooth_block_barrier = &barrier_; \
        std::vector<std::thread> pool_; \
        for (long long t_ = 0; t_ < (threads); ++t_) \
            pool_.emplace_back([&, t_] { threadIdx.x = t_; call; }); \
        for (auto& thread_ : pool_) thread_.join(); \
    }
"""


def host_program(
    tmp_path: Path, kernels: str, main: str, shims: str = SHIMS, *, race_checked: bool = False
) -> Path:
    """CUDA kernels' ``source`` and a host ``main`` compiled under ``shims`` (:data:`SHIMS` or
    :data:`THREADED_SHIMS`); the binary. ``race_checked``: under ThreadSanitizer, which reports
    (exit status 66) any two accesses of one address by threads that no barrier orders, one of
    them a write; skipped where the compiler has no ThreadSanitizer."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler here to run the kernels' source")
    source = tmp_path / "kernels.cpp"
    source.write_text(shims + kernels.replace('extern "C" ', "") + main, encoding="utf-8")
    binary = tmp_path / "kernels"
    flags = ["-O1", "-g", "-fsanitize=thread"] if race_checked else ["-O2"]
    command = [compiler, "-std=c++20", "-pthread", *flags, "-o", str(binary), str(source)]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode and race_checked and "tsan" in built.stderr.lower():
        pytest.skip(f"no ThreadSanitizer here: {built.stderr.strip().splitlines()[-1]}")
    built.check_returncode()
    return binary


def program_input(header: str, numbers: np.ndarray) -> str:
    """The standard input of a kernel program: ``header``, then ``numbers`` to the last bit."""
    return header + "\n" + " ".join(f"{value:.17g}" for value in numbers.ravel())


def run_program(binary: Path, header: str, numbers: np.ndarray) -> np.ndarray:
    """``binary`` fed ``header`` and ``numbers`` on its standard input; the numbers it prints."""
    text = program_input(header, numbers)
    result = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=True)
    return np.array(result.stdout.split(), dtype=np.float64)


def host_tridiagonal(
    binary: Path, gram: np.ndarray, header: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """``(d, e)`` of a kernel program fed ``count n header`` and ``gram``, which prints the
    matrices, then d, then e (the last 2 × 2 block finished here, as on a device)."""
    count, n = gram.shape[0], gram.shape[-1]
    printed = run_program(binary, f"{count} {n} {header}", gram)
    a = printed[: count * n * n].reshape(count, n, n)
    d = printed[count * n * n : count * n * (n + 1)].reshape(count, n)
    e = printed[count * n * (n + 1) :].reshape(count, max(n - 1, 0))
    finish_tridiagonal(a, d, e)
    return d, e


def assert_the_array_codes_tridiagonal(d: np.ndarray, e: np.ndarray, gram: np.ndarray) -> None:
    """``(d, e)`` keeps LAPACK's eigenvalues of ``gram`` and is the array code's T: the same
    reflectors, the sums in another order, so the same entries to round-off."""
    assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)
    d_array, e_array = householder_tridiagonal(gram.copy())
    scale = np.abs(gram).max(axis=(1, 2))[:, None] + np.finfo(float).tiny
    assert np.all(np.abs(d - d_array) <= 1e-11 * scale)
    assert np.all(np.abs(e - e_array) <= 1e-11 * scale)


def race_report(binary: Path, gram: np.ndarray, header: str) -> str:
    """ThreadSanitizer's report of one run of a race-checked kernel program fed
    ``count n header`` and ``gram`` (empty: none)."""
    count, n = gram.shape[0], gram.shape[-1]
    text = program_input(f"{count} {n} {header}", gram)
    result = subprocess.run([str(binary)], input=text, capture_output=True, text=True)
    if "FATAL: ThreadSanitizer" in result.stderr:  # e.g. a kernel's address layout it refuses
        pytest.skip(f"ThreadSanitizer cannot run here: {result.stderr.strip().splitlines()[0]}")
    assert result.returncode in (0, 66), result.stderr  # 66: ThreadSanitizer found a race
    return result.stderr if result.returncode else ""


def assert_a_broken_kernel_is_caught(
    folder: Path, source: str, main: str, change: tuple[str, str], header: str
) -> None:
    """``source`` with ``change`` (a passage that occurs once, and what replaces it) run by
    ``main`` under :data:`THREADED_SHIMS` gives a tridiagonal that
    :func:`assert_the_array_codes_tridiagonal` refuses."""
    correct, broken = change
    assert source.count(correct) == 1
    binary = host_program(folder, source.replace(correct, broken), main, THREADED_SHIMS)
    gram = random_grams(14, 2, 30, 40)
    d, e = host_tridiagonal(binary, gram, header)
    with pytest.raises(AssertionError):
        assert_the_array_codes_tridiagonal(d, e, gram)


def assert_races_only_without(
    folder: Path,
    source: str,
    main: str,
    barrier: tuple[str, str],
    runs: list[tuple[np.ndarray, str]],
) -> None:
    """ThreadSanitizer sees no race in ``source`` run by ``main`` on each of ``runs`` (a stack
    and its header), and sees one in the first run once ``barrier`` (a passage that occurs once,
    and the same without its barrier) is changed."""
    with_barrier, without = barrier
    binary = host_program(folder, source, main, THREADED_SHIMS, race_checked=True)
    for gram, header in runs:
        assert race_report(binary, gram, header) == ""
    assert source.count(with_barrier) == 1
    unordered = source.replace(with_barrier, without)
    (folder / "unordered").mkdir()
    binary = host_program(folder / "unordered", unordered, main, THREADED_SHIMS, race_checked=True)
    assert "data race" in race_report(binary, *runs[0])


def cupy_or_skip() -> types.ModuleType:
    """CuPy, where a CUDA session opens and CuPy sees a GPU; else the test is skipped."""
    tiny = assemble("bert_legacy", 0).built.model.SerializeToString()
    try:
        open_session(tiny, "cuda")
    except ProviderError as err:
        pytest.skip(f"no CUDA here: {err}")
    from oversmooth.importers.runtime.cuda import device_arrays

    cupy = device_arrays()
    if cupy is None:
        pytest.skip("CuPy is not installed or sees no GPU (the `gpu` extra installs it)")
    return cupy
