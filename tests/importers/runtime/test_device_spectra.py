"""The Gram spectra the audit computes on a GPU: Householder tridiagonalisation, then bisection.

On the CPU: the batched tridiagonalisation (the same array code the GPU runs, in NumPy) keeps
every eigenvalue of real and random Gram matrices (against LAPACK's ``eigvalsh``); the bisection
kernel's C source, compiled by the host's C++ compiler under shims for CUDA's thread indices,
gives LAPACK's eigenvalues of those tridiagonals. Where CUDA and CuPy work (marker ``cuda``):
the fused kernels equal the plain array operations, and the whole device solve equals LAPACK.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.importers.runtime import device_spectra
from oversmooth.importers.runtime.device_spectra import (
    from_lower_triangle,
    gram_eigenvalues,
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.simulator import statistics
from oversmooth.simulator.tolerances import EPS
from tests.importers.runtime.test_device_path import _cupy_or_skip

#: Eigenvalues of an order-n Gram matrix agree with LAPACK's to this many n·ε·‖G‖₂ (both
#: backward stable: each is within a small multiple of ε‖G‖₂ of the exact one).
AGREEMENT_ULPS = 4.0


def _grams(seed: int, count: int, n: int, d: int, rank: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if rank is None:
        X = rng.normal(size=(count, n, d))
    else:
        X = rng.normal(size=(count, n, rank)) @ rng.normal(size=(count, rank, d))
    return X @ np.swapaxes(X, -1, -2)


def _assert_same_spectra(eig: np.ndarray, gram: np.ndarray) -> None:
    reference = np.linalg.eigvalsh(gram)
    n = gram.shape[-1]
    scale = np.abs(reference).max(axis=-1, keepdims=True)
    assert np.all(np.abs(eig - reference) <= AGREEMENT_ULPS * max(n, 1) * EPS * scale)


def _special_grams() -> np.ndarray:
    """Order 40: a zero matrix, one with padded (zero) rows and columns, one of rank 1, one
    scaled by 1e-30, one already diagonal, one already tridiagonal with a zero subdiagonal."""
    grams = _grams(7, 6, 40, 60)
    grams[0] = 0.0
    grams[1][30:, :] = grams[1][:, 30:] = 0.0
    x = np.arange(40.0)
    grams[2] = np.outer(x, x)
    grams[3] *= 1e-30
    grams[4] = np.diag(np.arange(40.0) - 20.0)
    grams[5] = np.diag(np.ones(40)) + np.diag(np.r_[np.ones(19), 0.0, np.ones(19)], -1)
    grams[5] += np.tril(grams[5], -1).T
    return grams


@pytest.mark.parametrize(
    ("count", "n", "d", "rank"),
    [
        (3, 257, 384, None),
        (3, 257, 384, 4),
        (4, 50, 20, None),
        (2, 1, 3, None),
        (2, 2, 3, None),
        (2, 3, 3, None),
        (3, 17, 17, 1),
    ],
)
def test_tridiagonalisation_keeps_every_eigenvalue(
    count: int, n: int, d: int, rank: int | None
) -> None:
    gram = _grams(count * n, count, n, d, rank)
    d_, e = householder_tridiagonal(gram.copy())
    assert d_.shape == (count, n)
    assert e.shape == (count, max(n - 1, 0))
    _assert_same_spectra(tridiagonal_eigenvalues(d_, e), gram)


def test_tridiagonalisation_of_special_matrices() -> None:
    gram = _special_grams()
    d, e = householder_tridiagonal(gram.copy())
    _assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)
    assert np.all(d[0] == 0.0)
    assert np.all(e[0] == 0.0)


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 24),
    d=st.integers(1, 30),
    scale=st.sampled_from([1e-200, 1e-8, 1.0, 1e8, 1e150]),
)
def test_tridiagonalisation_property(seed: int, n: int, d: int, scale: float) -> None:
    gram = _grams(seed, 2, n, d) * scale
    d_, e = householder_tridiagonal(gram.copy())
    _assert_same_spectra(tridiagonal_eigenvalues(d_, e), gram)


def test_a_broken_reflector_is_caught() -> None:
    """The comparison above fails when a step reflects with the wrong sign of α (a reflector
    that does not map x onto α e₁ changes the spectrum): the test can fail."""
    gram = _grams(1, 2, 30, 40)
    original = device_spectra._trailing_operations

    def wrong_update(xp):  # type: ignore[no-untyped-def]
        matvec, update = original(xp)
        return matvec, lambda block, v, w: update(block, v, -w)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(device_spectra, "_trailing_operations", wrong_update)
        d, e = householder_tridiagonal(gram.copy())
    with pytest.raises(AssertionError):
        _assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)


def test_only_the_lower_triangle_is_read_as_by_lapack() -> None:
    """An inexactly symmetric Gram matrix (a general product's rounding, here exaggerated): the
    device solver's steps see what LAPACK's ``eigvalsh`` reads, the lower triangle."""
    gram = _grams(21, 3, 30, 40)
    gram = (gram + np.swapaxes(gram, -1, -2)) / 2  # exactly symmetric
    skewed = gram + np.triu(np.random.default_rng(5).normal(size=gram.shape), 1)
    work = from_lower_triangle(skewed)
    np.testing.assert_array_equal(work, gram)
    d, e = householder_tridiagonal(work)
    _assert_same_spectra(tridiagonal_eigenvalues(d, e), skewed)


def test_on_the_host_gram_eigenvalues_are_lapacks() -> None:
    gram = _grams(3, 4, 30, 20)
    np.testing.assert_array_equal(gram_eigenvalues(gram), statistics.gram_eigenvalues(gram))


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
#define extern
"""

_BISECTION_MAIN = r"""
int main() {
    int count, n;
    if (std::scanf("%d %d", &count, &n) != 2) return 1;
    long long total = (long long)count * n;
    std::vector<double> d(total), e(count * (n > 1 ? n - 1 : 1)), out(total);
    for (long long i = 0; i < total; ++i) if (std::scanf("%lf", &d[i]) != 1) return 1;
    for (long long i = 0; i < (long long)count * (n - 1); ++i)
        if (std::scanf("%lf", &e[i]) != 1) return 1;
    LAUNCH(total, 1, 1, oversmooth_tridiagonal_bisection(d.data(), e.data(), out.data(), n, total));
    for (long long i = 0; i < total; ++i) std::printf("%.17g\n", out[i]);
    return 0;
}
"""


def host_program(tmp_path: Path, kernels: str, main: str) -> Path:
    """CUDA kernels' ``source`` and a host ``main`` compiled under :data:`SHIMS`; the binary."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler here to run the kernels' source")
    source = tmp_path / "kernels.cpp"
    source.write_text(SHIMS + kernels.replace('"C" ', "") + main, encoding="utf-8")
    binary = tmp_path / "kernels"
    subprocess.run([compiler, "-O2", "-o", str(binary), str(source)], check=True)
    return binary


def run_program(binary: Path, header: str, numbers: np.ndarray) -> np.ndarray:
    """``binary`` fed ``header`` and ``numbers`` on its standard input; the numbers it prints."""
    text = header + "\n" + " ".join(f"{value:.17g}" for value in numbers.ravel())
    result = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=True)
    return np.array(result.stdout.split(), dtype=np.float64)


def _host_bisection(tmp_path: Path, d: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The bisection kernel's source run by the host's C++ compiler, one 'thread' at a time."""
    binary = host_program(tmp_path, device_spectra._BISECTION_SOURCE, _BISECTION_MAIN)
    count, n = d.shape
    return run_program(binary, f"{count} {n}", np.r_[d.ravel(), e.ravel()]).reshape(count, n)


def test_the_bisection_kernel_source_gives_lapacks_eigenvalues(tmp_path: Path) -> None:
    grams = [_grams(5, 3, 257, 384), _grams(6, 3, 257, 384, rank=3), _special_grams()]
    grams += [_grams(8, 3, n, 4) for n in (1, 2, 3)]
    for gram in grams:
        d, e = householder_tridiagonal(gram.copy())
        eig = _host_bisection(tmp_path, d, e)
        _assert_same_spectra(eig, gram)
    zero = _host_bisection(tmp_path, np.zeros((1, 5)), np.zeros((1, 4)))
    np.testing.assert_array_equal(zero, 0.0)


@pytest.mark.cuda
def test_fused_kernels_equal_the_array_operations_on_the_gpu() -> None:
    cupy = _cupy_or_skip()
    gram = cupy.asarray(_grams(9, 5, 64, 80))
    fused = device_spectra._trailing_operations(cupy)
    block, v = gram[:, 3:, 3:], cupy.asarray(np.random.default_rng(2).normal(size=(5, 61)))
    w = 0.5 * v[:, ::-1]
    expected = cupy.asnumpy(device_spectra._matvec(block, v))
    # the sums run in another order: agreement to round-off of the largest term
    atol = 1e-13 * float(cupy.abs(block).max() * cupy.abs(v).sum(axis=1).max())
    np.testing.assert_allclose(cupy.asnumpy(fused[0](block, v)), expected, rtol=0, atol=atol)
    plain = gram.copy()
    device_spectra._rank2_update(plain[:, 3:, 3:], v, w)
    fused[1](block, v, w)
    np.testing.assert_allclose(cupy.asnumpy(gram), cupy.asnumpy(plain), rtol=1e-13, atol=1e-12)


@pytest.mark.cuda
def test_gram_eigenvalues_on_the_gpu_are_lapacks() -> None:
    cupy = _cupy_or_skip()
    grams = [_grams(5, 4, 257, 384), _grams(6, 4, 257, 384, rank=3), _special_grams()]
    for gram in grams:
        eig = gram_eigenvalues(cupy.asarray(gram))
        assert isinstance(eig, np.ndarray)
        _assert_same_spectra(eig, gram)
    zero = gram_eigenvalues(cupy.zeros((2, 9, 9)))
    np.testing.assert_array_equal(zero, 0.0)


class _Held:
    """Stands for a device array: NumPy data behind a device mark, owned by a stand-in package."""

    __module__ = "oversmooth_stand_in_device"
    __dlpack_device__ = None

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.shape = data.shape


def _stand_in_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    package = types.ModuleType("oversmooth_stand_in_device")
    package.asnumpy = lambda held: held.data  # type: ignore[attr-defined]
    package.matmul = np.matmul  # type: ignore[attr-defined]
    package.linalg = np.linalg  # type: ignore[attr-defined]
    package.stack = lambda helds: _Held(np.stack([h.data for h in helds]))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "oversmooth_stand_in_device", package)


def test_a_batchs_device_grams_are_solved_in_one_stacked_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every layer's Gram matrices on the device: one solve for all of them, each layer's
    spectra as its own solve gives; one layer's on the host: the layers are solved one by one."""
    from oversmooth.importers.runtime import reductions
    from oversmooth.importers.runtime.reductions import GraphExtension, ReductionPlan

    _stand_in_package(monkeypatch)
    calls: list[tuple[int, ...]] = []

    def solve(gram):  # type: ignore[no-untyped-def]
        calls.append(gram.shape)
        return np.linalg.eigvalsh(gram.data if isinstance(gram, _Held) else gram)

    monkeypatch.setattr(reductions, "gram_eigenvalues", solve)
    names = ("a", "b", "c", "d")
    plan = ReductionPlan(names, "tokens", False, GraphExtension(), replaced=frozenset({1}))
    grams = {0: _grams(0, 4, 9, 12), 2: _grams(2, 4, 9, 12), 3: _grams(3, 4, 5, 12)}
    outputs = {plan.gram_name(layer): _Held(gram) for layer, gram in grams.items()}
    assert plan.grams_on_device(outputs)
    spectra = plan.layer_spectra(outputs, [0, 2, 3])
    assert calls == [(2, 4, 9, 9), (4, 5, 5)]  # one solve per order (a stage of 5 tokens)
    for layer, gram in grams.items():
        np.testing.assert_array_equal(spectra[layer], np.linalg.eigvalsh(gram))
    outputs[plan.gram_name(2)] = grams[2]
    assert not plan.grams_on_device(outputs)
    none = ReductionPlan(("a",), "none", False, GraphExtension())
    assert not none.grams_on_device({})
    assert none.layer_spectra({}, [0]) == {}
