"""The tridiagonalisation's raw CUDA kernels, run on the CPU and (marker ``cuda``) on a GPU.

On the CPU their source runs under the host's C++ compiler, one thread after another
(:data:`tests.importers.runtime.device_helpers.SHIMS`), driven step by step as
:func:`~oversmooth.importers.runtime.householder_kernels.raw_householder_tridiagonal` drives
them: the tridiagonal it leaves must be the array code's and keep LAPACK's eigenvalues.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers.runtime.device_spectra import (
    finish_tridiagonal,
    householder_tridiagonal,
    tridiagonal_eigenvalues,
)
from oversmooth.importers.runtime.householder_kernels import STEP_SOURCE
from tests.importers.runtime.device_helpers import (
    assert_same_spectra,
    cupy_or_skip,
    host_program,
    random_grams,
    run_program,
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


def _host_steps(binary: Path, gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    count, n = gram.shape[0], gram.shape[-1]
    printed = run_program(binary, f"{count} {n}", gram)
    a = printed[: count * n * n].reshape(count, n, n)
    d = printed[count * n * n : count * n * (n + 1)].reshape(count, n)
    e = printed[count * n * (n + 1) :].reshape(count, max(n - 1, 0))
    finish_tridiagonal(a, d, e)
    return d, e


def test_the_raw_kernels_give_the_array_codes_tridiagonal(tmp_path: Path) -> None:
    binary = host_program(tmp_path, STEP_SOURCE, _STEPS_MAIN)
    grams = [random_grams(11, 3, 257, 384), random_grams(12, 2, 257, 384, rank=2), special_grams()]
    grams += [random_grams(13, 2, n, 3) for n in (1, 2, 3, 4)]
    for gram in grams:
        d, e = _host_steps(binary, gram)
        assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)
        d_array, e_array = householder_tridiagonal(gram.copy())
        scale = np.abs(gram).max(axis=(1, 2))[:, None] + np.finfo(float).tiny
        # the same reflectors, the sums in another order: the same T to round-off
        assert np.all(np.abs(d - d_array) <= 1e-11 * scale)
        assert np.all(np.abs(e - e_array) <= 1e-11 * scale)


def test_a_wrong_update_in_the_raw_kernels_is_caught(tmp_path: Path) -> None:
    """The comparison above can fail: an update that subtracts only one of the two rank-1
    terms leaves another spectrum."""
    broken = STEP_SOURCE.replace("vb[i] * wb[j] + wb[i] * vb[j]", "vb[i] * wb[j]")
    assert broken != STEP_SOURCE
    binary = host_program(tmp_path, broken, _STEPS_MAIN)
    gram = random_grams(14, 2, 30, 40)
    d, e = _host_steps(binary, gram)
    with pytest.raises(AssertionError):
        assert_same_spectra(tridiagonal_eigenvalues(d, e), gram)


@pytest.mark.cuda
def test_the_raw_kernels_on_the_gpu_give_the_array_codes_tridiagonal() -> None:
    from oversmooth.importers.runtime.householder_kernels import raw_householder_tridiagonal

    cupy = cupy_or_skip()
    for gram in (random_grams(15, 4, 257, 384), special_grams(), random_grams(16, 3, 3, 2)):
        d, e = raw_householder_tridiagonal(cupy.asarray(gram))
        assert_same_spectra(cupy.asnumpy(tridiagonal_eigenvalues(d, e)), gram)
