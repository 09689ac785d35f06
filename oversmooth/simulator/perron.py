"""The dominating eigenvalue of ``I + H ⊗ A`` for many heads, certified "perron" without eig(A) when possible.

:func:`oversmooth.simulator.theory.dominance_kinds` decides the kind of the dominating eigenvalue (Definition 4,
docs/theory.md §2.5) from the full spectrum of the attention matrix A: an n×n non-symmetric
eigenproblem per head (n = 257 for a ViT), most of an audit's host time. For a row-stochastic A the
Perron root is exactly 1, so the Perron row of ``μ_ij = 1 + λ^H_j λ^A_i`` is ``1 + λ^H_j`` and needs
no eigensolver; what is left is to show that no other eigenvalue of A comes close. This module bounds
the modulus of every non-Perron eigenvalue from above with a few matrix products and returns kind
perron when the bound already rules out every other row. Before any of that, a head whose H alone
rules out perron kind (an exact null-space eigenvalue 0 and every other ``|1 + λ^H| ≤ 1`` within the
tie tolerance: :func:`oversmooth.simulator.theory.contracting_heads`) is classed contracting and never looked
at again. The other heads take the dense path, which
is the audit's original computation, and so do matrices of order below :data:`CERTIFY_MIN_ORDER`,
whose spectra cost less than the certificate's bookkeeping.

Certificate
-----------
Every non-Perron eigenvalue λ of a row-stochastic A has ``|λ| ≤ ρ``, ρ a certified bound from
Doeblin coefficients of the powers of A (:mod:`oversmooth.simulator.doeblin`, where the rounding errors are
counted too).

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
DINOv2 audit with the stored H the first disk decided 78 % of the cases and the second most of
the rest (93 % in all); the others, and every non-perron case, take the dense path (with the
effective H, 31 % of the cases are non-perron: docs/theory.md §6.9).

Which disk a head tries is decided by an estimate, not a bound: a few power iterations
(O(n²) each) estimate its largest non-Perron ``|λ|``. Every head squares :data:`~oversmooth.simulator.doeblin.HOPELESS_SQUARINGS`
times first (none: A itself is tried); one still undecided then is estimated, and if its estimate
exceeds the first disk's target (``|λ_2|`` itself is too large: no power of A can certify it) it
stops squaring, with the ρ it has, and goes on to the second disk, centred on half the estimate;
one whose estimated largest ``|λ − α|`` exceeds the second disk's target goes to the dense path at
once. A wrong estimate costs time, never correctness. With the stored H, where the estimate still
streamed every head from memory (about two squarings a head), 3 squarings before it were
cheapest; since it runs a few heads at a time in cache, estimating at once is (the constant's
comment has the figures).

Functions
---------
perron_targets     -- per head, the radius that certifies perron kind and the Perron-row mode
nonperron_radius   -- a certified bound on the modulus of every non-Perron eigenvalue of A
perron_certified   -- which heads of a stack of attention matrices are certified perron
dominating_modes   -- kind, μ, λ^A, λ^H per head: contracting where H alone decides
                      (no mode), certified where the bound allows, dense otherwise
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.backend import array_module, to_numpy
from oversmooth.simulator.doeblin import (
    MAX_SQUARINGS,
    as_float64,
    nonperron_estimate,
    nonperron_radius,
    radius_bounds,
)
from oversmooth.simulator.theory import (
    CONTRACTING,
    HEAD_KINDS,
    contracting_heads,
    dominance_kinds,
    kron_eigenvalues,
)
from oversmooth.simulator.tolerances import PERRON_MARGIN, TIE_RTOL

__all__ = [
    "CERTIFY_MIN_ORDER",
    "MAX_SQUARINGS",
    "DenseMap",
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
#: The schedule takes the first disk's bound to come within this factor of the estimated largest
#: non-Perron |λ| at best (τ(A^k)^{1/k} approaches it from above as k grows): a head whose second
#: disk would need a tighter ρ than that goes dense instead of squaring in vain. A wrong guess
#: costs time, never correctness.
_REACHABLE = 1.05
#: How :func:`dominating_modes` may run its dense parts: ``dense_map(solve, parts)`` returns
#: ``solve`` of each part, in order (the builtin ``map``'s contract).
DenseMap = Callable[[Callable[[slice], Any], Sequence[slice]], Iterable[Any]]
#: Two top |1 + λ^H| of different eigenvalues closer than this (relative) make j* ambiguous: the
#: dense path, whose Perron root is 1 only to round-off, could pick either.
_TOP_AMBIGUITY_RTOL = 1e-10


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
        The tie tolerance of :func:`~oversmooth.simulator.theory.dominance_kinds`.

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


def _second_disk_room(
    targets: PerronTargets, heads: NDArray[np.intp], shift: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """For ``heads``: ``room`` (len(heads), d), the radius R about ``shift`` that keeps
    ``|1 + λ^H_j α| + |λ^H_j| R`` below the threshold, per j; ``|λ^H_j|`` (len(heads), d); and
    the threshold (len(heads), 1)."""
    xp = array_module(heads)
    lam = targets.eig_H[heads]
    size = xp.abs(lam)
    threshold = targets.threshold[heads][:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        room = (threshold - xp.abs(1.0 + lam * shift[:, None])) / size
    return room, size, threshold


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
    room, size, threshold = _second_disk_room(targets, heads, shift)
    failing = 1.0 + size * rho[:, None] >= threshold
    radius = xp.where(failing, room, np.inf).min(axis=-1)
    return xp.where(xp.isfinite(radius) & (radius > 0), radius, -1.0)


def _first_disk_need(
    targets: PerronTargets,
    heads: NDArray[np.intp],
    shift: NDArray[np.float64],
    spread: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The first disk's ρ below which the second disk's target R exceeds ``spread`` (per head of
    ``heads``): every j whose room about ``shift`` is at most ``spread`` must pass the first disk,
    ``1 + |λ^H_j| ρ`` below the threshold. A target for squaring only, never a bound."""
    xp = array_module(heads)
    room, size, threshold = _second_disk_room(targets, heads, shift)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        first = (threshold - 1.0) / size  # a subnormal |λ^H_j| asks for no ρ at all: +inf
    return xp.where(room <= spread[:, None], first, np.inf).min(axis=-1)


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
    A = as_float64(A)
    xp = array_module(A)
    targets = _targets_in(xp, targets)
    radius = targets.radius
    candidates = xp.where(radius > 0, radius, -1.0)  # -1: never a candidate
    no_shift = xp.zeros(A.shape[0])
    estimate = xp.full(A.shape[0], np.inf)

    def hopeful(heads: NDArray[np.intp]) -> NDArray[np.bool_]:
        estimate[heads] = nonperron_estimate(A[heads], no_shift[heads])
        return estimate[heads] < radius[heads]

    rho = radius_bounds(A, candidates, no_shift, max_squarings, give_up=True, triage=hopeful)
    certified = rho < radius
    heads = xp.flatnonzero((candidates > 0) & xp.isfinite(rho) & ~certified)
    unestimated = heads[xp.isinf(estimate[heads])]  # stopped before the triage squaring
    if unestimated.size:
        estimate[unestimated] = nonperron_estimate(A[unestimated], no_shift[unestimated])
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
    ``|λ|`` (:func:`nonperron_estimate`). R shrinks as ρ grows (more j need the second disk).
    A head whose estimated largest ``|λ − α|`` (its spread) exceeds R skips the squarings (it
    goes to the dense path), unless R would exceed it with the best ρ the first disk can reach
    (:data:`_REACHABLE` times the estimate): then the first disk is squared towards the ρ that
    R needs (:func:`_first_disk_need`) before the second disk is tried. Heads that stopped the
    first disk at once, on its estimate (nearly decomposable attention against a negative
    λ^H), come here with the loose ρ = τ(A); this finishes the first disk only where it helps.
    """
    xp = array_module(A)
    shift = xp.zeros(A.shape[0])
    shift[heads] = xp.minimum(estimate[heads], 1.0) / 2.0
    radius = xp.full(A.shape[0], -1.0)
    radius[heads] = _shifted_target(targets, heads, shift[heads], rho[heads])
    reach = xp.full(A.shape[0], -1.0)  # R with the best ρ the first disk can reach
    best = xp.minimum(rho[heads], _REACHABLE * estimate[heads])
    reach[heads] = _shifted_target(targets, heads, shift[heads], best)
    possible = heads[(radius[heads] > 0) | (reach[heads] > 0)]
    spread = xp.full(A.shape[0], np.inf)
    if possible.size:
        spread[possible] = nonperron_estimate(A[possible], shift[possible])
    wide = spread[possible] >= radius[possible]
    tighten = possible[wide & (_REACHABLE * spread[possible] < reach[possible])]
    if tighten.size:
        need = xp.full(A.shape[0], -1.0)
        need[tighten] = _first_disk_need(
            targets, tighten, shift[tighten], _REACHABLE * spread[tighten]
        )
        tighter = radius_bounds(A, need, xp.zeros(A.shape[0]), max_squarings, give_up=True)
        rho = xp.minimum(rho, tighter)
        radius[tighten] = _shifted_target(targets, tighten, shift[tighten], rho[tighten])
    radius[spread >= radius] = -1.0  # hopeless, and every head never estimated
    return radius_bounds(A, radius, shift, max_squarings, give_up=True) < radius


@dataclass(frozen=True)
class DominatingModes:
    """Per head: the kind code (into :data:`~oversmooth.simulator.theory.HEAD_KINDS`) and a dominating mode.

    Attributes
    ----------
    kinds : (heads,) int ndarray
        Codes 0–2 as :data:`~oversmooth.simulator.theory.KINDS`; 3, contracting, where H alone rules out
        perron kind (:func:`~oversmooth.simulator.theory.contracting_heads`).
    mu, eig_A, eig_H : (heads,) complex ndarray
        ``μ = 1 + λ^H λ^A`` of largest modulus (the first in ``(i, j)`` order), its λ^A and λ^H;
        NaN for a contracting head (no mode is asked for, and A's spectrum is never computed).
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
    dense_parts: int = 1,
    dense_map: DenseMap = map,
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
        :class:`oversmooth.simulator.backend.HostCopies`, which counts the bytes); the only large array
        that leaves A's device.
    dense_parts : int
        The undecided heads, brought to the host in one copy, go to their dense spectra in this
        many consecutive parts (fewer where there are fewer heads), each solved on its own.
    dense_map : callable
        ``dense_map(solve, parts)`` returns ``[solve(part) for part in parts]`` in order, however
        it runs them (the builtin ``map``, or the parts spread over threads: a caller that
        certifies one large stack on a device still solves its undecided heads on every host
        thread). Each head's spectrum and mode depend on that head alone, so the parts change
        no answer.

    Returns
    -------
    DominatingModes
        The same kinds as the dense path, except that a head whose H alone rules out perron kind
        (:func:`~oversmooth.simulator.theory.contracting_heads`, on A of order ≥ 2) is contracting, with no
        mode and no spectrum of A; μ, λ^A and λ^H equal to round-off. NumPy arrays.
    """
    A = as_float64(A)
    xp = array_module(A)
    lam_H = np.asarray(eig_H, dtype=np.complex128)
    n_heads = A.shape[0]
    kinds = np.zeros(n_heads, dtype=np.intp)
    mu = np.empty(n_heads, dtype=np.complex128)
    lam_A = np.ones(n_heads, dtype=np.complex128)
    lam_H_mode = np.empty(n_heads, dtype=np.complex128)
    certified = np.zeros(n_heads, dtype=bool)
    contracting = np.zeros(n_heads, dtype=bool)
    if A.shape[-1] >= 2:
        contracting = contracting_heads(lam_H, tie_rtol=tie_rtol)
        kinds[contracting] = HEAD_KINDS.index(CONTRACTING)
        mu[contracting] = lam_A[contracting] = lam_H_mode[contracting] = complex(np.nan, np.nan)
    if certify and A.shape[-1] >= min_order:
        if targets is None:
            targets = perron_targets(lam_H, tie_rtol=tie_rtol)
        # a contracting head's target radius is 0 (its top |1 + λ^H| is 1 within the tolerance)
        certified = to_numpy(perron_certified(A, targets)) & ~contracting
        heads = np.flatnonzero(certified)
        lam_H_mode[heads] = lam_H[heads, targets.best[heads]]
        mu[heads] = 1.0 + lam_H_mode[heads]
    dense = ~certified & ~contracting
    if dense.any():
        # one copy, on this thread: a device's work is ordered on this thread's stream only
        undecided = to_host(A if dense.all() else A[dense if xp is np else xp.asarray(dense)])
        lam_H_dense = lam_H[dense]

        def solve(part: slice) -> tuple[NDArray[Any], ...]:
            return _dense_modes(undecided[part], lam_H_dense[part], tie_rtol)

        solved = list(dense_map(solve, _consecutive_parts(len(lam_H_dense), dense_parts)))
        kinds[dense], mu[dense], lam_A[dense], lam_H_mode[dense] = (
            np.concatenate(column) for column in zip(*solved, strict=True)
        )
    return DominatingModes(kinds, mu, lam_A, lam_H_mode, certified)


def _consecutive_parts(count: int, parts: int) -> list[slice]:
    """``range(count)`` in at most ``parts`` consecutive slices of near-equal length, none empty."""
    parts = min(max(parts, 1), count)
    bounds = [k * count // parts for k in range(parts + 1)]  # strictly increasing: count ≥ parts
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


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
