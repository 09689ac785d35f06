"""The Householder tridiagonalisation in panels: one launch, a thread block per matrix, the
trailing block written once per panel instead of once per step.

The single launch (:data:`~oversmooth.importers.runtime.householder_kernels.BLOCK_SOURCE`)
reads and writes the trailing block at every step: step k − 1's rank-2 update is applied in
the pass that forms step k's ``p = A v``. On an H200 it moved about 2.1 TB/s, bound by that
traffic (docs/performance.md). Here the updates of ``w`` consecutive steps (a panel) are kept
aside, as LAPACK's ``dsytrd``/``dlatrd`` keep them, and applied to the trailing block in one
pass at the panel's end. With ``V`` and ``W`` the panel's reflectors and update vectors so far
(``q < m``), the block as step k would see it is ``A − Σ_q (v_q w_qᵀ + w_q v_qᵀ)``, so step k

1. takes its ``x`` (row k right of the diagonal) and ``d_k`` from the stored row k with the
   panel's earlier updates applied on the fly (a few products per entry);
2. forms ``p = A v`` from the stored block, **read only**, eight loads in flight per thread
   (nothing is stored in that pass, so no load waits for a store), a thread per column, together with the sums ``vᵀAv``, ``V_qᵀ v`` and ``W_qᵀ v`` in one block
   reduction;
3. corrects it, ``p −= Σ_q (v_q (w_qᵀ v) + w_q (v_qᵀ v))`` and
   ``c = vᵀp = vᵀAv − 2 Σ_q (v_qᵀ v)(w_qᵀ v)``, and keeps ``w = 2 (p − c v)`` beside ``v``.

At the panel's end one pass reads and writes the trailing block with all ``w`` updates. Per
step that is one read of the trailing block plus a read and a write per panel: ``1 + 2/w``
passes against the single launch's two (``w = 7`` at order 257: 1.29, a 1.56× smaller
traffic). The reflectors are the single launch's, the sums in another order: the same ``T`` to
round-off. ``V`` and ``W`` live in shared memory, ``2 w n`` doubles, beside the reduction's
``(2 w + 1)`` rows of one double per thread: :func:`panel_width` is the widest panel that fits
in the 48 KiB a block gets without opting in (at most :data:`MAX_PANEL`); an order where no
panel of 2 fits takes the single launch.

Tested on the CPU like the single launch, its source compiled by the host's C++ compiler with
the block's threads as host threads; **not yet timed on a GPU** (``python -m benchmarks gram
--provider cuda`` and ``benchmarks device --gram-solver panel`` time it).

Public API
----------
PANEL_SOURCE
    The kernel's CUDA C source.
MAX_PANEL, panel_width
    The widest panel the kernel takes, and the widest that fits for an order.
panel_householder_tridiagonal
    The diagonal and subdiagonal of ``Qᵀ A Q`` for a CuPy stack, by the panel kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oversmooth.importers.runtime.device_spectra import finish_tridiagonal
from oversmooth.importers.runtime.householder_kernels import (
    PAIR_REDUCE_SOURCE,
    _block_threads,
    block_householder_tridiagonal,
)

__all__ = ["MAX_PANEL", "PANEL_SOURCE", "panel_householder_tridiagonal", "panel_width"]

#: The widest panel: the registers that hold a thread's partial sums and a column's panel
#: entries are sized for it at compile time.
MAX_PANEL = 8
#: Shared memory a block may use without opting in, in doubles (48 KiB on every CUDA device).
_SHARED_DOUBLES = 48 * 1024 // 8

#: One thread block per matrix, ``blockDim.x`` a power of two, ``panel`` at most
#: OVERSMOOTH_MAX_PANEL, ``2 panel n + (2 panel + 1) blockDim.x + 1`` doubles of dynamic shared
#: memory: V and W (row q of each is step q of the panel), the reduction's rows, x0. Writes d and
#: e; leaves the last 2 × 2 block for finish_tridiagonal.
PANEL_SOURCE = (
    f"#define OVERSMOOTH_MAX_PANEL {MAX_PANEL}\n"
    + PAIR_REDUCE_SOURCE
    + r"""
extern "C" __global__ void oversmooth_panel_tridiagonal(
    double* a, double* d, double* e, const int n, const int panel)
{
    extern __shared__ double oversmooth_shared[];
    const int t = threadIdx.x;
    const int threads = blockDim.x;
    double* A = a + (long long)blockIdx.x * n * n;
    double* dm = d + (long long)blockIdx.x * n;
    double* em = e + (long long)blockIdx.x * (n - 1);
    double* V = oversmooth_shared;          /* V[q * n + i]: step q's reflector */
    double* W = V + panel * n;              /* W[q * n + i]: step q's update vector */
    double* rows = W + panel * n;           /* the reduction's 2 panel + 1 rows of threads */
    double* first = rows + (2 * panel + 1) * threads;
    for (int k0 = 0; k0 + 2 < n; k0 += panel) {
        int m = 0;
        for (; m < panel && k0 + m + 2 < n; ++m) {
            const int k = k0 + m;
            double* v = V + m * n;
            double* w = W + m * n;
            const double* row = A + (long long)k * n;
            /* x: row k right of the diagonal, with the panel's earlier updates */
            double largest = 0.0;
            for (int j = k + 1 + t; j < n; j += threads) {
                double x = row[j];
                for (int q = 0; q < m; ++q)
                    x -= V[q * n + k] * W[q * n + j] + W[q * n + k] * V[q * n + j];
                v[j] = x;
                if (j == k + 1) *first = x;
                largest = fmax(largest, fabs(x));
            }
            const double beta =
                oversmooth_reflector(v, rows, rows + threads, *first, largest, k, n);
            if (t == 0) {
                double diagonal = row[k];
                for (int q = 0; q < m; ++q) diagonal -= 2.0 * V[q * n + k] * W[q * n + k];
                dm[k] = diagonal;
                em[k] = beta;
            }
            __syncthreads();
            /* p = A v from the stored block, read only, a thread per column i; with it the
               partial sums of v'Av, V_q'v and W_q'v */
            double partial[2 * OVERSMOOTH_MAX_PANEL + 1];
#pragma unroll
            for (int r = 0; r < 2 * OVERSMOOTH_MAX_PANEL + 1; ++r) partial[r] = 0.0;
            for (int i = k + 1 + t; i < n; i += threads) {
                const double* column = A + i;
                double p = 0.0;
                int j = k + 1;
                for (; j + 7 < n; j += 8) {
                    double s[8];
#pragma unroll
                    for (int u = 0; u < 8; ++u) s[u] = column[(long long)(j + u) * n];
#pragma unroll
                    for (int u = 0; u < 8; ++u) p += s[u] * v[j + u];
                }
                for (; j < n; ++j) p += column[(long long)j * n] * v[j];
                w[i] = p;  /* A v before the panel's corrections */
                const double vi = v[i];
                partial[0] += vi * p;
#pragma unroll
                for (int q = 0; q < OVERSMOOTH_MAX_PANEL; ++q)
                    if (q < m) {
                        partial[1 + q] += V[q * n + i] * vi;
                        partial[1 + OVERSMOOTH_MAX_PANEL + q] += W[q * n + i] * vi;
                    }
            }
            rows[t] = partial[0];
#pragma unroll
            for (int q = 0; q < OVERSMOOTH_MAX_PANEL; ++q)
                if (q < m) {
                    rows[(1 + q) * threads + t] = partial[1 + q];
                    rows[(1 + panel + q) * threads + t] = partial[1 + OVERSMOOTH_MAX_PANEL + q];
                }
            for (int half = threads / 2; half > 0; half /= 2) {
                __syncthreads();
                if (t < half)
                    for (int r = 0; r < 2 * m + 1; ++r) {
                        const int at = (r <= m ? r : panel + r - m) * threads + t;
                        rows[at] += rows[at + half];
                    }
            }
            __syncthreads();
            /* c = v'p after the corrections: v'Av - 2 sum_q (V_q'v)(W_q'v) */
            double c = rows[0];
            for (int q = 0; q < m; ++q)
                c -= 2.0 * rows[(1 + q) * threads] * rows[(1 + panel + q) * threads];
            for (int i = k + 1 + t; i < n; i += threads) {
                double p = w[i];
                for (int q = 0; q < m; ++q)
                    p -= V[q * n + i] * rows[(1 + panel + q) * threads]
                        + W[q * n + i] * rows[(1 + q) * threads];
                w[i] = 2.0 * (p - c * v[i]);
            }
            __syncthreads();
        }
        /* the panel's updates of the trailing block after its last step, a thread per column */
        const int after = k0 + m;
        for (int i = after + t; i < n; i += threads) {
            double vi[OVERSMOOTH_MAX_PANEL], wi[OVERSMOOTH_MAX_PANEL];
#pragma unroll
            for (int q = 0; q < OVERSMOOTH_MAX_PANEL; ++q) {
                vi[q] = q < m ? V[q * n + i] : 0.0;
                wi[q] = q < m ? W[q * n + i] : 0.0;
            }
            double* column = A + i;
            for (int j = after; j < n; ++j) {
                double entry = column[(long long)j * n];
#pragma unroll
                for (int q = 0; q < OVERSMOOTH_MAX_PANEL; ++q)
                    if (q < m) entry -= V[q * n + j] * wi[q] + W[q * n + j] * vi[q];
                column[(long long)j * n] = entry;
            }
        }
        __syncthreads();
    }
}
"""
)

_MODULES: dict[str, Any] = {}


def panel_width(n: int, threads: int) -> int:
    """The widest panel, at most :data:`MAX_PANEL`, whose shared memory fits in 48 KiB at order
    ``n`` with ``threads`` threads: ``2 w n + (2 w + 1) threads + 1`` doubles (7 at order 257
    with 128 threads; 0 where none fits)."""
    fits = (_SHARED_DOUBLES - threads - 1) // (2 * n + 2 * threads)
    return max(0, min(MAX_PANEL, fits))


def panel_householder_tridiagonal(a: Any) -> tuple[Any, Any]:
    """Diagonal and subdiagonal of ``T = Qᵀ A Q`` for a CuPy stack, in one launch of
    :data:`PANEL_SOURCE` (a thread block per matrix, panels of :func:`panel_width` steps).

    Parameters
    ----------
    a : (N, n, n) CuPy float64 array
        Symmetric, C-contiguous; overwritten. Where no panel of two steps fits in a block's
        shared memory, the single launch
        (:func:`~oversmooth.importers.runtime.householder_kernels.block_householder_tridiagonal`)
        runs instead.

    Returns
    -------
    d : (N, n) CuPy array
    e : (N, n - 1) CuPy array
        The single launch's reflectors, so its T up to rounding.
    """
    count, n = a.shape[0], a.shape[-1]
    threads = _block_threads(n)
    width = panel_width(n, threads)
    if width < 2:
        return block_householder_tridiagonal(a)
    import cupy

    a = cupy.ascontiguousarray(a, dtype=cupy.float64)
    d = cupy.empty((count, n), dtype=cupy.float64)
    e = cupy.zeros((count, max(n - 1, 0)), dtype=cupy.float64)
    if count and n > 2:
        shared = 8 * (2 * width * n + (2 * width + 1) * threads + 1)
        arguments = (a, d, e, np.int32(n), np.int32(width))
        _panel_kernel(cupy)((count,), (threads,), arguments, shared_mem=shared)
    finish_tridiagonal(a, d, e)
    return d, e


def _panel_kernel(cupy: Any) -> Any:
    """The kernel of :data:`PANEL_SOURCE`, compiled once per process."""
    if "panel" not in _MODULES:
        _MODULES["panel"] = cupy.RawKernel(PANEL_SOURCE, "oversmooth_panel_tridiagonal")
    return _MODULES["panel"]
