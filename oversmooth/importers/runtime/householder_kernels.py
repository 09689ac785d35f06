"""The Householder tridiagonalisation as raw CUDA kernels: the audit's, and one alternative.

:func:`~oversmooth.importers.runtime.device_spectra.householder_tridiagonal` runs each step as
two fused CuPy kernels (the trailing blocks' product and rank-2 update) and about thirty small
array operations (the reflector). On an H100 that took 0.46–0.52 ms per matrix of order 257,
about ten times what the memory traffic needs. Two ways to fewer launches and less traffic:

**Four kernels per step** (:data:`STEP_SOURCE`, :func:`raw_householder_tridiagonal`), with plain
two-dimensional indexing per matrix (``blockIdx.y`` is the matrix, 32-bit offsets inside it), no
shared memory and no synchronisation:

1. ``reflector`` (a thread per matrix): from row k right of the diagonal (column k below it, by
   symmetry) ``x``, scaled by ``max|x|``: ``α = −sign(x₀)‖x‖``, ``v = (x − α e₁)/‖x − α e₁‖``,
   and ``d_k = a_kk``, ``e_k = α``;
2. ``matvec`` (a thread per row i): ``p_i = Σ_j A_ji v_j`` on the trailing block A (symmetric,
   read along rows so that neighbouring threads read neighbouring addresses);
3. ``reflected`` (a thread per matrix): ``w = 2 (p − (vᵀp) v)``, in place of p;
4. ``update`` (a thread per element): ``A_ij −= v_i w_j + w_i v_j``.

**One launch for the whole stack** (:data:`BLOCK_SOURCE`, :func:`block_householder_tridiagonal`):
a thread block per matrix (up to 128 threads, whole warps, about one per column) runs all
``n − 2`` steps, its reflector and ``w`` in shared memory, the block's threads synchronised
between the phases of a step. Step k − 1's rank-2 update is not a pass of its own: step k
applies it to row k on the fly (that row is step k's ``x``) and to the trailing block in the
same pass that forms ``p = A v``, a thread per column i reading and writing ``A_ji`` down the
column (neighbouring threads, neighbouring addresses). One read and one write of the trailing
block per step instead of two reads and a write, and no launch per step. ``‖x‖`` is one block
reduction of (scale, sum of squares relative to it) pairs, as LAPACK's ``dnrm2`` keeps them, and
``‖x − α e₁‖² = 2‖x‖(‖x‖ + |x₀|)`` needs no second one. It needs ``4n + 2·threads + 1`` doubles
of shared memory: up to order :data:`BLOCK_MAX_ORDER`; larger stacks take the fused kernels.

Both are tested on the CPU, their CUDA source compiled by the host's C++ compiler: the four
kernels' threads share no memory and never synchronise, so they run one after another; the
single launch's threads run as host threads, ``__syncthreads`` a barrier between them
(``tests/importers/runtime/device_helpers.py``). Timed on an H200 (``python -m benchmarks gram
--provider cuda``, DINOv2's 800 Gram matrices of order 257, spectrum included), the single
launch took 0.051 ms per matrix, the four kernels 0.107 and the fused ones 0.261, all three within
3.5·10⁻¹⁵ λ_max of LAPACK; the single launch is the audit's
(:data:`~oversmooth.importers.runtime.gram_spectra.AUDIT_TRIDIAGONALISATION`), the others stay
for the benchmarks (:mod:`~oversmooth.importers.runtime.panel_kernel` builds on it).

Public API
----------
STEP_SOURCE
    The four kernels' CUDA C source.
BLOCK_SOURCE, PAIR_REDUCE_SOURCE
    The single launch's CUDA C source, and its block reduction and reflector (the panel
    kernel's too).
BLOCK_MAX_ORDER
    The largest order the single launch takes.
raw_householder_tridiagonal
    The diagonal and subdiagonal of ``Qᵀ A Q`` for a CuPy stack, by the four kernels.
block_householder_tridiagonal
    The same by the single launch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oversmooth.importers.runtime.device_spectra import (
    finish_tridiagonal,
    householder_tridiagonal,
)

__all__ = [
    "BLOCK_MAX_ORDER",
    "BLOCK_SOURCE",
    "PAIR_REDUCE_SOURCE",
    "STEP_SOURCE",
    "block_householder_tridiagonal",
    "raw_householder_tridiagonal",
]

#: Threads per block of every kernel here (a power of two: the block reductions halve it).
_THREADS = 128
#: Shared memory a block may use without opting in, in doubles (48 KiB on every CUDA device).
_SHARED_DOUBLES = 48 * 1024 // 8
#: The largest order :func:`block_householder_tridiagonal` takes: 4n + 2·threads + 1 doubles.
BLOCK_MAX_ORDER = (_SHARED_DOUBLES - 2 * _THREADS - 1) // 4
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

#: One thread block per matrix, ``blockDim.x`` a power of two, ``4n + 2·blockDim.x + 1`` doubles
#: of dynamic shared memory: v and w of steps k and k − 1 (alternating halves), the reduction's
#: two arrays and x₀. Writes d and e; leaves the last 2 × 2 block for finish_tridiagonal.
PAIR_REDUCE_SOURCE = r"""
__device__ void oversmooth_pair_reduce(double* big, double* sum, const bool pair)
{
    /* tree reduction of (big[t], sum[t]) over the block: with pair, (scale, sum of squares
       relative to it) combine as (s, q1 (s1/s)^2 + q2 (s2/s)^2); else plain sums of sum[t] */
    const int t = threadIdx.x;
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        __syncthreads();
        if (t < half) {
            if (pair) {
                const double s1 = big[t], s2 = big[t + half];
                const double s = fmax(s1, s2);
                if (s > 0.0) {
                    const double r1 = s1 / s, r2 = s2 / s;
                    sum[t] = sum[t] * r1 * r1 + sum[t + half] * r2 * r2;
                }
                big[t] = s;
            } else {
                sum[t] += sum[t + half];
            }
        }
    }
    __syncthreads();
}

__device__ double oversmooth_reflector(
    double* v, double* big, double* sum, const double& first, const double largest,
    const int k, const int n)
{
    /* v[k + 1..n) holds x (each thread its own entries, largest the largest |x_j| among them),
       first x0 as its owner wrote it: v becomes the unit reflector (x - alpha e1) /
       ||x - alpha e1||, and the subdiagonal entry alpha comes back */
    const int t = threadIdx.x;
    const int threads = blockDim.x;
    big[t] = largest;
    double squares = 0.0;
    if (largest > 0.0)
        for (int j = k + 1 + t; j < n; j += threads) {
            const double y = v[j] / largest;
            squares += y * y;
        }
    sum[t] = squares;
    oversmooth_pair_reduce(big, sum, true);
    const double scale = big[0] > 0.0 ? big[0] : 1.0;
    const double norm = sqrt(sum[0]);  /* ||x|| / scale */
    const double x0 = first / scale;
    const double alpha = x0 >= 0.0 ? -norm : norm;
    /* ||x - alpha e1||^2 = 2 ||x|| (||x|| + |x0|), relative to scale^2 */
    const double length = sqrt(2.0 * norm * (norm + fabs(x0)));
    const double inverse = length > 0.0 ? 1.0 / length : 0.0;
    for (int j = k + 1 + t; j < n; j += threads)
        v[j] = (v[j] / scale - (j == k + 1 ? alpha : 0.0)) * inverse;
    return alpha * scale;
}
"""

BLOCK_SOURCE = (
    PAIR_REDUCE_SOURCE
    + r"""
__device__ double oversmooth_updated(
    const double a, const double vj, const double wj, const double vi, const double wi)
{
    /* entry (j, i) of A - v w^T - w v^T, from a = A_ji: the one form of every deferred update */
    return a - vj * wi - wj * vi;
}

extern "C" __global__ void oversmooth_block_tridiagonal(
    double* a, double* d, double* e, const int n)
{
    extern __shared__ double oversmooth_shared[];
    const int t = threadIdx.x;
    const int threads = blockDim.x;
    double* A = a + (long long)blockIdx.x * n * n;
    double* dm = d + (long long)blockIdx.x * n;
    double* em = e + (long long)blockIdx.x * (n - 1);
    double* vs[2] = {oversmooth_shared, oversmooth_shared + n};
    double* ws[2] = {oversmooth_shared + 2 * n, oversmooth_shared + 3 * n};
    double* big = oversmooth_shared + 4 * n;
    double* sum = big + threads;
    double* first = sum + threads;  /* x0, as its owner computed it: one value for every thread */
    for (int i = t; i < n; i += threads) {
        vs[1][i] = 0.0;
        ws[1][i] = 0.0;
    }
    __syncthreads();
    for (int k = 0; k + 2 < n; ++k) {
        double* v = vs[k % 2];
        double* w = ws[k % 2];
        const double* vp = vs[1 - k % 2];  /* step k - 1's reflector, its update pending */
        const double* wp = ws[1 - k % 2];
        const double* row = A + (long long)k * n;
        /* x: row k right of the diagonal, with step k - 1's update */
        double largest = 0.0;
        for (int j = k + 1 + t; j < n; j += threads) {
            const double x = oversmooth_updated(row[j], vp[k], wp[k], vp[j], wp[j]);
            v[j] = x;
            if (j == k + 1) *first = x;
            largest = fmax(largest, fabs(x));
        }
        const double beta = oversmooth_reflector(v, big, sum, *first, largest, k, n);
        if (t == 0) {
            dm[k] = oversmooth_updated(row[k], vp[k], wp[k], vp[k], wp[k]);
            em[k] = beta;
        }
        __syncthreads();
        /* one pass over the trailing block, a thread per column i: step k - 1's update, then
           p = A v. Four loads are issued before their stores: the compiler may not move a load
           of the column above a store it cannot prove is elsewhere. */
        double dot = 0.0;
        for (int i = k + 1 + t; i < n; i += threads) {
            const double vpi = vp[i], wpi = wp[i];
            double* column = A + i;
            double p = 0.0;
            int j = k + 1;
            for (; j + 3 < n; j += 4) {
                double a[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) a[u] = column[(long long)(j + u) * n];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    a[u] = oversmooth_updated(a[u], vp[j + u], wp[j + u], vpi, wpi);
                    column[(long long)(j + u) * n] = a[u];
                    p += a[u] * v[j + u];
                }
            }
            for (; j < n; ++j) {
                const double a =
                    oversmooth_updated(column[(long long)j * n], vp[j], wp[j], vpi, wpi);
                column[(long long)j * n] = a;
                p += a * v[j];
            }
            w[i] = p;
            dot += v[i] * p;
        }
        sum[t] = dot;
        oversmooth_pair_reduce(big, sum, false);
        const double c = sum[0];
        for (int i = k + 1 + t; i < n; i += threads) w[i] = 2.0 * (w[i] - c * v[i]);
        __syncthreads();
    }
    if (n >= 3 && t == 0) {
        /* the last step's update of the last 2 x 2 block */
        const double* v = vs[(n - 3) % 2];
        const double* w = ws[(n - 3) % 2];
        for (int i = n - 2; i < n; ++i)
            for (int j = n - 2; j < n; ++j) {
                double* entry = A + (long long)i * n + j;
                *entry = oversmooth_updated(*entry, v[i], w[i], v[j], w[j]);
            }
    }
}
"""
)

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
        same T up to rounding: the order of the sums and, on a GPU, fused multiply–adds (T's
        late entries are not forward stable and move more than its eigenvalues).
    """
    import cupy

    a = cupy.ascontiguousarray(a, dtype=cupy.float64)
    count, n = a.shape[0], a.shape[-1]
    d = cupy.empty((count, n), dtype=cupy.float64)
    e = cupy.zeros((count, max(n - 1, 0)), dtype=cupy.float64)
    v = cupy.empty((count, max(n - 1, 1)), dtype=cupy.float64)
    p = cupy.empty_like(v)
    kernels = _step_kernels(cupy)
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


def block_householder_tridiagonal(a: Any) -> tuple[Any, Any]:
    """Diagonal and subdiagonal of ``T = Qᵀ A Q`` for a CuPy stack, in one launch of
    :data:`BLOCK_SOURCE` (a thread block per matrix).

    Parameters
    ----------
    a : (N, n, n) CuPy float64 array
        Symmetric, C-contiguous; overwritten. Above order :data:`BLOCK_MAX_ORDER` (its vectors
        would not fit in a block's shared memory) the fused kernels of
        :func:`~oversmooth.importers.runtime.device_spectra.householder_tridiagonal` run instead.

    Returns
    -------
    d : (N, n) CuPy array
    e : (N, n - 1) CuPy array
        The same reflectors as the fused kernels', so the same T up to rounding, as
        :func:`raw_householder_tridiagonal`'s.
    """
    count, n = a.shape[0], a.shape[-1]
    if n > BLOCK_MAX_ORDER:
        return householder_tridiagonal(a)
    import cupy

    a = cupy.ascontiguousarray(a, dtype=cupy.float64)
    d = cupy.empty((count, n), dtype=cupy.float64)
    e = cupy.zeros((count, max(n - 1, 0)), dtype=cupy.float64)
    if count and n > 2:
        threads = _block_threads(n)
        shared = 8 * (4 * n + 2 * threads + 1)
        _block_kernel(cupy)((count,), (threads,), (a, d, e, np.int32(n)), shared_mem=shared)
    finish_tridiagonal(a, d, e)
    return d, e


def _block_threads(n: int) -> int:
    """Threads of the single launch's block for order n: one per column of the first trailing
    block (n − 1), rounded up to a power of two, at least a warp (32), at most :data:`_THREADS`;
    a small matrix leaves no threads idle that another block could use."""
    return min(_THREADS, max(32, 1 << max(n - 2, 0).bit_length()))


def _step_kernels(cupy: Any) -> dict[str, Any]:
    """The four kernels of :data:`STEP_SOURCE`, compiled once per process."""
    if "matvec" not in _MODULES:
        module = cupy.RawModule(code=STEP_SOURCE)
        for name in ("reflector", "matvec", "reflected", "update"):
            _MODULES[name] = module.get_function(f"oversmooth_householder_{name}")
    return _MODULES


def _block_kernel(cupy: Any) -> Any:
    """The single launch's kernel of :data:`BLOCK_SOURCE`, compiled once per process (and
    without compiling the four others, which it does not need)."""
    if "block" not in _MODULES:
        _MODULES["block"] = cupy.RawKernel(BLOCK_SOURCE, "oversmooth_block_tridiagonal")
    return _MODULES["block"]
