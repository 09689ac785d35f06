"""Predictions of the linear theory, computed from eig(A) and eig(H) without the nd x nd matrix.

For the update ``X_l = X_{l-1} + A X_{l-1} M`` with ``M = W_V W_proj`` and ``H = M^T``,
``vec(X_l) = (I + H ⊗ A) vec(X_{l-1})`` and, by Lemma 1, the eigenvalues of ``I + H ⊗ A`` are
``mu_ij = 1 + lambda^H_j lambda^A_i`` (docs/theory.md §3).

Functions
---------
value_spectrum      -- eigenvalues of W_V W_proj via the small d_v x d_v product
kron_eigenvalues    -- mu_ij = 1 + lambda^H_j lambda^A_i, shape (..., n, d)
perron_index        -- index of the Perron eigenvalue of a stochastic A (closest to 1)
dominance_kinds     -- vectorised kind (perron / non-perron / balanced) of many systems
contracting_heads   -- which H spectra (with a null space) rule out perron kind from H alone
dominance           -- the dominating eigenvalue(s) of one system, as a dataclass
predict             -- regime (input, angle, rank convergence), rate and limits of one system
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import hfc_lfc_limit
from oversmooth.simulator.tolerances import TIE_RTOL
from oversmooth.simulator.validation import FloatArray, as_float_array, as_row_stochastic, as_square

__all__ = [
    "CONTRACTING",
    "HEAD_KINDS",
    "KINDS",
    "Dominance",
    "Prediction",
    "contracting_heads",
    "dominance",
    "dominance_kinds",
    "kron_eigenvalues",
    "perron_index",
    "predict",
    "value_spectrum",
]

ComplexArray = NDArray[np.complex128]
Kind = Literal["perron", "non-perron", "balanced"]
#: Kind names in the order of the integer codes returned by :func:`dominance_kinds`.
KINDS: tuple[Kind, ...] = ("perron", "non-perron", "balanced")
#: The per-head class a head's H alone decides (:func:`contracting_heads`, docs/theory.md §6.10).
CONTRACTING = "contracting"
#: Kind names of the per-head decision (:func:`oversmooth.simulator.perron.dominating_modes`): KINDS, then
#: :data:`CONTRACTING` as code 3.
HEAD_KINDS: tuple[str, ...] = (*KINDS, CONTRACTING)


def value_spectrum(W_V: ArrayLike, W_proj: ArrayLike) -> ComplexArray:
    """Eigenvalues of ``M = W_V W_proj`` (= those of H), through the smaller of the two products.

    Parameters
    ----------
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like

    Returns
    -------
    (..., d) complex ndarray
        When ``d_v < d`` the nonzero eigenvalues of the d x d product are those of the
        ``d_v x d_v`` product ``W_proj W_V``; the remaining ``d - d_v`` are zero (claim 31).
    """
    W_V = as_float_array(W_V, "W_V", min_ndim=2)
    W_proj = as_float_array(W_proj, "W_proj", min_ndim=2)
    d, d_v = W_V.shape[-2:]
    if W_proj.shape[-2:] != (d_v, d):
        raise InputError(
            f"`W_proj` must have shape ({d_v}, {d}) to follow `W_V` {W_V.shape}; got {W_proj.shape}"
        )
    if d_v >= d:
        return np.linalg.eigvals(_finite_product(W_V, W_proj)).astype(np.complex128)
    small = np.linalg.eigvals(_finite_product(W_proj, W_V)).astype(np.complex128)
    zeros = np.zeros((*small.shape[:-1], d - d_v), dtype=np.complex128)
    return np.concatenate([small, zeros], axis=-1)


def _finite_product(left: FloatArray, right: FloatArray) -> FloatArray:
    """``left @ right``, refused in one line where it overflows float64 (finite factors, an
    infinite product): the eigensolver would fail on it with a LinAlgError."""
    with np.errstate(over="ignore", invalid="ignore"):
        product = left @ right
    if not np.all(np.isfinite(product)):
        raise InputError(
            f"`W_V @ W_proj` must be finite in float64; the product of shapes {left.shape} and "
            f"{right.shape} overflows (largest factor entries {np.abs(left).max():.3g} and "
            f"{np.abs(right).max():.3g})"
        )
    return product


def kron_eigenvalues(eig_A: ArrayLike, eig_H: ArrayLike) -> ComplexArray:
    """Eigenvalues ``mu_ij = 1 + lambda^H_j lambda^A_i`` of ``I + H ⊗ A`` (Lemma 1).

    Parameters
    ----------
    eig_A : (..., n) array_like
    eig_H : (..., d) array_like

    Returns
    -------
    (..., n, d) complex ndarray
        ``mu[..., i, j]``; flatten to compare with a dense eigensolver.
    """
    lam_A = np.asarray(eig_A, dtype=np.complex128)
    lam_H = np.asarray(eig_H, dtype=np.complex128)
    return 1.0 + lam_A[..., :, None] * lam_H[..., None, :]


def perron_index(eig_A: ArrayLike) -> NDArray[np.intp]:
    """Index of the eigenvalue closest to 1 (the Perron root of a stochastic A), shape ``(...)``."""
    return np.argmin(np.abs(np.asarray(eig_A) - 1.0), axis=-1)


def _dominating_mask(mu: ComplexArray, tie_rtol: float) -> NDArray[np.bool_]:
    modulus = np.abs(mu)
    top = modulus.max(axis=(-2, -1), keepdims=True)
    return modulus >= top * (1.0 - tie_rtol)


def dominance_kinds(
    eig_A: ArrayLike, eig_H: ArrayLike, *, tie_rtol: float = TIE_RTOL
) -> NDArray[np.intp]:
    """Kind of the dominating eigenvalue(s) for many systems at once.

    Parameters
    ----------
    eig_A : (..., n) array_like
        Spectra of row-stochastic attention matrices.
    eig_H : (..., d) array_like
        Spectra of H; broadcast against ``eig_A``'s leading axes.
    tie_rtol : float
        Moduli within this relative tolerance of the maximum all dominate.

    Returns
    -------
    (...) int ndarray
        Codes into :data:`KINDS`: 0 perron (every dominating mode uses lambda^A = 1: smoothing),
        1 non-perron, 2 balanced (two dominating modes differ in both their A and H index, S4).
    """
    lam_A = np.asarray(eig_A, dtype=np.complex128)
    mask = _dominating_mask(kron_eigenvalues(lam_A, eig_H), tie_rtol)
    p = perron_index(lam_A)
    rows = mask.any(axis=-1)  # which A indices dominate
    cols = mask.any(axis=-2)  # which H indices dominate
    n_rows, n_cols = rows.sum(axis=-1), cols.sum(axis=-1)
    perron_rows = np.take_along_axis(rows, p[..., None], axis=-1)[..., 0]
    only_perron = perron_rows & (n_rows == 1)
    # Two dominating modes in different rows and columns <=> the mask is not inside one row or one column.
    balanced = (n_rows > 1) & (n_cols > 1) & ~_mask_is_single_line(mask)
    return np.where(balanced, 2, np.where(only_perron, 0, 1))


def contracting_heads(eig_H: ArrayLike, *, tie_rtol: float = TIE_RTOL) -> NDArray[np.bool_]:
    """Which H spectra rule out perron kind without the spectrum of A (docs/theory.md §6.10).

    A head's d×d product ``M_h`` has rank at most d_head < d, and its spectrum as the per-head rule
    takes it holds an exact 0 (the null space) beside the d_head eigenvalues of ``W_O^h W_V^h``.
    That 0 gives ``μ = 1 + 0·λ^A = 1`` in every row of A. When every other eigenvalue has
    ``|1 + λ^H| ≤ 1 / (1 − tie_rtol)``, the Perron row's largest ``|μ|`` lies within the tie
    tolerance of that 1, which every other row of A also holds: whatever A is (of order ≥ 2), the
    Perron row never dominates alone, so the kind is never perron. Which non-Perron mode
    dominates, or whether all rows tie at 1, is then a question about A's spectrum and, in the
    tie, about round-off; the class answers the question the per-head rule asks — does this head
    make its own subspace's mean grow? — with no: ``1 + λ^H`` scales the low-frequency part of the
    head's range by at most 1 (up to the tolerance), and the null space is left alone.

    Parameters
    ----------
    eig_H : (..., k) array_like
        Spectra of H, one per head; a head is contracting only if one entry is exactly 0.
    tie_rtol : float
        The tie tolerance of :func:`dominance_kinds`.

    Returns
    -------
    (...) bool ndarray
    """
    lam_H = np.asarray(eig_H, dtype=np.complex128)
    null = lam_H == 0
    moduli = np.where(null, 0.0, np.abs(1.0 + lam_H))
    return null.any(axis=-1) & (moduli.max(axis=-1) <= 1.0 / (1.0 - tie_rtol))


def _mask_is_single_line(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
    rows = mask.any(axis=-1).sum(axis=-1)
    cols = mask.any(axis=-2).sum(axis=-1)
    return (rows == 1) | (cols == 1)


@dataclass(frozen=True)
class Dominance:
    """The dominating eigenvalue(s) of ``I + H ⊗ A`` (Def. 4).

    Attributes
    ----------
    mu : complex
        A dominating eigenvalue (the first of the ties).
    modulus : float
        ``|mu|``, the spectral radius of the update.
    modes : tuple of (int, int)
        Every dominating ``(i, j)``: A-eigenvalue index, H-eigenvalue index (in eig order).
    kind : {"perron", "non-perron", "balanced"}
    perron : int
        Index of the Perron eigenvalue of A.
    rate : float
        Asymptotic per-layer factor of the leading correction to the metrics:
        ``max |mu_ij| / |mu*|`` over the A-indices i of no dominating mode. For perron kind this is
        the decay of HFC/LFC, ``max_{i != perron} |mu_ij| / |mu*|`` (S2); for non-perron kind the
        convergence of HFC/LFC and the cosine to their limits (S3d, S9). For balanced kind (a rank-two
        limit) it is the largest non-dominating mode of any row.
    eig_A, eig_H : complex ndarray
    """

    mu: complex
    modulus: float
    modes: tuple[tuple[int, int], ...]
    kind: Kind
    perron: int
    rate: float
    eig_A: ComplexArray
    eig_H: ComplexArray


def _spectra(A: ArrayLike, H: ArrayLike) -> tuple[ComplexArray, ComplexArray, NDArray[np.float64]]:
    A = as_row_stochastic(A, "A")
    H = as_square(H, "H")
    if A.ndim != 2 or H.ndim != 2:
        raise InputError(
            f"`A` and `H` must be single matrices here; got shapes {A.shape} and {H.shape}"
        )
    return np.linalg.eigvals(A).astype(np.complex128), np.linalg.eigvals(H).astype(np.complex128), A


def dominance(A: ArrayLike, H: ArrayLike, *, tie_rtol: float = TIE_RTOL) -> Dominance:
    """Find the dominating eigenvalue(s) of ``I + H ⊗ A`` from eig(A) and eig(H).

    Parameters
    ----------
    A : (n, n) array_like
        Row-stochastic attention.
    H : (d, d) array_like
        ``(W_V W_proj)^T``.
    tie_rtol : float
        Relative tolerance for ties in modulus.

    Returns
    -------
    Dominance
    """
    lam_A, lam_H, _ = _spectra(A, H)
    return _dominance_from_spectra(lam_A, lam_H, tie_rtol)


def _dominance_from_spectra(lam_A: ComplexArray, lam_H: ComplexArray, tie_rtol: float) -> Dominance:
    mu = kron_eigenvalues(lam_A, lam_H)
    modulus = np.abs(mu)
    mask = _dominating_mask(mu, tie_rtol)
    modes = tuple((int(i), int(j)) for i, j in zip(*np.nonzero(mask), strict=True))
    p = int(perron_index(lam_A))
    kind = KINDS[int(dominance_kinds(lam_A, lam_H, tie_rtol=tie_rtol))]
    top = float(modulus.max())
    # With a rank-one limit u_i s^T, modes sharing the dominating A-eigenvector u_i keep X in
    # span(u_i) ⊗ R^d and change no metric, so the rate comes from the largest mode in any other row
    # (S2 for perron kind, S3d otherwise). A balanced limit is rank two, and every other mode moves it.
    others = modulus[~mask] if kind == "balanced" else modulus[~mask.any(axis=1)]
    rate = float(others.max() / top) if others.size and top > 0 else 0.0
    i, j = modes[0]
    return Dominance(complex(mu[i, j]), top, modes, kind, p, rate, lam_A, lam_H)


@dataclass(frozen=True)
class Prediction:
    """What the theory predicts for repeated layers of ``X + A X M`` (S1-S6, S9).

    Attributes
    ----------
    dominance : Dominance
    input_convergence, angle_convergence, rank_collapse : bool
        Def. 1-3 for generic X0.
    rate : float
        See :attr:`Dominance.rate`.
    hfc_lfc_limit : float or None
        Limit of HFC/LFC (Frobenius): 0 for perron kind, ``||(I-Pi)u1|| / ||Pi u1||`` for a real
        non-perron mode (S3a), None when it oscillates (complex or tied modes).
    cosine_limit : float or None
        Limit of the mean token cosine: 1 for perron kind, ``((p - m)^2 - n) / (n (n - 1))`` for a
        real non-perron mode with p positive and m negative entries (S3b), else None.
    """

    dominance: Dominance
    input_convergence: bool
    angle_convergence: bool
    rank_collapse: bool
    rate: float
    hfc_lfc_limit: float | None
    cosine_limit: float | None


def predict(A: ArrayLike, H: ArrayLike, *, tie_rtol: float = TIE_RTOL) -> Prediction:
    """Predict the regime, rate and metric limits of repeated layers ``X + A X M``.

    Parameters
    ----------
    A : (n, n) array_like
        Row-stochastic attention, fixed across layers.
    H : (d, d) array_like
        ``(W_V W_proj)^T``.
    tie_rtol : float

    Returns
    -------
    Prediction
    """
    lam_A, lam_H, A_ = _spectra(A, H)
    dom = _dominance_from_spectra(lam_A, lam_H, tie_rtol)
    if dom.kind == "perron":
        return Prediction(dom, True, True, True, dom.rate, 0.0, 1.0)
    hfc_limit = cosine_limit = None
    rows = {i for i, _ in dom.modes}
    if dom.kind == "non-perron" and len(rows) == 1 and abs(dom.mu.imag) <= tie_rtol * dom.modulus:
        u = _right_eigenvector(A_, lam_A[next(iter(rows))])
        if u is not None:
            hfc_limit = hfc_lfc_limit(u)
            cosine_limit = _sign_cosine_limit(u)
    return Prediction(dom, False, False, dom.kind != "balanced", dom.rate, hfc_limit, cosine_limit)


def _right_eigenvector(A: NDArray[np.float64], lam: complex) -> NDArray[np.float64] | None:
    if abs(lam.imag) > 1e-12:
        return None
    _, _, vh = np.linalg.svd(A - lam.real * np.eye(A.shape[0]))
    return vh[-1]


def _sign_cosine_limit(u: NDArray[np.float64]) -> float:
    n = u.size
    scale = np.abs(u).max()
    signs = np.sign(np.where(np.abs(u) > 1e-12 * scale, u, 0.0))
    p, m = int((signs > 0).sum()), int((signs < 0).sum())
    return ((p - m) ** 2 - n) / (n * (n - 1))
