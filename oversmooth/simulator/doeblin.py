"""Certified bounds on the non-Perron eigenvalues of row-stochastic matrices, many at once.

:mod:`oversmooth.simulator.perron` decides the kind of the dominating eigenvalue of ``I + H ⊗ A`` without the
spectrum of A when a bound ρ on every non-Perron ``|λ^A|`` is small enough. This module computes
such bounds from matrix products alone, counting every rounding error, on NumPy arrays or on a
device library's (CuPy) alike (:mod:`oversmooth.simulator.backend`).

Bound
-----
Brauer's theorem: if ``A 𝟙 = 𝟙``, then for any vector c the eigenvalues of ``A − 𝟙 cᵀ`` are
``1 − cᵀ𝟙`` and the eigenvalues of A with one copy of 1 removed. So every non-Perron eigenvalue λ
has ``|λ| ≤ ‖A − 𝟙 cᵀ‖_∞``; with c the column minima of a nonnegative A this is Doeblin's
ergodicity coefficient ``τ(A) = 1 − Σ_k min_i a_ik``. ``A^k`` is stochastic too, with non-Perron
eigenvalues ``λ^k``, so ``|λ| ≤ τ(A^k)^{1/k}``, which tends to ``max |λ|`` as k grows. The powers
``k = 2^s`` come from squaring the deflated matrix itself: if ``B = A^{k/2} − 𝟙 dᵀ`` then
``B² = A^k − 𝟙 d'ᵀ`` (because ``A^{k/2} 𝟙 = 𝟙``), and Brauer applies again to
``B_s = B² − 𝟙 c_sᵀ`` with c_s the column minima of B². Working with the small residual B_s keeps
relative accuracy where ``1 − Σ min`` would cancel. When ``ρ < 1`` the root 1 is also simple.

A second disk, about α > 0: the same bound applied to ``X = A − αI`` (``X 𝟙 = (1 − α) 𝟙``; its
other eigenvalues are ``λ − α``) gives ``|λ − α| ≤ R`` (``shift``). :func:`nonperron_estimate`
estimates (does not bound) the largest non-Perron ``|λ − α|`` by power iteration, to order the
work.

Rounding
--------
The certificate is for the exact row normalisation ``Ā = diag(Â𝟙)⁻¹ Â`` of the float matrix Â, and
counts every rounding error: ``‖Â − Ā‖_∞ = max_i |r_i − 1|``; a float product of nonnegative
matrices has entrywise relative error ``γ_n = n u / (1 − n u)`` (any summation order), so
``‖fl(X̂X̂) − X²‖_∞ ≤ γ_n ‖X̂‖² + 2 ‖X̂‖ e + e²`` when ``‖X̂ − X‖_∞ ≤ e``; each subtraction and row sum
adds ``2u`` and ``γ_n`` relative; each residual is rescaled by an exact power of 2, with
underflow counted as one subnormal step per term. The bound is computed from these, never from
the float value alone. The dense path works with eigenvalues of Â computed to a backward error
of a few u; :data:`~oversmooth.simulator.tolerances.PERRON_MARGIN` (relative) keeps a certified case away
from the tie threshold by far more than that, so the dense path finds the same kind, and μ, λ^A,
λ^H agree to round-off.

Functions
---------
nonperron_radius    -- a certified bound on ``|λ − α|`` for every non-Perron eigenvalue of each A
radius_bounds       -- the same, each head stopping once below its own target (for the certificate)
nonperron_estimate  -- an estimate, not a bound, of the largest non-Perron ``|λ − α|``
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.backend import array_module
from oversmooth.simulator.tolerances import EPS, STOCHASTIC_ATOL

__all__ = [
    "HOPELESS_SQUARINGS",
    "MAX_SQUARINGS",
    "as_float64",
    "nonperron_estimate",
    "nonperron_radius",
    "radius_bounds",
]

#: At most this many squarings (A^256) before a head goes to the dense path.
MAX_SQUARINGS = 8
#: Squarings always tried before the stall test may give up on a head.
_STALL_AFTER = 5
#: Give up when the bound, extrapolated this many of its last steps (in log), stays above target.
_STALL_STEPS = 4.0
#: Power iterations of the estimate that decides which disk a head tries
#: (:func:`nonperron_estimate`), and the last ones over which its growth is averaged.
_ESTIMATE_ITERATIONS = 30
_ESTIMATE_WINDOW = 8
#: Squarings of the first disk before a head is estimated; one whose estimate says that disk
#: cannot certify it stops there, with the ρ it has for the second disk's target. Since the
#: estimate runs in cache (about 0.6 of a squaring a head), estimating before any squaring is
#: cheapest: on 144 DINOv2 cases (effective H, one thread) the whole step took 0.74 s at 0, 0.80 at
#: 1, 0.88 at 2 and 0.84 at 3, although 3 squarings' tighter ρ lets the second disk certify 90
#: heads instead of 80 (the other 10 take the dense path, same kinds).
HOPELESS_SQUARINGS = 0
_U = EPS / 2
_TINY = float(np.finfo(np.float64).smallest_subnormal)
#: Heads taken together through a squaring's product and O(n²) passes (a 257×257 float64 head is
#: 0.5 MiB: a chunk is still in cache for the passes after its product; 12 % less CPU on DINOv2),
#: and through the estimate's power iterations (all 30 on a chunk while it is in cache: 2-3x
#: faster than each iteration streaming every head of a stack from memory).
#: On a device every head of a stack goes at once: there each pass is one kernel launch.
_CHUNK_HEADS = 4
#: Rescale by at most 2^±this per squaring (float64 holds 2^±1022 in its normal range).
_RESCALE_LIMIT = 900


class _Residual(NamedTuple):
    """A residual ``B = 2^scale · B̂`` with ``B̂ ≥ 0`` (heads, n, n), known to within a bound.

    ``‖B̂‖_∞ ≤ norm`` and ``‖B̂ − B_exact / 2^scale‖_∞ ≤ error`` for the exact residual B_exact of
    the module docstring, so ``‖B_exact‖_∞ ≤ 2^scale (norm + error)``.
    """

    B: NDArray[np.float64]
    norm: NDArray[np.float64]
    error: NDArray[np.float64]
    scale: NDArray[np.float64]

    def bound(self, power: int) -> NDArray[np.float64]:
        """``‖B_exact‖^(1/power)``, rounded up."""
        xp = array_module(self.norm)
        root = xp.exp2(self.scale / power) * (self.norm + self.error) ** (1.0 / power)
        return root * (1.0 + 8.0 * _U)


def _gamma(n: int) -> float:
    """``γ_n = n u / (1 − n u)``: the relative error of a sum of n nonnegative products."""
    return n * _U / (1.0 - n * _U)


def _chunk_heads(xp: Any, heads: int) -> int:
    """Heads per pass: :data:`_CHUNK_HEADS` on the host (cache), all of them on a device."""
    return _CHUNK_HEADS if xp is np else max(heads, 1)


def as_float64(A: Any) -> NDArray[np.float64]:
    """``A`` as float64 in its own library (a host array_like becomes a NumPy array; a CuPy
    array stays one: typed as NumPy's, whose API it shares)."""
    xp = array_module(A)
    return np.asarray(A, dtype=np.float64) if xp is np else A.astype(xp.float64, copy=False)


def _deflate_in_place(Y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Overwrite Y with ``fl(Y − 𝟙 cᵀ)``, c its column minima; return a bound on the new ∞-norm."""
    Y -= Y.min(axis=-2, keepdims=True)
    return Y.sum(axis=-1).max(axis=-1) * (1.0 + 2.0 * _gamma(Y.shape[-1]))


def _first_residual(
    A: NDArray[np.float64], heads: NDArray[np.intp], shift: NDArray[np.float64]
) -> tuple[NDArray[np.bool_], _Residual]:
    """``B̂_0 = fl(X̂ − 𝟙 cᵀ)``, ``X̂ = fl(Â − αI)``, against the exact ``Ā − αI − 𝟙 cᵀ``.

    For the heads ``heads`` of A (α = ``shift``, one per head listed): Ā is the row normalisation
    of Â, c the column minima of X̂. ``X = Ā − αI`` has ``X 𝟙 = (1 − α) 𝟙``, so Brauer bounds
    ``|λ − α|`` for its other eigenvalues λ of Ā. Returns which heads qualify (nonnegative, rows
    summing to 1 within :data:`~oversmooth.simulator.tolerances.STOCHASTIC_ATOL`; NaN and inf fail) and
    the residual of every listed head (meaningless where it does not qualify). The heads go
    :data:`_CHUNK_HEADS` at a time, each chunk's passes over it made while it is in cache.
    """
    xp = array_module(A)
    n = A.shape[-1]
    B = xp.empty((heads.size, n, n))
    sums = xp.empty((heads.size, n))
    lowest = xp.empty(heads.size)
    norm = xp.empty(heads.size)
    step = _chunk_heads(xp, heads.size)
    diagonal = xp.arange(n)
    with np.errstate(invalid="ignore", over="ignore"):  # heads that do not qualify
        for start in range(0, heads.size, step):
            part = slice(start, start + step)
            chunk = B[part]
            chunk[...] = A[heads[part]]
            sums[part] = chunk.sum(axis=-1)
            lowest[part] = chunk.min(axis=(-2, -1))
            if bool(shift[part].any()):  # X̂ = fl(Â − αI): only the diagonal changes
                chunk[:, diagonal, diagonal] -= shift[part, None]
            norm[part] = _deflate_in_place(chunk)
        normalisation = (xp.abs(sums - 1.0) + 2.0 * _gamma(n) * sums).max(axis=-1)
    qualifies = (lowest >= 0) & (xp.abs(sums - 1.0) <= STOCHASTIC_ATOL).all(axis=-1)
    error = normalisation + _U * (1.0 + xp.abs(shift)) + 2.0 * _U * norm
    return qualifies, _Residual(B, norm, error, xp.zeros_like(norm))


def _squared(state: _Residual) -> _Residual:
    """``B̂_s = fl(B̂² − 𝟙 cᵀ)``, rescaled by a power of 2, against the exact ``B² − 𝟙 cᵀ``.

    The power-of-2 rescaling of ``norm + error`` into [1/2, 1) is exact and keeps the entries in
    the normal range however small the residual gets. The heads go :data:`_CHUNK_HEADS` at a
    time through product, deflation, row sums and rescaling, so that the O(n²) passes find the
    product still in cache. (float32 products would take half the time, but their errors,
    relative to the undeflated square, cost about a tenth of DINOv2's certificates.)
    """
    xp = array_module(state.B)
    n = state.B.shape[-1]
    b, e = state.norm, state.error
    Y = xp.empty_like(state.B)
    norm = xp.empty_like(b)
    error = xp.empty_like(b)
    exponent = xp.empty(b.shape, dtype=np.intc)  # as frexp gives it
    step = _chunk_heads(xp, b.size)
    for start in range(0, b.size, step):
        part = slice(start, start + step)
        xp.matmul(state.B[part], state.B[part], out=Y[part])
        norm[part] = _deflate_in_place(Y[part])
        error[part] = _squared_error(b[part], e[part], norm[part], n)
        # norm + error = m 2^exponent, m in [0.5, 1): after scaling, no term can overflow.
        exponent[part] = xp.clip(
            xp.frexp(norm[part] + error[part])[1], -_RESCALE_LIMIT, _RESCALE_LIMIT
        )
        Y[part] *= xp.ldexp(1.0, -exponent[part])[:, None, None]
    down = xp.ldexp(1.0, -exponent)
    # Scaling is exact except where an entry lands among the subnormals: one step each.
    error = error * down + n * _TINY
    return _Residual(Y, norm * down, error, 2.0 * state.scale + exponent)


def _squared_error(
    b: NDArray[np.float64], e: NDArray[np.float64], norm: NDArray[np.float64], n: int
) -> NDArray[np.float64]:
    """The bound on ``‖fl(B̂² − 𝟙cᵀ) − (B² − 𝟙cᵀ)‖_∞`` from ``‖B̂‖ ≤ b``, ``‖B̂ − B‖ ≤ e``."""
    tiny = n * n * _TINY  # underflow: an absolute error of at most one subnormal step per term
    return _gamma(n) * b * b + 2.0 * b * e + e * e + 2.0 * _U * norm + tiny


def _select(state: _Residual, keep: NDArray[np.bool_]) -> _Residual:
    if keep.all():
        return state
    return _Residual(state.B[keep], state.norm[keep], state.error[keep], state.scale[keep])


def _start(
    A: NDArray[np.float64], candidates: NDArray[np.bool_], shift: NDArray[np.float64]
) -> tuple[NDArray[np.intp], _Residual]:
    """The candidate heads that qualify, and their first residual (shifted by ``shift[head]``).

    A head qualifies with a nonnegative A whose rows sum to 1 within
    :data:`~oversmooth.simulator.tolerances.STOCHASTIC_ATOL` (NaN and inf fail these tests).
    """
    xp = array_module(A)
    heads = xp.flatnonzero(candidates) if A.shape[-1] else xp.zeros(0, dtype=np.intp)
    qualifies, state = _first_residual(A, heads, shift[heads])
    return heads[qualifies], _select(state, qualifies)


def _stalled(
    rho: NDArray[np.float64], previous: NDArray[np.float64], radius: NDArray[np.float64]
) -> NDArray[np.bool_]:
    """The bound, extrapolated from its last step, stays above the target radius."""
    xp = array_module(rho)
    with np.errstate(divide="ignore"):
        step = xp.log(previous) - xp.log(rho)
        return xp.log(rho) - _STALL_STEPS * step >= xp.log(radius)


def radius_bounds(
    A: NDArray[np.float64],
    radius: NDArray[np.float64],
    shift: NDArray[np.float64],
    max_squarings: int,
    *,
    give_up: bool,
    triage: Callable[[NDArray[np.intp]], NDArray[np.bool_]] | None = None,
) -> NDArray[np.float64]:
    """Per head the best certified bound on ``|λ − shift|`` found, inf where none applies.

    Heads with a negative ``radius`` are skipped. A head stops squaring when its bound falls
    below ``radius``, when its residual vanishes, or (``give_up``) when the bound stalls above
    ``radius``. ``triage``, given the heads still squaring after :data:`HOPELESS_SQUARINGS`
    squarings, says which of them go on.
    """
    xp = array_module(A)
    bounds = xp.full(A.shape[0], np.inf)
    heads, state = _start(A, radius >= 0, shift)
    best = xp.full(heads.size, np.inf)
    for s in range(max_squarings + 1):
        if heads.size == 0:
            break
        if s:
            state = _squared(state)
        previous = best
        best = xp.minimum(best, state.bound(2**s))
        bounds[heads] = best
        keep = (best >= radius[heads]) & (state.norm > 0)
        if give_up and s >= _STALL_AFTER:
            keep &= ~_stalled(best, previous, radius[heads])
        if triage is not None and s == HOPELESS_SQUARINGS and bool(keep.any()):
            keep[keep] = triage(heads[keep])
        heads, state, best = heads[keep], _select(state, keep), best[keep]
    return bounds


def nonperron_radius(
    A: ArrayLike, *, squarings: int = MAX_SQUARINGS, shift: ArrayLike = 0.0
) -> NDArray[np.float64]:
    """A certified bound on ``|λ − shift|`` for every non-Perron eigenvalue λ of each A.

    Parameters
    ----------
    A : (heads, n, n) array_like
        Row-stochastic matrices (rows summing to 1 within STOCHASTIC_ATOL, entries >= 0); a
        device array (CuPy) is bounded on its device.
    squarings : int
        The bound is the least of ``τ(X^k)^{1/k}``, ``X = A − shift·I``,
        ``k = 1, 2, 4, …, 2^squarings``, with every rounding error counted (module docstring).
    shift : float or (heads,) array_like
        The centre α of the disk; real, ``0 ≤ α < 1``.

    Returns
    -------
    (heads,) float ndarray
        The bound for the exact row normalisation of each A; inf where A is not stochastic or
        nonnegative. With ``shift=0`` and below 1 it also proves the Perron root simple. In A's
        library (on A's device).
    """
    A = as_float64(A)
    xp = array_module(A)
    centres: NDArray[np.float64] = xp.broadcast_to(xp.asarray(shift, dtype=np.float64), A.shape[:1])
    return radius_bounds(A, xp.zeros(A.shape[0]), centres, squarings, give_up=False)


def nonperron_estimate(A: NDArray[np.float64], shift: NDArray[np.float64]) -> NDArray[np.float64]:
    """An estimate, not a bound, of the largest ``|λ − α|`` over the non-Perron eigenvalues λ of A.

    Power iteration on the quotient by the Perron vector 𝟙 (``x ← (A − αI)x``, then its mean
    removed: since ``(A − αI)𝟙 = (1 − α)𝟙`` the iterates' classes modulo 𝟙 only see the other
    eigenvalues), :data:`_ESTIMATE_ITERATIONS` steps from a fixed start, the growth averaged over
    the last :data:`_ESTIMATE_WINDOW`. It only orders the certificates' work (a head whose
    estimate exceeds its target radius skips the squarings that could not succeed); every answer
    is still certified or dense. O(n²) per step against the n³ of a squaring.

    Parameters
    ----------
    A : (heads, n, n) float ndarray
    shift : (heads,) float ndarray
        α per head.

    Returns
    -------
    (heads,) float ndarray
    """
    xp = array_module(A)
    estimate = xp.empty(A.shape[0])
    step = _chunk_heads(xp, A.shape[0])
    for first in range(0, A.shape[0], step):  # each chunk's iterations find its heads in cache
        part = slice(first, first + step)
        estimate[part] = _estimate_chunk(A[part], shift[part])
    return estimate


def _estimate_chunk(A: NDArray[np.float64], shift: NDArray[np.float64]) -> NDArray[np.float64]:
    """:func:`nonperron_estimate` of a few heads, all iterations at once."""
    xp = array_module(A)
    n = A.shape[-1]
    alpha = shift[:, None, None]
    start = xp.asarray(np.random.default_rng(n).standard_normal((n, 1)))
    x = xp.broadcast_to(start, (A.shape[0], n, 1))
    logs = xp.zeros((_ESTIMATE_ITERATIONS + 1, A.shape[0]))
    for step in range(1, _ESTIMATE_ITERATIONS + 1):
        y = A @ x - alpha * x
        y -= y.mean(axis=1, keepdims=True)
        norm = xp.linalg.norm(y, axis=(1, 2))
        exhausted = norm == 0  # the estimate then tends to 0
        logs[step] = logs[step - 1] + xp.log(xp.where(exhausted, _TINY, norm))
        x = y / xp.where(exhausted, 1.0, norm)[:, None, None]
    return xp.exp((logs[-1] - logs[-1 - _ESTIMATE_WINDOW]) / _ESTIMATE_WINDOW)
