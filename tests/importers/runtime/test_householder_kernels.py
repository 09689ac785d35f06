"""The tridiagonalisation's raw CUDA kernels, run on the CPU and (marker ``cuda``) on a GPU.

On the CPU their source runs under the host's C++ compiler: the four kernels one thread after
another (:data:`tests.importers.runtime.device_helpers.SHIMS`), driven step by step as
:func:`~oversmooth.importers.runtime.householder_kernels.raw_householder_tridiagonal` drives
them; the single launch with each block's threads as host threads and a barrier for
``__syncthreads`` (:data:`~tests.importers.runtime.device_helpers.THREADED_SHIMS`), as
:func:`~oversmooth.importers.runtime.householder_kernels.block_householder_tridiagonal` launches
it. The tridiagonal each leaves must be the array code's and keep LAPACK's eigenvalues.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers.runtime import householder_kernels
from oversmooth.importers.runtime.device_spectra import (
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.importers.runtime.gram_spectra import gram_eigenvalues
from oversmooth.importers.runtime.householder_kernels import BLOCK_SOURCE, STEP_SOURCE
from tests.importers.runtime.device_helpers import (
    THREADED_SHIMS,
    assert_a_broken_kernel_is_caught,
    assert_races_only_without,
    assert_same_spectra,
    assert_the_array_codes_tridiagonal,
    cupy_or_skip,
    host_program,
    host_tridiagonal,
    random_grams,
    special_grams,
)

#: The host loop of raw_householder_tridiagonal, with the launches run by the shims' LAUNCH
#: (blocks of 128 threads; every matrix in one launch). Prints a, then d, then e.
_STEPS_MAIN = r"""
int main() {
    int count, n;
    if (std::scanf("%d %d", &count, &n) != 2) return 1;
    const long long size = (long long)count * n * n;
    const int sub = n > 1 ? n - 1 : 1;
    std::vector<double> a(size), d((long long)count * n), e((long long)count * sub, 0.0);
    std::vector<double> v((long long)count * sub), p((long long)count * sub);
    for (long long i = 0; i < size; ++i) if (std::scanf("%lf", &a[i]) != 1) return 1;
    const int per_matrix = (count + 127) / 128;
    for (int k = 0; k + 2 < n; ++k) {
        const int m = n - k - 1;
        LAUNCH(per_matrix, 1, 128,
               oversmooth_householder_reflector(a.data(), v.data(), d.data(), e.data(), n, k, count));
        LAUNCH((m + 127) / 128, count, 128,
               oversmooth_householder_matvec(a.data(), v.data(), p.data(), n, k, 0));
        LAUNCH(per_matrix, 1, 128, oversmooth_householder_reflected(v.data(), p.data(), n, k, count));
        LAUNCH((m * m + 127) / 128, count, 128,
               oversmooth_householder_update(a.data(), v.data(), p.data(), n, k, 0));
    }
    for (double x : a) std::printf("%.17g\n", x);
    for (double x : d) std::printf("%.17g\n", x);
    for (long long i = 0; i < (long long)count * (n - 1); ++i) std::printf("%.17g\n", e[i]);
    return 0;
}
"""


#: One launch of the single-launch kernel: a block of THREADS host threads per matrix, the
#: shared memory block_householder_tridiagonal asks for. Prints a, then d, then e.
_BLOCK_MAIN = r"""
int main() {
    int count, n, threads;
    if (std::scanf("%d %d %d", &count, &n, &threads) != 3) return 1;
    if (4LL * n + 2LL * threads + 1 > (long long)(sizeof oversmooth_shared / sizeof(double)))
        return 2;
    const long long size = (long long)count * n * n;
    const int sub = n > 1 ? n - 1 : 1;
    std::vector<double> a(size), d((long long)count * n), e((long long)count * sub, 0.0);
    for (long long i = 0; i < size; ++i) if (std::scanf("%lf", &a[i]) != 1) return 1;
    if (n > 2)
        LAUNCH_BLOCKS(count, threads, oversmooth_block_tridiagonal(a.data(), d.data(), e.data(), n));
    for (double x : a) std::printf("%.17g\n", x);
    for (double x : d) std::printf("%.17g\n", x);
    for (long long i = 0; i < (long long)count * (n - 1); ++i) std::printf("%.17g\n", e[i]);
    return 0;
}
"""


def test_the_raw_kernels_give_the_array_codes_tridiagonal(tmp_path: Path) -> None:
    binary = host_program(tmp_path, STEP_SOURCE, _STEPS_MAIN)
    grams = [random_grams(11, 3, 257, 384), random_grams(12, 2, 257, 384, rank=2), special_grams()]
    grams += [random_grams(13, 2, n, 3) for n in (1, 2, 3, 4)]
    for gram in grams:
        assert_the_array_codes_tridiagonal(*host_tridiagonal(binary, gram), gram)


def test_the_single_launch_gives_the_array_codes_tridiagonal(tmp_path: Path) -> None:
    """At the audit's 128 threads on DINOv2's order, with fewer threads than columns (a thread
    sweeps several), with more threads than columns, and at the orders where the loop of steps
    is empty or one step long."""
    binary = host_program(tmp_path, BLOCK_SOURCE, _BLOCK_MAIN, THREADED_SHIMS)
    cases = [
        (random_grams(11, 2, 257, 384), 128),
        (random_grams(12, 2, 257, 384, rank=2), 32),
        (special_grams(), 16),
        (special_grams()[:2], 64),
    ]
    cases += [(random_grams(13, 2, n, 3), 4) for n in (1, 2, 3, 4, 5)]
    for gram, threads in cases:
        assert_the_array_codes_tridiagonal(*host_tridiagonal(binary, gram, str(threads)), gram)


@pytest.mark.parametrize(
    ("correct", "broken"),
    [
        # step k - 1's update left out of row k (step k's x), of d_k and of the trailing block
        ("return a - vj * wi - wj * vi;", "return a;"),
        # a half of it left out
        ("return a - vj * wi - wj * vi;", "return a - vj * wi;"),
        # x0 not shared: every thread would read the previous step's
        ("if (j == k + 1) *first = x;", ""),
        # the norm's partial sums combined without their threads' scales
        ("sum[t] * r1 * r1 + sum[t + half] * r2 * r2", "sum[t] + sum[t + half]"),
    ],
)
def test_a_broken_single_launch_is_caught(tmp_path: Path, correct: str, broken: str) -> None:
    """The comparison above can fail: without the deferred update or half of it, without x₀
    shared, or with the threads' sums of squares added as if relative to one scale, the
    spectrum is another."""
    assert_a_broken_kernel_is_caught(tmp_path, BLOCK_SOURCE, _BLOCK_MAIN, (correct, broken), "8")


def test_the_single_launchs_threads_never_race(tmp_path: Path) -> None:
    """Every access of shared or global memory that two of a block's threads make, one of them a
    write, is ordered by a barrier: ThreadSanitizer sees none unordered, whatever order the
    threads happen to run in, with more threads than columns and fewer. Without the barrier
    between the reflector and the pass that reads it, it sees one."""
    runs = [(random_grams(21, 2, 40, 60), "16"), (random_grams(22, 1, 20, 30), "4")]
    barrier = "        __syncthreads();\n        /* one pass over the trailing block"
    without = "        /* one pass over the trailing block"
    assert_races_only_without(tmp_path, BLOCK_SOURCE, _BLOCK_MAIN, (barrier, without), runs)


def test_the_single_launch_gives_a_small_matrix_a_small_block() -> None:
    """A power of two of whole warps, one thread per column of the first trailing block where
    that fits in 128 (the reductions halve the block; the kernel is tested at each size)."""
    from oversmooth.importers.runtime.householder_kernels import _block_threads

    for n in range(3, 600):
        threads = _block_threads(n)
        assert threads in (32, 64, 128)
        assert threads >= min(n - 1, 128)
        assert threads == 32 or threads // 2 < n - 1


def test_orders_too_large_for_a_blocks_shared_memory_take_the_fused_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gram = random_grams(17, 2, 6, 8)
    monkeypatch.setattr(householder_kernels, "BLOCK_MAX_ORDER", 5)
    d, e = householder_kernels.block_householder_tridiagonal(gram.copy())
    d_array, e_array = householder_tridiagonal(gram.copy())
    assert np.array_equal(d, d_array)
    assert np.array_equal(e, e_array)


def test_a_wrong_update_in_the_raw_kernels_is_caught(tmp_path: Path) -> None:
    """The comparison above can fail: an update that subtracts only one of the two rank-1
    terms leaves another spectrum."""
    broken = STEP_SOURCE.replace("vb[i] * wb[j] + wb[i] * vb[j]", "vb[i] * wb[j]")
    assert broken != STEP_SOURCE
    binary = host_program(tmp_path, broken, _STEPS_MAIN)
    gram = random_grams(14, 2, 30, 40)
    d, e = host_tridiagonal(binary, gram)
    with pytest.raises(AssertionError):
        assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)


@pytest.mark.cuda
def test_the_raw_kernels_on_the_gpu_give_the_array_codes_tridiagonal() -> None:
    from oversmooth.importers.runtime.householder_kernels import raw_householder_tridiagonal

    cupy = cupy_or_skip()
    for gram in (random_grams(15, 4, 257, 384), special_grams(), random_grams(16, 3, 3, 2)):
        d, e = raw_householder_tridiagonal(cupy.asarray(gram))
        assert_same_spectra(cupy.asnumpy(tridiagonal_eigenvalues(d, e)), gram)


@pytest.mark.cuda
def test_the_single_launch_on_the_gpu_keeps_lapacks_spectra() -> None:
    """On a GPU the single launch's T is orthogonally similar to the Gram matrix: LAPACK's
    eigenvalues to round-off, and the audit's default solver returns them.

    Unlike the host tests this does not compare T's entries with the array code's. Both reduce
    by the same reflectors, but T's late entries are not forward stable: a different rounding
    moves them far more than the eigenvalues. On an H200, at order 257 (this test's first
    stack), every device tridiagonalisation's T differed from the NumPy array code's by more
    than the host tests' 10⁻¹¹ max|G| near step 247: the fused kernels by 4.1·10⁻¹¹, the raw
    ones by 3.9·10⁻¹¹, the single launch by 9.1·10⁻¹¹ (2.5·10⁻¹¹ compiled without fused
    multiply–adds), while all kept LAPACK's eigenvalues to 5.3·10⁻¹⁵ λ_max.
    """
    from oversmooth.importers.runtime.householder_kernels import block_householder_tridiagonal

    cupy = cupy_or_skip()
    grams = (random_grams(15, 4, 257, 384), special_grams(), random_grams(16, 3, 3, 2))
    for gram in (*grams, random_grams(18, 2, 2, 2), random_grams(19, 0, 5, 5)):
        d, e = block_householder_tridiagonal(cupy.asarray(gram))
        if len(gram):
            assert_same_spectra(cupy.asnumpy(tridiagonal_eigenvalues(d, e)), gram)
    # as the audit runs it: the device solver's default, with its check
    gram = random_grams(20, 6, 257, 384)
    assert_same_spectra(gram_eigenvalues(cupy.asarray(gram)), gram)
