"""What a theorist asks next of an audited block: depth-level growth, spectral gaps, non-normality.

Pure mathematics on float64 arrays (batched over leading axes), used by the audit's depth step
(:mod:`oversmooth.importers.audit.depth`) and defined in docs/theory.md §6.11.

The quotient by the constant vector
-----------------------------------
A row-stochastic A (n×n) has ``A 𝟙 = 𝟙``. With the Householder reflector ``H = I − β v vᵀ``,
``v = 𝟙 + √n e_1`` (symmetric, orthogonal, ``H 𝟙 = −√n e_1``; the one
:mod:`oversmooth.simulator.operator` uses), the first column of ``H A H`` is ``e_1``, so ``H A H`` is block
upper triangular: ``[[1, *], [0, B]]`` with ``B = Qᵀ A Q`` ((n−1)×(n−1), Q the last n−1 columns
of H). The spectrum of B is that of A with **one** copy of the Perron root 1 — the one whose
eigenvector is 𝟙 — removed: :func:`quotient_spectrum`. A second eigenvalue 1 (a decomposable A,
the identity) stays in B, so ``|λ₂(A)| = ρ(B) = 1`` there: a tie at the top is reported as the
modulus it has, never dropped or broken by round-off (:func:`second_eigenvalue_modulus`).

Growth of HFC over LFC
----------------------
For one head (Lemma 1), ``I + H ⊗ A`` has the eigenvalues ``1 + λ^H_j λ^A_i``; the Perron row
(λ^A = 1) acts on the low-frequency subspace and the rest on its complement, so the ratio of the
two spectral radii, ``ρ_q / ρ_lfc`` with ``ρ_lfc = max_j |1 + λ^H_j|`` and
``ρ_q = max_{i, j} |1 + λ^H_j λ_i(B)|``, is the asymptotic growth per layer of HFC/LFC when the
layer is repeated (:func:`head_growth`). Over a stack of blocks, the predicted HFC/LFC after
block l is the measured one at layer 0 times the product of the blocks' ratios
(:func:`predicted_curve`).

Non-normality
-------------
The theory diagonalises H. How far a value product ``M = W_V W_O`` is from normal is reported
two ways (:func:`nonnormality`): ``σ_max(M) / ρ(M)`` (1 for a normal M; large when the transient
growth ``‖M^k‖`` can exceed what the eigenvalues say) and ``‖M − Mᵀ‖_F / ‖M‖_F`` (0 for a
symmetric M, 2 for a skew-symmetric one, about √2 for independent entries: twice the relative
size of M's antisymmetric part).

Functions
---------
quotient_spectrum          -- eig(A) less the Perron root of 𝟙: the n−1 eigenvalues of Qᵀ A Q
second_eigenvalue_modulus  -- |λ₂(A)| = ρ(Qᵀ A Q)
head_growth                -- ρ_lfc, ρ_q of ``I + H ⊗ A`` from eig(H) and the quotient spectrum
nonnormality               -- σ_max(M)/ρ(M) and ‖M − Mᵀ‖_F/‖M‖_F of a factored M = W_V W_O
geometric_mean             -- exp(mean(log x)) of positive ratios (a growth per layer)
predicted_curve            -- h_0 · Π_{k<l} g_k
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.operator import householder, reflect
from oversmooth.simulator.theory import value_spectrum
from oversmooth.simulator.validation import as_float_array, as_row_stochastic

__all__ = [
    "geometric_mean",
    "head_growth",
    "nonnormality",
    "predicted_curve",
    "quotient_spectrum",
    "second_eigenvalue_modulus",
]

FloatArray = NDArray[np.float64]
ComplexArray = NDArray[np.complex128]


def quotient_spectrum(A: ArrayLike) -> ComplexArray:
    """The eigenvalues of a row-stochastic A other than the Perron root that 𝟙 carries.

    Parameters
    ----------
    A : (..., n, n) array_like
        Row-stochastic (rows are rescaled to sum to one exactly, so 𝟙 is an exact eigenvector).

    Returns
    -------
    (..., n − 1) complex ndarray
        The spectrum of ``B = Qᵀ A Q`` (module docstring): eig(A) with one copy of 1 removed.
        Empty for n = 1.
    """
    checked = as_row_stochastic(A, "A")
    exact = checked / checked.sum(axis=-1, keepdims=True)
    n = exact.shape[-1]
    if n == 1:
        return np.zeros((*exact.shape[:-2], 0), dtype=np.complex128)
    v, beta = householder(n)
    HA = reflect(v, beta, exact)
    HAH = np.swapaxes(reflect(v, beta, np.swapaxes(HA, -1, -2)), -1, -2)  # H symmetric
    return np.linalg.eigvals(HAH[..., 1:, 1:]).astype(np.complex128)


def second_eigenvalue_modulus(A: ArrayLike) -> FloatArray:
    """``|λ₂(A)|``: the largest modulus among the eigenvalues of A other than its Perron root.

    Yu & Zhang's escalation rate of token similarity; ``1 − |λ₂|`` is A's spectral gap.

    Parameters
    ----------
    A : (..., n, n) array_like
        Row-stochastic.

    Returns
    -------
    (...) float ndarray
        ``ρ(Qᵀ A Q)`` (:func:`quotient_spectrum`). A repeated eigenvalue 1 (A decomposable, e.g.
        the identity) gives exactly the modulus 1 of its other copies; a conjugate pair at the
        top counts once. NaN for n = 1 (no second eigenvalue).
    """
    rest = quotient_spectrum(A)
    if rest.shape[-1] == 0:
        return np.full(rest.shape[:-1], np.nan)
    return np.asarray(np.abs(rest).max(axis=-1), dtype=np.float64)


def head_growth(rest: ArrayLike, eig_H: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """The two spectral radii of ``I + H ⊗ A`` split by the low-frequency subspace.

    Parameters
    ----------
    rest : (..., n − 1) array_like
        :func:`quotient_spectrum` of A.
    eig_H : (..., k) array_like
        The eigenvalues of H that the case uses (e.g. a head's d_head values and its null-space 0).

    Returns
    -------
    rho_lfc : (...) float ndarray
        ``max_j |1 + λ^H_j|`` (the Perron row: LFC).
    rho_quotient : (...) float ndarray
        ``max_{i, j} |1 + λ^H_j λ_i|`` over the quotient's eigenvalues λ_i (HFC); 0 when n = 1.

    Their ratio ``ρ_q / ρ_lfc`` is the asymptotic growth of HFC/LFC per repeated layer.
    """
    lam = np.asarray(rest, dtype=np.complex128)
    eig = np.asarray(eig_H, dtype=np.complex128)
    rho_lfc = np.asarray(np.abs(1.0 + eig).max(axis=-1), dtype=np.float64)
    if lam.shape[-1] == 0:
        return rho_lfc, np.zeros_like(rho_lfc)
    modes = 1.0 + lam[..., :, None] * eig[..., None, :]
    return rho_lfc, np.asarray(np.abs(modes).max(axis=(-2, -1)), dtype=np.float64)


def nonnormality(W_V: ArrayLike, W_O: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """How far ``M = W_V W_O`` is from normal: ``σ_max(M) / ρ(M)`` and ``‖M − Mᵀ‖_F / ‖M‖_F``.

    Parameters
    ----------
    W_V : (..., d, r) array_like
    W_O : (..., r, d) array_like
        The factors (a dense M is ``W_V = M``, ``W_O = I``). ρ(M) comes from the smaller of
        ``W_V W_O`` and ``W_O W_V`` (:func:`oversmooth.simulator.theory.value_spectrum`: they share the
        nonzero eigenvalues), σ_max(M) from the r×r ``R_V R_Oᵀ`` of
        the QR factors ``W_V = Q_V R_V``, ``W_Oᵀ = Q_O R_O``; the antisymmetric part from M itself
        (a difference of traces would lose the digits of a nearly symmetric M).

    Returns
    -------
    sigma_over_rho : (...) float ndarray
        ≥ 1, equal to 1 for a normal M. ``+inf`` when M ≠ 0 has computed spectral radius exactly 0
        (a nilpotent M that LAPACK resolves exactly, e.g. a strictly triangular one); ``1.0`` for
        M = 0 (normal). A nilpotent M whose computed eigenvalues are round-off gives a large finite
        value: it is as far from normal as that number says.
    asymmetry : (...) float ndarray
        In [0, 2]: 0 for a symmetric M, 2 for a skew-symmetric one; 0.0 for M = 0.
    """
    rho = np.abs(value_spectrum(W_V, W_O)).max(axis=-1)  # checks the factors' shapes
    left = as_float_array(W_V, "W_V", min_ndim=2)
    right = as_float_array(W_O, "W_O", min_ndim=2)
    R_V = np.linalg.qr(left, mode="r")
    R_O = np.linalg.qr(np.swapaxes(right, -1, -2), mode="r")
    sigma = np.linalg.norm(R_V @ np.swapaxes(R_O, -1, -2), ord=2, axis=(-2, -1))
    M = left @ right
    size = np.linalg.norm(M, axis=(-2, -1))
    skew = np.linalg.norm(M - np.swapaxes(M, -1, -2), axis=(-2, -1))
    zero = size == 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(zero, 1.0, sigma / rho)
        asymmetry = np.where(zero, 0.0, skew / size)
    # σ_max ≥ ρ holds exactly; the two come from different factorisations, so clip round-off
    return np.maximum(ratio, 1.0), np.asarray(asymmetry, dtype=np.float64)


def geometric_mean(ratios: ArrayLike) -> float:
    """``exp(mean(log g))`` of non-negative ratios (NaN ones left out; NaN when none is left).

    The growth per layer that, repeated, gives the same product as the ratios: the mean a
    product over depth calls for. A 0 gives 0 and an ``inf`` gives ``inf`` (0 and inf: NaN).
    """
    values = np.asarray(ratios, dtype=np.float64).ravel()
    values = values[~np.isnan(values)]
    if values.size == 0:
        return float("nan")
    if np.any(values < 0):
        raise InputError(f"`ratios` must be non-negative; got min {values.min():.3g}")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.exp(np.mean(np.log(values))))


def predicted_curve(start: float, growth: ArrayLike) -> FloatArray:
    """``P_0 = start``, ``P_{l+1} = P_l g_l``: the predicted HFC/LFC after each of L blocks.

    Parameters
    ----------
    start : float
        The measured HFC/LFC at layer 0.
    growth : (L,) array_like
        Each block's predicted growth per layer (a NaN makes every later value NaN).

    Returns
    -------
    (L + 1,) float ndarray
    """
    ratios = np.asarray(growth, dtype=np.float64).ravel()
    return np.concatenate([[start], start * np.cumprod(ratios)])
