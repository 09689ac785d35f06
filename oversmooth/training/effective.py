"""The effective per-head value product of a trained block, in NumPy (no torch needed).

A pre-LN block adds ``A · LN(X) · W_V^h W_O^h`` to the stream, with ``LN(x) = γ ⊙ (x − x̄)/σ(x) + β``.
Row by row ``x − x̄ = x C`` with the centring ``C = I − 𝟙𝟙ᵀ/d`` and ``γ ⊙ y = y diag(γ)``, so the
right-acting linear map from the stream to the branch (the theory's H, up to the per-token 1/σ on
the left and constant bias rows) is

    M_h = C diag(γ) W_V^h W_O^h        (d×d, rank ≤ d_head).

Its d_head possibly nonzero eigenvalues are those of the d_head×d_head matrix
``W_O^h C diag(γ) W_V^h`` (``eig(XY)`` and ``eig(YX)`` agree away from 0). A post-LN block has no norm
inside its branch: there ``M_h = W_V^h W_O^h``.

For the ⁺/⁻ heads, ``W_V^h = V_h`` and ``W_O^h = Λ_h V_hᵀ`` (:mod:`.parametrisation`), so the small
matrix is ``Λ_h V_hᵀ C diag(γ) V_h``. With a uniform γ = c𝟙 (c > 0, e.g. at initialisation)
``V_hᵀ C V_h = (C V_h)ᵀ (C V_h)`` is symmetric positive semi-definite (C is an orthogonal projector),
so by Sylvester's law of inertia the nonzero eigenvalues are real with the signs of Λ_h: the
effective H keeps the sign the parametrisation chose. With a non-uniform γ, ``C diag(γ)`` is not
symmetric and ``V_hᵀ C diag(γ) V_h`` need not be positive definite, so signs can change; the
stored product ``W_V^h W_O^h`` always has exactly the signs of Λ_h. :func:`effective_head_eigenvalues`
computes the eigenvalues instead of assuming either.
"""

from __future__ import annotations

import numpy as np

from oversmooth.simulator.effective import prenorm_left
from oversmooth.simulator.errors import InputError

__all__ = [
    "effective_head_eigenvalues",
    "effective_head_products",
    "sign_shares",
    "stored_head_eigenvalues",
]


def _split(W_V: np.ndarray, W_O: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(heads, d, d_head) value and (heads, d_head, d) output blocks of row-vector weights."""
    W_V = np.asarray(W_V, dtype=np.float64)
    W_O = np.asarray(W_O, dtype=np.float64)
    if (
        W_V.ndim != 2
        or W_O.ndim != 2
        or W_V.shape[1] != W_O.shape[0]
        or W_V.shape[0] != W_O.shape[1]
    ):
        raise InputError(f"W_V (d×k) and W_O (k×d) do not fit: shapes {W_V.shape} and {W_O.shape}")
    d, k = W_V.shape
    if heads < 1 or k % heads:
        raise InputError(f"{k} value columns do not split into {heads} heads")
    dh = k // heads
    return W_V.reshape(d, heads, dh).transpose(1, 0, 2), W_O.reshape(heads, dh, d)


def _gamma(gamma: np.ndarray | None, d: int) -> np.ndarray | None:
    if gamma is None:
        return None
    gamma = np.asarray(gamma, dtype=np.float64)
    if gamma.shape != (d,):
        raise InputError(f"gamma must have shape ({d},); got {gamma.shape}")
    return gamma


def effective_head_products(
    W_V: np.ndarray,
    W_O: np.ndarray,
    heads: int,
    gamma: np.ndarray | None = None,
    *,
    centred: bool = True,
) -> np.ndarray:
    """``M_h = C diag(γ) W_V^h W_O^h`` for every head.

    Parameters
    ----------
    W_V, W_O : ndarray, shapes (d, k) and (k, d)
        Value and output weights in the row-vector convention ``y = x @ W``; head h owns columns
        (rows of W_O) ``h·d_head … (h+1)·d_head − 1``, ``d_head = k / heads``.
    heads : int
    gamma : ndarray, shape (d,), optional
        The pre-norm's weight (None: no norm in the branch, as in post-LN; then ``centred`` should
        be False too).
    centred : bool
        Whether the norm subtracts the token's mean (LayerNorm: yes; RMSNorm or none: no).

    Returns
    -------
    ndarray, shape (heads, d, d), float64
    """
    V, O = _split(W_V, W_O, heads)
    return prenorm_left(V, _gamma(gamma, V.shape[1]), centred=centred) @ O


def effective_head_eigenvalues(
    W_V: np.ndarray,
    W_O: np.ndarray,
    heads: int,
    gamma: np.ndarray | None = None,
    *,
    centred: bool = True,
) -> np.ndarray:
    """The d_head possibly nonzero eigenvalues of each ``M_h``: ``eig(W_O^h C diag(γ) W_V^h)``.

    Returns
    -------
    ndarray, shape (heads, d_head), complex128
        Sorted by real part within each head.
    """
    V, O = _split(W_V, W_O, heads)
    small = O @ prenorm_left(V, _gamma(gamma, V.shape[1]), centred=centred)
    values = np.linalg.eigvals(small).astype(np.complex128)
    return np.take_along_axis(values, np.argsort(values.real, axis=-1), axis=-1)


def stored_head_eigenvalues(W_V: np.ndarray, W_O: np.ndarray, heads: int) -> np.ndarray:
    """The d_head nonzero-candidate eigenvalues of the stored ``W_V^h W_O^h`` (no norm folded)."""
    return effective_head_eigenvalues(W_V, W_O, heads, None, centred=False)


def sign_shares(eigenvalues: np.ndarray, *, tol: float = 0.0) -> dict[str, float]:
    """Shares of eigenvalues with real part > tol, < −tol, and in between (``positive``,
    ``negative``, ``zero``), plus the largest imaginary part's modulus (``max_imag``)."""
    values = np.asarray(eigenvalues).ravel()
    n = max(values.size, 1)
    return {
        "positive": float(np.sum(values.real > tol) / n),
        "negative": float(np.sum(values.real < -tol) / n),
        "zero": float(np.sum(np.abs(values.real) <= tol) / n),
        "max_imag": float(np.max(np.abs(values.imag), initial=0.0)),
    }
