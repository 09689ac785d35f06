"""The Householder tridiagonalisation's steps as four raw CUDA kernels (an alternative to measure).

:func:`~oversmooth.importers.runtime.device_spectra.householder_tridiagonal` runs each step as
two fused CuPy kernels (the trailing blocks' product and rank-2 update) and about thirty small
array operations (the reflector). On an H100 that took 0.46–0.52 ms per matrix of order 257,
about ten times what the memory traffic needs. This module writes each step as four kernels with
plain two-dimensional indexing per matrix (``blockIdx.y`` is the matrix, 32-bit offsets inside
it), no shared memory and no synchronisation, so that each thread's work is independent and the
same source runs, one thread after another, under a host C++ compiler in the tests:

1. ``reflector`` (a thread per matrix): from row k right of the diagonal (column k below it, by
   symmetry) ``x``, scaled by ``max|x|``: ``α = −sign(x₀)‖x‖``, ``v = (x − α e₁)/‖x − α e₁‖``,
   and ``d_k = a_kk``, ``e_k = α``;
2. ``matvec`` (a thread per row i): ``p_i = Σ_j A_ji v_j`` on the trailing block A (symmetric,
   read along rows so that neighbouring threads read neighbouring addresses);
3. ``reflected`` (a thread per matrix): ``w = 2 (p − (vᵀp) v)``, in place of p;
4. ``update`` (a thread per element): ``A_ij −= v_i w_j + w_i v_j``.

Not yet the audit's path: it becomes so once a GPU has timed it against the fused kernels
(``python -m benchmarks gram --provider cuda``) and run the CUDA tests.

Public API
----------
STEP_SOURCE
    The four kernels' CUDA C source.
raw_householder_tridiagonal
    The diagonal and subdiagonal of ``Qᵀ A Q`` for a CuPy stack, by those kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oversmooth.importers.runtime.device_spectra import finish_tridiagonal

__all__ = ["STEP_SOURCE", "raw_householder_tridiagonal"]

#: Threads per block of every kernel here.
_THREADS = 128
#: The most matrices one launch covers (CUDA's limit on ``gridDim.y``).
_MATRICES_PER_LAUNCH = 65535

STEP_SOURCE = r"""
extern "C" __global__ void oversmooth_householder_reflector(
    double* a, double* v, double* d, double* e, const int n, const int k, const int count)
{
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= count) return;
    const int m = n - k - 1;
    const double* row = a + (long long)b * n * n + (long long)k * n + k + 1;
    double* vb = v + (long long)b * (n - 1);
    double largest = 0.0;
    for (int i = 0; i < m; ++i) largest = fmax(largest, fabs(row[i]));
    const double scale = largest > 0.0 ? largest : 1.0;
    double norm2 = 0.0;
    for (int i = 0; i < m; ++i) {
        const double y = row[i] / scale;
        norm2 += y * y;
    }
    const double alpha = row[0] / scale >= 0.0 ? -sqrt(norm2) : sqrt(norm2);
    double length2 = 0.0;
    for (int i = 0; i < m; ++i) {
        const double y = row[i] / scale - (i == 0 ? alpha : 0.0);
        vb[i] = y;
        length2 += y * y;
    }
    const double inverse = length2 > 0.0 ? 1.0 / sqrt(length2) : 0.0;
    for (int i = 0; i < m; ++i) vb[i] *= inverse;
    d[(long long)b * n + k] = a[(long long)b * n * n + (long long)k * n + k];
    e[(long long)b * (n - 1) + k] = alpha * scale;
}

extern "C" __global__ void oversmooth_householder_matvec(
    const double* a, const double* v, double* p, const int n, const int k, const int first)
{
    const int m = n - k - 1;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    const long long b = (long long)first + blockIdx.y;
    const double* block = a + b * n * n + (long long)(k + 1) * n + k + 1;
    const double* vb = v + b * (n - 1);
    double sum = 0.0;
    for (int j = 0; j < m; ++j) sum += block[j * n + i] * vb[j];
    p[b * (n - 1) + i] = sum;
}

extern "C" __global__ void oversmooth_householder_reflected(
    const double* v, double* p, const int n, const int k, const int count)
{
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= count) return;
    const int m = n - k - 1;
    const double* vb = v + (long long)b * (n - 1);
    double* pb = p + (long long)b * (n - 1);
    double dot = 0.0;
    for (int i = 0; i < m; ++i) dot += vb[i] * pb[i];
    for (int i = 0; i < m; ++i) pb[i] = 2.0 * (pb[i] - dot * vb[i]);
}

extern "C" __global__ void oversmooth_householder_update(
    double* a, const double* v, const double* w, const int n, const int k, const int first)
{
    const int m = n - k - 1;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= m * m) return;
    const int i = t / m;
    const int j = t - i * m;
    const long long b = (long long)first + blockIdx.y;
    double* block = a + b * n * n + (long long)(k + 1) * n + k + 1;
    const double* vb = v + b * (n - 1);
    const double* wb = w + b * (n - 1);
    block[i * n + j] -= vb[i] * wb[j] + wb[i] * vb[j];
}
"""

_MODULES: dict[str, Any] = {}


def raw_householder_tridiagonal(a: Any) -> tuple[Any, Any]:
    """Diagonal and subdiagonal of ``T = Qᵀ A Q`` for a CuPy stack, by :data:`STEP_SOURCE`.

    Parameters
    ----------
    a : (N, n, n) CuPy float64 array
        Symmetric, C-contiguous; overwritten.

    Returns
    -------
    d : (N, n) CuPy array
    e : (N, n - 1) CuPy array
        The same reflectors as
        :func:`~oversmooth.importers.runtime.device_spectra.householder_tridiagonal`'s, so the
        same T up to the order of the sums.
    """
    import cupy

    a = cupy.ascontiguousarray(a, dtype=cupy.float64)
    count, n = a.shape[0], a.shape[-1]
    d = cupy.empty((count, n), dtype=cupy.float64)
    e = cupy.zeros((count, max(n - 1, 0)), dtype=cupy.float64)
    v = cupy.empty((count, max(n - 1, 1)), dtype=cupy.float64)
    p = cupy.empty_like(v)
    kernels = _module(cupy)
    per_matrix = ((count + _THREADS - 1) // _THREADS,)
    for k in range(n - 2):
        m = n - k - 1
        step = (np.int32(n), np.int32(k))
        kernels["reflector"](per_matrix, (_THREADS,), (a, v, d, e, *step, np.int32(count)))
        for first in range(0, count, _MATRICES_PER_LAUNCH):
            rows = min(_MATRICES_PER_LAUNCH, count - first)
            grid = ((m + _THREADS - 1) // _THREADS, rows)
            kernels["matvec"](grid, (_THREADS,), (a, v, p, *step, np.int32(first)))
        kernels["reflected"](per_matrix, (_THREADS,), (v, p, *step, np.int32(count)))
        for first in range(0, count, _MATRICES_PER_LAUNCH):
            rows = min(_MATRICES_PER_LAUNCH, count - first)
            grid = ((m * m + _THREADS - 1) // _THREADS, rows)
            kernels["update"](grid, (_THREADS,), (a, v, p, *step, np.int32(first)))
    finish_tridiagonal(a, d, e)
    return d, e


def _module(cupy: Any) -> dict[str, Any]:
    """The four compiled kernels (once per process)."""
    if not _MODULES:
        module = cupy.RawModule(code=STEP_SOURCE)
        for name in ("reflector", "matvec", "reflected", "update"):
            _MODULES[name] = module.get_function(f"oversmooth_householder_{name}")
    return _MODULES
