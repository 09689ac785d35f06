"""The steps of every eigenvalue of a stack of symmetric Gram matrices on a GPU: the array code.

The layer metrics need the whole spectrum of each layer's Gram matrix (the effective rank is a
function of every singular value): for DINOv2, 25 matrices of order 257 per input. CuPy's
batched ``eigvalsh`` is cuSOLVER's Jacobi solver (``syevjBatched``), which took 0.70 ms per
matrix on an H100, 25 of them 28 times plain inference's time per input. This module computes
the same spectra in the two steps LAPACK's ``dsyev`` takes, each batched over the whole stack.
On an H200, on DINOv2's own matrices, that took 0.051 ms per matrix with the audit's
tridiagonalisation (one launch of a thread block per matrix,
:mod:`~oversmooth.importers.runtime.householder_kernels`), 0.261 with this module's fused
kernels (both within 1.6·10⁻¹⁵ λ_max of LAPACK's), against 0.686 for CuPy's ``eigvalsh``
(5.8·10⁻¹³ λ_max; docs/performance.md):

1. **Householder tridiagonalisation** ``Qᵀ G Q = T`` (:func:`householder_tridiagonal`): for
   ``k = 0 … n−3`` one reflector ``P = I − 2 v vᵀ`` per matrix zeroes column k below the
   subdiagonal; with ``p = A v`` on the trailing block A and ``w = 2 (p − (vᵀp) v)``,
   ``P A P = A − v wᵀ − w vᵀ``. The block shrinks by one each step, so a matrix costs
   ``4n³/3`` flops in ``n − 2`` steps, each a matrix–vector product and a rank-2 update over
   the whole stack at once (two fused kernels on a GPU; the audit's single launch takes the
   same reflectors). Like LAPACK's ``eigvalsh``, only the lower triangle is read: the upper is
   made its mirror image first.
2. **The tridiagonal's eigenvalues by bisection** (:func:`tridiagonal_eigenvalues`): the number
   of eigenvalues of T below x is the number of negative pivots of ``T − x I`` (Sylvester's law
   of inertia), ``q_1 = d_1 − x``, ``q_r = d_r − x − e_{r−1}² / q_{r−1}``. On a GPU one thread
   per (matrix, index j) halves Gershgorin's interval until it holds the j-th eigenvalue to
   ``2 ε ‖T‖``, as LAPACK's ``dstebz`` does with its default tolerance.

Both steps are backward stable, so each eigenvalue is within a small multiple of ``ε ‖G‖_2``
of the exact one, the accuracy of LAPACK's ``eigvalsh``. The audit calls them through
:func:`oversmooth.importers.runtime.gram_spectra.gram_eigenvalues`, which picks the
tridiagonalisation (on a GPU the single launch of
:mod:`~oversmooth.importers.runtime.householder_kernels`, above its largest order the fused
kernels here) and guards every spectrum with the Frobenius check of
:func:`~oversmooth.simulator.statistics.redo_unconverged`. On the host LAPACK's ``eigvalsh`` is
used (faster there than this); the NumPy form of step 1 exists for the tests.

Public API
----------
householder_tridiagonal
    The diagonal and subdiagonal of ``Qᵀ G Q``, batched, where the matrices are.
from_lower_triangle
    A symmetric matrix from a lower triangle, as LAPACK reads one.
finish_tridiagonal
    Its last entries, once the reflections are done (shared with
    :mod:`oversmooth.importers.runtime.householder_kernels`).
tridiagonal_eigenvalues
    Ascending eigenvalues of symmetric tridiagonal matrices, where they are.
BISECTION_SOURCE
    The bisection kernel's CUDA C source.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from oversmooth.simulator.backend import array_module

__all__ = [
    "BISECTION_SOURCE",
    "finish_tridiagonal",
    "from_lower_triangle",
    "householder_tridiagonal",
    "tridiagonal_eigenvalues",
]

#: Threads per block of the bisection kernel.
_THREADS_PER_BLOCK = 128

#: One thread per (matrix, index j): the j-th smallest eigenvalue of the symmetric tridiagonal
#: matrix with diagonal d (n) and subdiagonal e (n - 1), by bisection on Sturm counts, as
#: LAPACK's dstebz (default tolerance 2 eps ||T||, pivots kept away from 0 by pivmin).
BISECTION_SOURCE = r"""
extern "C" __global__ void oversmooth_tridiagonal_bisection(
    const double* d, const double* e, double* out, const int n, const long long total)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long matrix = i / n;
    const int j = (int)(i - matrix * n);
    const double* dm = d + matrix * n;
    const double* em = e + matrix * (n - 1);
    double lo = dm[0], hi = dm[0], e2max = 0.0;
    for (int r = 0; r < n; ++r) {
        const double left = r > 0 ? fabs(em[r - 1]) : 0.0;
        const double right = r < n - 1 ? fabs(em[r]) : 0.0;
        lo = fmin(lo, dm[r] - left - right);
        hi = fmax(hi, dm[r] + left + right);
        if (r < n - 1) e2max = fmax(e2max, em[r] * em[r]);
    }
    const double eps = 2.220446049250313e-16;
    const double pivmin = 2.2250738585072014e-308 * fmax(1.0, e2max);
    const double norm = fmax(fabs(lo), fabs(hi));
    if (norm == 0.0) { out[i] = 0.0; return; }
    const double tol = 2.0 * eps * norm;
    lo -= 2.1 * n * eps * norm + 4.2 * pivmin;
    hi += 2.1 * n * eps * norm + 4.2 * pivmin;
    /* invariant: fewer than j + 1 eigenvalues below lo, at least j + 1 below hi; each step
       halves hi - lo, so 128 steps bound the loop even for a non-finite input */
    for (int step = 0; step < 128; ++step) {
        const double mid = 0.5 * (lo + hi);
        if (hi - lo <= tol || mid <= lo || mid >= hi) break;
        double q = dm[0] - mid;
        if (fabs(q) < pivmin) q = -pivmin;
        int below = q < 0.0;
        for (int r = 1; r < n; ++r) {
            q = (dm[r] - mid) - em[r - 1] * em[r - 1] / q;
            if (fabs(q) < pivmin) q = -pivmin;
            below += q < 0.0;
        }
        if (below > j) hi = mid; else lo = mid;
    }
    out[i] = 0.5 * (lo + hi);
}
"""

_KERNELS: dict[str, Any] = {}


def from_lower_triangle(a: Any) -> Any:
    """A new ``(..., n, n)`` array: ``a``'s lower triangle and diagonal, mirrored above it.

    A Gram matrix computed by a general matrix product need not be exactly symmetric; LAPACK's
    ``eigvalsh`` reads the lower triangle alone, and so, through this, does the device solver.
    """
    xp = array_module(a)
    return xp.tril(a) + xp.swapaxes(xp.tril(a, -1), -1, -2)


def householder_tridiagonal(a: Any) -> tuple[Any, Any]:
    """Diagonal and subdiagonal of ``T = Qᵀ A Q`` for a stack of symmetric matrices.

    Parameters
    ----------
    a : (N, n, n) float64 array
        Symmetric; overwritten (its lower trailing blocks hold the updated matrices).

    Returns
    -------
    d : (N, n) array
    e : (N, n - 1) array
        In ``a``'s library. Step k reflects ``x = a[:, k+1:, k]`` onto ``α e₁`` with
        ``α = −sign(x₀) ‖x‖`` and ``v = (x − α e₁) / ‖x − α e₁‖`` (no reflection where x = 0),
        both computed from ``x / max|x|`` so that no square under- or overflows.
    """
    xp = array_module(a)
    count, n = a.shape[0], a.shape[-1]
    matvec, rank2_update = _trailing_operations(xp)
    d = xp.empty((count, n), dtype=xp.float64)
    e = xp.zeros((count, max(n - 1, 0)), dtype=xp.float64)
    for k in range(n - 2):
        x = a[:, k + 1 :, k]
        largest = xp.max(xp.abs(x), axis=1)
        scale = xp.where(largest > 0, largest, 1.0)  # x / scale neither under- nor overflows
        v = x / scale[:, None]
        norm = xp.sqrt(xp.sum(v * v, axis=1))
        alpha = xp.where(v[:, 0] >= 0, -norm, norm)
        v[:, 0] -= alpha
        length = xp.sqrt(xp.sum(v * v, axis=1))
        v *= xp.where(length > 0, 1.0 / xp.where(length > 0, length, 1.0), 0.0)[:, None]
        alpha *= scale
        trailing = a[:, k + 1 :, k + 1 :]
        p = matvec(trailing, v)
        w = 2.0 * (p - xp.sum(v * p, axis=1)[:, None] * v)
        rank2_update(trailing, v, w)
        d[:, k] = a[:, k, k]
        e[:, k] = alpha
    finish_tridiagonal(a, d, e)
    return d, e


def finish_tridiagonal(a: Any, d: Any, e: Any) -> None:
    """Fill the last two diagonal entries and the last subdiagonal one of ``d`` (N, n) and ``e``
    (N, n − 1) from ``a`` (N, n, n), whose first n − 2 steps of reflection are done."""
    n = a.shape[-1]
    if n >= 2:
        d[:, n - 2] = a[:, n - 2, n - 2]
        e[:, n - 2] = a[:, n - 1, n - 2]
    if n >= 1:
        d[:, n - 1] = a[:, n - 1, n - 1]


def tridiagonal_eigenvalues(d: Any, e: Any) -> Any:
    """Ascending eigenvalues of symmetric tridiagonal matrices, in their library.

    Parameters
    ----------
    d : (N, n) float64 array
        Diagonals.
    e : (N, n - 1) float64 array
        Subdiagonals.

    Returns
    -------
    (N, n) array
        CuPy: by the bisection kernel, one thread per eigenvalue. NumPy: LAPACK (``dstemr``
        through SciPy), one matrix at a time (the reference the tests compare with).
    """
    xp = array_module(d)
    count, n = d.shape
    if xp is np:
        if n == 0:
            return np.empty((count, 0))
        return np.stack(
            [scipy.linalg.eigvalsh_tridiagonal(d[i], e[i]) for i in range(count)]
        ).reshape(count, n)
    out = xp.empty((count, n), dtype=xp.float64)
    total = count * n
    if total:
        blocks = (total + _THREADS_PER_BLOCK - 1) // _THREADS_PER_BLOCK
        _bisection_kernel(xp)(
            (blocks,),
            (_THREADS_PER_BLOCK,),
            (xp.ascontiguousarray(d), xp.ascontiguousarray(e), out, np.int32(n), np.int64(total)),
        )
    return out


def _bisection_kernel(xp: Any) -> Any:
    """The compiled bisection kernel (CuPy's ``RawKernel``, compiled once per process)."""
    if "bisection" not in _KERNELS:
        _KERNELS["bisection"] = xp.RawKernel(BISECTION_SOURCE, "oversmooth_tridiagonal_bisection")
    return _KERNELS["bisection"]


def _trailing_operations(xp: Any) -> tuple[Any, Any]:
    """``matvec(A, v) = A v`` over a stack of trailing blocks and ``rank2_update(A, v, w)``,
    ``A −= v wᵀ + w vᵀ`` in place: on CuPy two fused kernels (one pass over the blocks each, on
    the strided views, no copy); elsewhere plain array operations."""
    if xp is np:
        return _matvec, _rank2_update
    if "matvec" not in _KERNELS:
        _KERNELS["matvec"] = xp.ReductionKernel(
            "T x, T y", "T p", "x * y", "a + b", "p = a", "0", "oversmooth_stacked_matvec"
        )
        _KERNELS["rank2"] = xp.ElementwiseKernel(
            "T vi, T wj, T wi, T vj", "T a", "a -= vi * wj + wi * vj", "oversmooth_rank2_update"
        )
    matvec, rank2 = _KERNELS["matvec"], _KERNELS["rank2"]
    return (
        lambda block, v: matvec(block, v[:, None, :], axis=2),
        lambda block, v, w: rank2(
            v[:, :, None], w[:, None, :], w[:, :, None], v[:, None, :], block
        ),
    )


def _matvec(block: Any, v: Any) -> Any:
    return (block @ v[:, :, None])[:, :, 0]


def _rank2_update(block: Any, v: Any, w: Any) -> None:
    block -= v[:, :, None] * w[:, None, :] + w[:, :, None] * v[:, None, :]
