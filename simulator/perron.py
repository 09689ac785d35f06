"""The dominating eigenvalue of ``I + H ⊗ A`` for many heads, certified "perron" without eig(A) when possible.

:func:`simulator.theory.dominance_kinds` decides the kind of the dominating eigenvalue (Definition 4,
docs/theory.md §2.5) from the full spectrum of the attention matrix A: an n×n non-symmetric
eigenproblem per head (n = 257 for a ViT), most of an audit's host time. For a row-stochastic A the
Perron root is exactly 1, so the Perron row of ``μ_ij = 1 + λ^H_j λ^A_i`` is ``1 + λ^H_j`` and needs
no eigensolver; what is left is to show that no other eigenvalue of A comes close. This module bounds
the modulus of every non-Perron eigenvalue from above with a few matrix products and returns kind
perron when the bound already rules out every other row. The other heads take the dense path, which
is the audit's original computation, and so do matrices of order below :data:`CERTIFY_MIN_ORDER`,
whose spectra cost less than the certificate's bookkeeping.

Certificate
-----------
Brauer's theorem: if ``A 𝟙 = 𝟙``, then for any vector c the eigenvalues of ``A − 𝟙 cᵀ`` are
``1 − cᵀ𝟙`` and the eigenvalues of A with one copy of 1 removed. So every non-Perron eigenvalue λ
has ``|λ| ≤ ‖A − 𝟙 cᵀ‖_∞``; with c the column minima of a nonnegative A this is Doeblin's
ergodicity coefficient ``τ(A) = 1 − Σ_k min_i a_ik``. ``A^k`` is stochastic too, with non-Perron
eigenvalues ``λ^k``, so ``|λ| ≤ τ(A^k)^{1/k}``, which tends to ``max |λ|`` as k grows. The powers
``k = 2^s`` come from squaring the deflated matrix itself: if ``B = A^{k/2} − 𝟙 dᵀ`` then
``B² = A^k − 𝟙 d'ᵀ`` (because ``A^{k/2} 𝟙 = 𝟙``), and Brauer applies again to
``B_s = B² − 𝟙 c_sᵀ`` with c_s the column minima of B². Working with the small residual B_s keeps
relative accuracy where ``1 − Σ min`` would cancel. When ``ρ < 1`` the root 1 is also simple.

Given ``|λ| ≤ ρ`` for every non-Perron λ, ``|1 + λ^H_j λ| ≤ 1 + |λ^H_j| ρ`` (the maximum over the
disk). If ``max_j (1 + |λ^H_j| ρ) < top (1 − tie_rtol)`` with ``top = max_j |1 + λ^H_j|``, every
mode within the tie tolerance of the maximum lies in the Perron row: kind perron,
``μ = 1 + λ^H_{j*}`` with ``j* = argmax_j |1 + λ^H_j|``, ``λ^A = 1``. The radius this needs is
``(top (1 − tie_rtol)(1 − PERRON_MARGIN) − 1) / max_j |λ^H_j|``.

A disk about 0 cannot separate a positive λ_2 close to 1 from a negative λ^H (nearly decomposable
attention in early layers). The same bound applied to ``X = A − αI`` (``X 𝟙 = (1 − α) 𝟙``; its
other eigenvalues are ``λ − α``; ``X − 𝟙 cᵀ ≥ 0`` for c its column minima, so everything below
holds unchanged) gives a second disk ``|λ − α| ≤ R``; with ``α = ρ/2`` it hugs a spectrum in the
right half-plane. Each j then needs only the smaller of the two disks' maxima,
``min(1 + |λ^H_j| ρ, |1 + λ^H_j α| + |λ^H_j| R)``, below the threshold. On the default
DINOv2 audit the first disk decides 78 % of the cases and the second most of the rest (93 % in
all); the others, and every non-perron case, take the dense path.

Which disk a head tries is decided by an estimate, not a bound: a few power iterations
(O(n²) each) estimate its largest non-Perron ``|λ|``. Every head squares :data:`_HOPELESS_SQUARINGS`
times first; one still undecided then is estimated, and if its estimate exceeds the first disk's
target (``|λ_2|`` itself is too large: no power of A can certify it) it stops squaring, with the
tighter ρ it has, and goes on to the second disk, centred on half the estimate; one whose estimated
largest ``|λ − α|`` exceeds the second disk's target goes to the dense path at once. A wrong
estimate costs time, never correctness. On DINOv2 this schedule takes 906 squarings of a 257×257
head instead of 1191, for 404 instead of 407 certified heads of 432; estimating only the heads
that 3 squarings leave undecided (201 estimates, both disks, instead of 348: 30 iterations over a
head cost about two squarings, being bound by memory) cut the step's CPU time by 10–15 %.

Rounding
--------
The certificate is for the exact row normalisation ``Ā = diag(Â𝟙)⁻¹ Â`` of the float matrix Â, and
counts every rounding error: ``‖Â − Ā‖_∞ = max_i |r_i − 1|``; a float product of nonnegative
matrices has entrywise relative error ``γ_n = n u / (1 − n u)`` (any summation order), so
``‖fl(X̂X̂) − X²‖_∞ ≤ γ_n ‖X̂‖² + 2 ‖X̂‖ e + e²`` when ``‖X̂ − X‖_∞ ≤ e``; each subtraction and row sum
adds ``2u`` and ``γ_n`` relative; each residual is rescaled by an exact power of 2, with
underflow counted as one subnormal step per term. The bound is computed from these, never from
the float value alone. The dense path works with eigenvalues of Â computed to a backward error
of a few u; :data:`~simulator.tolerances.PERRON_MARGIN` (relative) keeps a certified case away
from the tie threshold by far more than that, so the dense path finds the same kind, and μ, λ^A,
λ^H agree to round-off.

Functions
---------
perron_targets     -- per head, the radius that certifies perron kind and the Perron-row mode
nonperron_radius   -- a certified bound on the modulus of every non-Perron eigenvalue of A
perron_certified   -- which heads of a stack of attention matrices are certified perron
dominating_modes   -- kind, μ, λ^A, λ^H per head: certified where possible, dense otherwise
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from simulator.backend import array_module, to_numpy
from simulator.theory import dominance_kinds, kron_eigenvalues
from simulator.tolerances import EPS, PERRON_MARGIN, STOCHASTIC_ATOL, TIE_RTOL

__all__ = [
    "CERTIFY_MIN_ORDER",
    "MAX_SQUARINGS",
    "DominatingModes",
    "PerronTargets",
    "dominating_modes",
    "nonperron_radius",
    "perron_certified",
    "perron_targets",
]

#: Attention matrices of smaller order go to the dense path at once: there the full spectra cost
#: less than the certificate's bookkeeping (12 heads on one core: n = 16, 0.8 ms dense against
#: 2.1 ms certified; n = 32, 2.9 against 2.8 ms; n = 64, 18 against 5 ms). Short sentences.
CERTIFY_MIN_ORDER = 33
#: At most this many squarings (A^256) before a head goes to the dense path.
MAX_SQUARINGS = 8
#: Squarings always tried before the stall test may give up on a head.
_STALL_AFTER = 5
#: Give up when the bound, extrapolated this many of its last steps (in log), stays above target.
_STALL_STEPS = 4.0
#: Power iterations of the estimate that decides which disk a head tries
#: (:func:`_nonperron_estimate`), and the last ones over which its growth is averaged.
_ESTIMATE_ITERATIONS = 30
_ESTIMATE_WINDOW = 8
#: Squarings of the first disk before a head is estimated; one whose estimate says that disk
#: cannot certify it stops there, with a tighter ρ for the second disk's target (1, 2, 4 or 5
#: squarings here cost DINOv2's step as much or more).
_HOPELESS_SQUARINGS = 3
#: Two top |1 + λ^H| of different eigenvalues closer than this (relative) make j* ambiguous: the
#: dense path, whose Perron root is 1 only to round-off, could pick either.
_TOP_AMBIGUITY_RTOL = 1e-10
_U = EPS / 2
_TINY = float(np.finfo(np.float64).smallest_subnormal)
#: Heads taken together through a squaring's product and O(n²) passes (a 257×257 float64 head is
#: 0.5 MiB: a chunk is still in cache for the passes after its product; 12 % less CPU on DINOv2).
#: On a device every head of a stack goes at once: there each pass is one kernel launch.
_CHUNK_HEADS = 4
#: Rescale by at most 2^±this per squaring (float64 holds 2^±1022 in its normal range).
_RESCALE_LIMIT = 900


@dataclass(frozen=True)
class PerronTargets:
    """Per head: the certifying radius and the Perron-row mode (input-independent).

    Attributes
    ----------
    radius : (...,) float ndarray
        A bound ρ on every non-Perron ``|λ^A|`` below this certifies perron kind; 0 where no
        bound can (``top ≤ 1``, ``H = 0``, an ambiguous top).
    best : (...,) int ndarray
        ``j* = argmax_j |1 + λ^H_j|`` (the first of exact conjugate or equal values).
    eig_H : (..., d) complex ndarray
    threshold : (...,) float ndarray
        ``top (1 − tie_rtol)(1 − PERRON_MARGIN)``: every other row's |μ| must stay below it.
    """

    radius: NDArray[np.float64]
    best: NDArray[np.intp]
    eig_H: NDArray[np.complex128]
    threshold: NDArray[np.float64]


def perron_targets(eig_H: ArrayLike, *, tie_rtol: float = TIE_RTOL) -> PerronTargets:
    """The radius below which a bound on non-Perron eigenvalues of A certifies perron kind.

    Parameters
    ----------
    eig_H : (..., d) array_like
        Spectra of H, one per head.
    tie_rtol : float
        The tie tolerance of :func:`~simulator.theory.dominance_kinds`.

    Returns
    -------
    PerronTargets
        ``radius = (top (1 − tie_rtol)(1 − PERRON_MARGIN) − 1) / max_j |λ^H_j|`` with
        ``top = max_j |1 + λ^H_j|``: then ``1 + |λ^H_j| ρ < top (1 − tie_rtol)`` for every j.
    """
    lam_H = np.asarray(eig_H, dtype=np.complex128)
    moduli = np.abs(1.0 + lam_H)
    best = np.argmax(moduli, axis=-1)
    top = np.take_along_axis(moduli, best[..., None], axis=-1)[..., 0]
    largest = np.abs(lam_H).max(axis=-1)
    threshold = top * (1.0 - tie_rtol) * (1.0 - PERRON_MARGIN)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        radius = np.where((largest > 0) & (threshold > 1.0), (threshold - 1.0) / largest, 0.0)
    radius = np.where(_ambiguous_top(lam_H, moduli, best, top), 0.0, radius)
    return PerronTargets(radius, best, lam_H, threshold)


def _targets_in(xp: Any, targets: PerronTargets) -> PerronTargets:
    """``targets`` as arrays of ``xp`` (on the device of the attention matrices they meet)."""
    if xp is np:
        return targets
    return PerronTargets(
        xp.asarray(targets.radius),
        xp.asarray(targets.best),
        xp.asarray(targets.eig_H),
        xp.asarray(targets.threshold),
    )


def _ambiguous_top(
    lam_H: NDArray[np.complex128],
    moduli: NDArray[np.float64],
    best: NDArray[np.intp],
    top: NDArray[np.float64],
) -> NDArray[np.bool_]:
    """Another eigenvalue (not j*'s value or its conjugate) within a hair of the top modulus."""
    star = np.take_along_axis(lam_H, best[..., None], axis=-1)
    same = (lam_H == star) | (lam_H == np.conj(star))
    near = moduli >= top[..., None] * (1.0 - _TOP_AMBIGUITY_RTOL)
    return np.any(near & ~same, axis=-1)


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


def _as_float64(A: Any) -> NDArray[np.float64]:
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
    summing to 1 within :data:`~simulator.tolerances.STOCHASTIC_ATOL`; NaN and inf fail) and
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
    :data:`~simulator.tolerances.STOCHASTIC_ATOL` (NaN and inf fail these tests).
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


def _radius_bounds(
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
    ``radius``. ``triage``, given the heads still squaring after :data:`_HOPELESS_SQUARINGS`
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
        if triage is not None and s == _HOPELESS_SQUARINGS and bool(keep.any()):
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
    A = _as_float64(A)
    xp = array_module(A)
    centres: NDArray[np.float64] = xp.broadcast_to(xp.asarray(shift, dtype=np.float64), A.shape[:1])
    return _radius_bounds(A, xp.zeros(A.shape[0]), centres, squarings, give_up=False)


def _shifted_target(
    targets: PerronTargets,
    heads: NDArray[np.intp],
    shift: NDArray[np.float64],
    rho: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The radius R around ``shift`` that certifies the heads, given the disk ``|λ| ≤ rho``.

    Every j whose disk bound ``1 + |λ^H_j| ρ`` fails needs ``|1 + λ^H_j α| + |λ^H_j| R`` below the
    threshold; -1 where some j cannot (no R would do).
    """
    xp = array_module(heads)
    lam = targets.eig_H[heads]
    size = xp.abs(lam)
    threshold = targets.threshold[heads][:, None]
    failing = 1.0 + size * rho[:, None] >= threshold
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        room = (threshold - xp.abs(1.0 + lam * shift[:, None])) / size
    room = xp.where(failing, room, np.inf)
    radius = room.min(axis=-1)
    return xp.where(xp.isfinite(radius) & (radius > 0), radius, -1.0)


def perron_certified(
    A: ArrayLike, targets: PerronTargets, *, max_squarings: int = MAX_SQUARINGS
) -> NDArray[np.bool_]:
    """Which heads are certified perron kind by bounds on their non-Perron eigenvalues.

    Two regions hold every non-Perron eigenvalue λ: the disk ``|λ| ≤ ρ`` (``nonperron_radius``)
    and, for heads that disk does not decide, the disk ``|λ − α| ≤ R`` with α half the estimated
    largest non-Perron ``|λ|`` (the same bound for ``A − αI``; the module docstring says which
    heads try which disk). Per j, ``|1 + λ^H_j λ|`` is at most the smaller of
    ``1 + |λ^H_j| ρ`` and ``|1 + λ^H_j α| + |λ^H_j| R``; a head is certified when that stays below
    ``targets.threshold`` for every j. The second disk decides most heads whose A is nearly
    decomposable (λ_2 close to 1) but whose spectrum stays in the right half-plane, against a
    negative λ^H.

    Parameters
    ----------
    A : (heads, n, n) array_like
        Row-stochastic attention matrices (rows summing to 1 up to round-off). A device array
        (CuPy) is certified on its device, in float64: the same steps, the same bounds.
    targets : PerronTargets
        From :func:`perron_targets` of the heads' H spectra, shape ``(heads,)``.
    max_squarings : int
        Try ``A, A², A⁴, …, A^(2^max_squarings)`` for each disk; a head whose bound stalls above
        its target stops earlier.

    Returns
    -------
    (heads,) bool ndarray
        True where the kind is perron for certain (module docstring); False means undecided, not
        non-perron. In A's library.
    """
    A = _as_float64(A)
    xp = array_module(A)
    targets = _targets_in(xp, targets)
    radius = targets.radius
    candidates = xp.where(radius > 0, radius, -1.0)  # -1: never a candidate
    no_shift = xp.zeros(A.shape[0])
    estimate = xp.full(A.shape[0], np.inf)

    def hopeful(heads: NDArray[np.intp]) -> NDArray[np.bool_]:
        estimate[heads] = _nonperron_estimate(A[heads], no_shift[heads])
        return estimate[heads] < radius[heads]

    rho = _radius_bounds(A, candidates, no_shift, max_squarings, give_up=True, triage=hopeful)
    certified = rho < radius
    heads = xp.flatnonzero((candidates > 0) & xp.isfinite(rho) & ~certified)
    unestimated = heads[xp.isinf(estimate[heads])]  # stopped before the triage squaring
    if unestimated.size:
        estimate[unestimated] = _nonperron_estimate(A[unestimated], no_shift[unestimated])
    if heads.size:
        certified |= _shifted_disk_certified(A, targets, heads, rho, estimate, max_squarings)
    return certified


def _shifted_disk_certified(
    A: NDArray[np.float64],
    targets: PerronTargets,
    heads: NDArray[np.intp],
    rho: NDArray[np.float64],
    estimate: NDArray[np.float64],
    max_squarings: int,
) -> NDArray[np.bool_]:
    """The second disk ``|λ − α| ≤ R``, ``α = min(estimate, 1)/2``, for ``heads`` (indices).

    ``rho`` is the first disk's certified bound, ``estimate`` the estimated largest non-Perron
    ``|λ|`` (:func:`_nonperron_estimate`). A head whose estimated largest ``|λ − α|`` already
    exceeds its target R skips the squarings (it goes to the dense path).
    """
    xp = array_module(A)
    shift = xp.zeros(A.shape[0])
    shift[heads] = xp.minimum(estimate[heads], 1.0) / 2.0
    radius = xp.full(A.shape[0], -1.0)
    radius[heads] = _shifted_target(targets, heads, shift[heads], rho[heads])
    hopeful = heads[radius[heads] > 0]
    if hopeful.size:
        hopeless = _nonperron_estimate(A[hopeful], shift[hopeful]) >= radius[hopeful]
        radius[hopeful[hopeless]] = -1.0
    return _radius_bounds(A, radius, shift, max_squarings, give_up=True) < radius


def _nonperron_estimate(A: NDArray[np.float64], shift: NDArray[np.float64]) -> NDArray[np.float64]:
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


@dataclass(frozen=True)
class DominatingModes:
    """Per head: the kind code (into :data:`~simulator.theory.KINDS`) and a dominating mode.

    Attributes
    ----------
    kinds : (heads,) int ndarray
    mu, eig_A, eig_H : (heads,) complex ndarray
        ``μ = 1 + λ^H λ^A`` of largest modulus (the first in ``(i, j)`` order), its λ^A and λ^H.
    certified : (heads,) bool ndarray
        Decided by the bound (λ^A is exactly 1), not by the dense spectrum.
    """

    kinds: NDArray[np.intp]
    mu: NDArray[np.complex128]
    eig_A: NDArray[np.complex128]
    eig_H: NDArray[np.complex128]
    certified: NDArray[np.bool_]


def dominating_modes(
    A: ArrayLike,
    eig_H: ArrayLike,
    *,
    tie_rtol: float = TIE_RTOL,
    certify: bool = True,
    targets: PerronTargets | None = None,
    min_order: int = CERTIFY_MIN_ORDER,
    to_host: Callable[[Any], NDArray[Any]] = to_numpy,
) -> DominatingModes:
    """Kind and dominating eigenvalue of ``I + H_h ⊗ A_h`` for every head h.

    Parameters
    ----------
    A : (heads, n, n) array_like
        Row-stochastic attention matrices: NumPy, or a device library's (CuPy) — then the
        certificate runs on the device and only the matrices it leaves undecided come to the
        host (through ``to_host``) for their dense spectra.
    eig_H : (heads, d) array_like
        Spectra of the heads' H.
    tie_rtol : float
    certify : bool
        Certify perron kind without eig(A) where the bound allows (:func:`perron_certified`);
        False computes every spectrum (the dense path).
    targets : PerronTargets, optional
        ``perron_targets(eig_H, tie_rtol=tie_rtol)``, when the caller reuses it across inputs.
    min_order : int
        Certify only matrices of at least this order (n); smaller ones are cheaper dense
        (:data:`CERTIFY_MIN_ORDER`).
    to_host : callable
        Brings the undecided heads' matrices ``A[dense]`` to the host as NumPy (e.g. a
        :class:`simulator.backend.HostCopies`, which counts the bytes); the only large array
        that leaves A's device.

    Returns
    -------
    DominatingModes
        The same kinds as the dense path; μ, λ^A and λ^H equal to round-off. NumPy arrays.
    """
    A = _as_float64(A)
    xp = array_module(A)
    lam_H = np.asarray(eig_H, dtype=np.complex128)
    n_heads = A.shape[0]
    kinds = np.zeros(n_heads, dtype=np.intp)
    mu = np.empty(n_heads, dtype=np.complex128)
    lam_A = np.ones(n_heads, dtype=np.complex128)
    lam_H_mode = np.empty(n_heads, dtype=np.complex128)
    certified = np.zeros(n_heads, dtype=bool)
    if certify and A.shape[-1] >= min_order:
        if targets is None:
            targets = perron_targets(lam_H, tie_rtol=tie_rtol)
        certified = to_numpy(perron_certified(A, targets))
        heads = np.flatnonzero(certified)
        lam_H_mode[heads] = lam_H[heads, targets.best[heads]]
        mu[heads] = 1.0 + lam_H_mode[heads]
    dense = ~certified
    if dense.any():
        undecided = A if dense.all() else A[dense if xp is np else xp.asarray(dense)]
        kinds[dense], mu[dense], lam_A[dense], lam_H_mode[dense] = _dense_modes(
            to_host(undecided), lam_H[dense], tie_rtol
        )
    return DominatingModes(kinds, mu, lam_A, lam_H_mode, certified)


def _dense_modes(
    A: NDArray[np.float64], lam_H: NDArray[np.complex128], tie_rtol: float
) -> tuple[
    NDArray[np.intp], NDArray[np.complex128], NDArray[np.complex128], NDArray[np.complex128]
]:
    """The full spectra of A (one batched eigensolve), then Definition 4 on the μ table."""
    eig_A = np.linalg.eigvals(A).astype(np.complex128)
    kinds = dominance_kinds(eig_A, lam_H, tie_rtol=tie_rtol)
    mu = kron_eigenvalues(eig_A, lam_H)
    flat = np.argmax(np.abs(mu).reshape(len(mu), -1), axis=-1)
    i, j = np.unravel_index(flat, mu.shape[1:])
    heads = np.arange(len(mu))
    return kinds, mu[heads, i, j], eig_A[heads, i], lam_H[heads, j]
