"""The dominating eigenvalue of ``I + H ⊗ A`` for many heads, certified "perron" without eig(A) when possible.

:func:`simulator.theory.dominance_kinds` decides the kind of the dominating eigenvalue (Definition 4,
docs/theory.md §2.5) from the full spectrum of the attention matrix A: an n×n non-symmetric
eigenproblem per head (n = 257 for a ViT), most of an audit's host time. For a row-stochastic A the
Perron root is exactly 1, so the Perron row of ``μ_ij = 1 + λ^H_j λ^A_i`` is ``1 + λ^H_j`` and needs
no eigensolver; what is left is to show that no other eigenvalue of A comes close. This module bounds
the modulus of every non-Perron eigenvalue from above with a few matrix products and returns kind
perron when the bound already rules out every other row. The other heads take the dense path, which
is the audit's original computation.

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

Rounding
--------
The certificate is for the exact row normalisation ``Ā = diag(Â𝟙)⁻¹ Â`` of the float matrix Â, and
counts every rounding error: ``‖Â − Ā‖_∞ = max_i |r_i − 1|``; a float product of nonnegative
matrices has entrywise relative error ``γ_n = n u / (1 − n u)`` (any summation order), so
``‖fl(X̂X̂) − X²‖_∞ ≤ γ_n ‖X̂‖² + 2 ‖X̂‖ e + e²`` when ``‖X̂ − X‖_∞ ≤ e``; each subtraction and row sum
adds ``2u`` and ``γ_n`` relative. The bound is computed from these, never from the float value
alone. The dense path works with eigenvalues of Â computed to a backward error of a few u;
:data:`~simulator.tolerances.PERRON_MARGIN` (relative) keeps a certified case away from the tie
threshold by far more than that, so the dense path finds the same kind, and μ, λ^A, λ^H agree to
round-off.

Functions
---------
perron_targets     -- per head, the radius that certifies perron kind and the Perron-row mode
nonperron_radius   -- a certified bound on the modulus of every non-Perron eigenvalue of A
perron_certified   -- which heads of a stack of attention matrices are certified perron
dominating_modes   -- kind, μ, λ^A, λ^H per head: certified where possible, dense otherwise
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from simulator.theory import dominance_kinds, kron_eigenvalues
from simulator.tolerances import EPS, PERRON_MARGIN, STOCHASTIC_ATOL, TIE_RTOL

__all__ = [
    "MAX_SQUARINGS",
    "DominatingModes",
    "PerronTargets",
    "dominating_modes",
    "nonperron_radius",
    "perron_certified",
    "perron_targets",
]

#: At most this many squarings (A^256) before a head goes to the dense path.
MAX_SQUARINGS = 8
#: Squarings always tried before the stall test may give up on a head.
_STALL_AFTER = 2
#: Give up when the bound, extrapolated this many of its last steps (in log), stays above target.
_STALL_STEPS = 4.0
#: Residuals below this are not squared again (their products would leave the normal range).
_SMALLEST_RESIDUAL = 1e-100
#: Two top |1 + λ^H| of different eigenvalues closer than this (relative) make j* ambiguous: the
#: dense path, whose Perron root is 1 only to round-off, could pick either.
_TOP_AMBIGUITY_RTOL = 1e-10
_U = EPS / 2


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
    """

    radius: NDArray[np.float64]
    best: NDArray[np.intp]
    eig_H: NDArray[np.complex128]


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
    needed = top * (1.0 - tie_rtol) * (1.0 - PERRON_MARGIN) - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        radius = np.where((largest > 0) & (needed > 0), needed / largest, 0.0)
    radius = np.where(_ambiguous_top(lam_H, moduli, best, top), 0.0, radius)
    return PerronTargets(radius, best, lam_H)


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
    """``B̂ ≥ 0`` (heads, n, n) with ``‖B̂‖_∞ ≤ norm`` and ``‖B̂ − B‖_∞ ≤ error`` for an exact B."""

    B: NDArray[np.float64]
    norm: NDArray[np.float64]
    error: NDArray[np.float64]


def _gamma(n: int) -> float:
    return n * _U / (1.0 - n * _U)


def _deflate(
    Y: NDArray[np.float64], gamma: float, minima: NDArray[np.float64] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``fl(Y − 𝟙 cᵀ)`` with c the column minima (given or computed), and a bound on its ∞-norm."""
    c = Y.min(axis=-2) if minima is None else minima
    B = Y - c[..., None, :]
    return B, B.sum(axis=-1).max(axis=-1) * (1.0 + 2.0 * gamma)


def _first_residual(
    A: NDArray[np.float64], sums: NDArray[np.float64], minima: NDArray[np.float64]
) -> _Residual:
    """``B̂_0 = fl(Â − 𝟙 cᵀ)`` against the exact ``Ā − 𝟙 cᵀ``, Ā the row normalisation of Â.

    ``sums`` (heads, n) are the computed row sums of Â, ``minima`` (heads, n) its column minima.
    """
    gamma = _gamma(A.shape[-1])
    normalisation = (np.abs(sums - 1.0) + 2.0 * gamma * sums).max(axis=-1)
    B, norm = _deflate(A, gamma, minima)
    return _Residual(B, norm, normalisation + 2.0 * _U * norm)


def _squared(state: _Residual) -> _Residual:
    """``B̂_s = fl(B̂² − 𝟙 cᵀ)`` against the exact ``B² − 𝟙 cᵀ`` (B the exact previous residual)."""
    gamma = _gamma(state.B.shape[-1])
    B, norm = _deflate(state.B @ state.B, gamma)
    b, e = state.norm, state.error
    tiny = state.B.shape[-1] ** 2 * float(np.finfo(np.float64).smallest_subnormal)
    error = gamma * b * b + 2.0 * b * e + e * e + 2.0 * _U * norm + tiny
    return _Residual(B, norm, error)


def _select(state: _Residual, keep: NDArray[np.bool_]) -> _Residual:
    return _Residual(state.B[keep], state.norm[keep], state.error[keep])


def _start(
    A: NDArray[np.float64], candidates: NDArray[np.bool_]
) -> tuple[NDArray[np.intp], _Residual]:
    """The candidate heads that qualify, and their first residual.

    A head qualifies with a nonnegative A whose rows sum to 1 within
    :data:`~simulator.tolerances.STOCHASTIC_ATOL` (NaN and inf fail these tests).
    """
    heads = np.flatnonzero(candidates) if A.shape[-1] else np.zeros(0, dtype=np.intp)
    A = A[heads]
    minima = A.min(axis=-2)
    sums = A.sum(axis=-1)
    ok = (minima.min(axis=-1) >= 0) & (np.abs(sums - 1.0) <= STOCHASTIC_ATOL).all(axis=-1)
    if not ok.all():
        heads, A, minima, sums = heads[ok], A[ok], minima[ok], sums[ok]
    return heads, _first_residual(A, sums, minima)


def _stalled(
    rho: NDArray[np.float64], previous: NDArray[np.float64], radius: NDArray[np.float64]
) -> NDArray[np.bool_]:
    """The bound, extrapolated from its last step, stays above the target radius."""
    with np.errstate(divide="ignore"):
        step = np.log(previous) - np.log(rho)
        return np.log(rho) - _STALL_STEPS * step >= np.log(radius)


def _radius_bounds(
    A: NDArray[np.float64], radius: NDArray[np.float64], max_squarings: int, *, give_up: bool
) -> NDArray[np.float64]:
    """Per head the best certified bound found, inf where none applies.

    A head stops squaring when its bound falls below ``radius``, when its residual leaves the
    normal range, or (``give_up``) when the bound stalls above ``radius``.
    """
    bounds = np.full(A.shape[0], np.inf)
    heads, state = _start(A, radius >= 0)
    best = np.full(heads.size, np.inf)
    for s in range(max_squarings + 1):
        if heads.size == 0:
            break
        if s:
            state = _squared(state)
        previous = best
        best = np.minimum(best, (state.norm + state.error) ** (0.5**s) * (1.0 + 4.0 * _U))
        bounds[heads] = best
        keep = (best >= radius[heads]) & (state.norm > _SMALLEST_RESIDUAL)
        if give_up and s >= _STALL_AFTER:
            keep &= ~_stalled(best, previous, radius[heads])
        heads, state, best = heads[keep], _select(state, keep), best[keep]
    return bounds


def nonperron_radius(A: ArrayLike, *, squarings: int = MAX_SQUARINGS) -> NDArray[np.float64]:
    """A certified upper bound on ``|λ|`` for every non-Perron eigenvalue λ of each A.

    Parameters
    ----------
    A : (heads, n, n) array_like
        Row-stochastic matrices (rows summing to 1 within STOCHASTIC_ATOL, entries >= 0).
    squarings : int
        The bound is the least of ``τ(A^k)^{1/k}``, ``k = 1, 2, 4, …, 2^squarings``, with every
        rounding error counted (module docstring).

    Returns
    -------
    (heads,) float ndarray
        The bound for the exact row normalisation of each A; inf where A is not stochastic or
        nonnegative. Below 1 it also proves the Perron root simple.
    """
    A = np.asarray(A, dtype=np.float64)
    return _radius_bounds(A, np.zeros(A.shape[0]), squarings, give_up=False)


def perron_certified(
    A: ArrayLike, targets: PerronTargets, *, max_squarings: int = MAX_SQUARINGS
) -> NDArray[np.bool_]:
    """Which heads are certified perron kind by a bound on their non-Perron eigenvalues.

    Parameters
    ----------
    A : (heads, n, n) array_like
        Row-stochastic attention matrices (rows summing to 1 up to round-off).
    targets : PerronTargets
        From :func:`perron_targets` of the heads' H spectra, shape ``(heads,)``.
    max_squarings : int
        Try ``A, A², A⁴, …, A^(2^max_squarings)``; a head whose bound stalls above its target stops
        earlier.

    Returns
    -------
    (heads,) bool ndarray
        True where ``nonperron_radius < targets.radius``: the kind is perron for certain (module
        docstring). False means undecided, not non-perron.
    """
    A = np.asarray(A, dtype=np.float64)
    radius = np.where(targets.radius > 0, targets.radius, -1.0)  # -1: not even a candidate
    return _radius_bounds(A, radius, max_squarings, give_up=True) < targets.radius


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
) -> DominatingModes:
    """Kind and dominating eigenvalue of ``I + H_h ⊗ A_h`` for every head h.

    Parameters
    ----------
    A : (heads, n, n) array_like
        Row-stochastic attention matrices.
    eig_H : (heads, d) array_like
        Spectra of the heads' H.
    tie_rtol : float
    certify : bool
        Certify perron kind without eig(A) where the bound allows (:func:`perron_certified`);
        False computes every spectrum (the dense path).
    targets : PerronTargets, optional
        ``perron_targets(eig_H, tie_rtol=tie_rtol)``, when the caller reuses it across inputs.

    Returns
    -------
    DominatingModes
        The same kinds as the dense path; μ, λ^A and λ^H equal to round-off.
    """
    A = np.asarray(A, dtype=np.float64)
    lam_H = np.asarray(eig_H, dtype=np.complex128)
    n_heads = A.shape[0]
    kinds = np.zeros(n_heads, dtype=np.intp)
    mu = np.empty(n_heads, dtype=np.complex128)
    lam_A = np.ones(n_heads, dtype=np.complex128)
    lam_H_mode = np.empty(n_heads, dtype=np.complex128)
    certified = np.zeros(n_heads, dtype=bool)
    if certify:
        if targets is None:
            targets = perron_targets(lam_H, tie_rtol=tie_rtol)
        certified = perron_certified(A, targets)
        heads = np.flatnonzero(certified)
        lam_H_mode[heads] = lam_H[heads, targets.best[heads]]
        mu[heads] = 1.0 + lam_H_mode[heads]
    dense = ~certified
    if dense.any():
        kinds[dense], mu[dense], lam_A[dense], lam_H_mode[dense] = _dense_modes(
            A[dense], lam_H[dense], tie_rtol
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
