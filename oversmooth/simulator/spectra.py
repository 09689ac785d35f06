"""Synthetic attention matrices A and value-projection matrices H with controlled spectra.

Every generator takes ``rng`` (an int seed, a ``numpy.random.Generator`` or None) and a ``batch``
shape prepended to the result, so ``batch=(64,)`` draws 64 independent systems.

Functions
---------
attention_symmetric_scores  -- positive row-stochastic A with real spectrum (Assumption A)
attention_doubly_stochastic -- positive symmetric doubly stochastic A (Sinkhorn)
attention_general           -- positive row-stochastic A with a complex spectrum
h_symmetric                 -- H = Q diag(eigenvalues) Q^T
h_nonsymmetric              -- H = V B V^{-1}, real blocks for complex-conjugate pairs
reparameterize              -- the paper's H = V Lambda V^T, [V, R] = QR(Theta), Lambda = ±psi^2
random_tokens               -- X0 with i.i.d. standard normal entries
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.attention import softmax
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.validation import (
    FloatArray,
    SeedLike,
    as_float_array,
    as_generator,
    check_choice,
)

__all__ = [
    "Reparameterization",
    "attention_doubly_stochastic",
    "attention_general",
    "attention_symmetric_scores",
    "h_nonsymmetric",
    "h_symmetric",
    "random_tokens",
    "reparameterize",
]

#: Sinkhorn iterations stop when every row and column sum is within this of 1.
SINKHORN_TOL = 1e-13
SINKHORN_MAX_ITER = 10_000


def _size(batch: tuple[int, ...] | int) -> tuple[int, ...]:
    return (batch,) if isinstance(batch, int) else tuple(batch)


def _check_tokens(n: int) -> None:
    if not isinstance(n, int | np.integer) or n < 2:
        raise InputError(f"`n` must be an integer >= 2 (tokens); got {n!r}")


def random_tokens(
    n: int, d: int, *, batch: tuple[int, ...] | int = (), rng: SeedLike = None
) -> FloatArray:
    """Token matrix ``X0`` with i.i.d. N(0, 1) entries, shape ``(*batch, n, d)``."""
    _check_tokens(n)
    return as_generator(rng).standard_normal((*_size(batch), n, d))


def attention_symmetric_scores(
    n: int,
    *,
    scale: float = 1.0,
    scores: Literal["psd", "indefinite"] = "indefinite",
    rank: int | None = None,
    batch: tuple[int, ...] | int = (),
    rng: SeedLike = None,
) -> FloatArray:
    """Positive row-stochastic A with a real, diagonalisable spectrum (Assumption A).

    ``A = D^{-1} exp(S)`` with symmetric scores ``S = scale * Z B Z^T / sqrt(r)``; A is similar to the
    symmetric ``D^{-1/2} exp(S) D^{-1/2}``, so its spectrum is real (docs/theory.md §3.1).

    Parameters
    ----------
    n : int
        Tokens.
    scale : float
        Logit scale; large values make A nearly reducible (eigenvalues near 1).
    scores : {"psd", "indefinite"}
        ``B = I`` gives PSD scores and spec(A) in [0, 1] (claim 4); ``B = diag(±1)`` allows negative
        eigenvalues.
    rank : int, optional
        Inner dimension r of the scores, default n.
    batch : tuple of int
    rng : int, Generator or None

    Returns
    -------
    (*batch, n, n) ndarray
    """
    _check_tokens(n)
    check_choice(scores, "scores", ("psd", "indefinite"))
    gen = as_generator(rng)
    r = n if rank is None else rank
    Z = gen.standard_normal((*_size(batch), n, r))
    signs = np.ones(r) if scores == "psd" else np.where(np.arange(r) % 2 == 0, 1.0, -1.0)
    S = (Z * signs) @ np.swapaxes(Z, -1, -2) * (scale / np.sqrt(r))
    return softmax(S)


def attention_doubly_stochastic(
    n: int, *, scale: float = 1.0, batch: tuple[int, ...] | int = (), rng: SeedLike = None
) -> FloatArray:
    """Positive, symmetric, doubly stochastic A: a symmetric kernel balanced by Sinkhorn.

    Symmetric Sinkhorn scaling ``A = D K D`` keeps symmetry, so ``1^T u_1 = 0`` for every non-Perron
    eigenvector (claim 13).

    Returns
    -------
    (*batch, n, n) ndarray
    """
    _check_tokens(n)
    gen = as_generator(rng)
    Z = gen.standard_normal((*_size(batch), n, n))
    S = (Z + np.swapaxes(Z, -1, -2)) * (scale / 2.0)
    K = np.exp(S - S.max(axis=(-2, -1), keepdims=True))
    x = np.ones((*K.shape[:-1],))
    for _ in range(SINKHORN_MAX_ITER):
        x = np.sqrt(x / (K @ x[..., None])[..., 0])
        A = x[..., :, None] * K * x[..., None, :]
        if np.max(np.abs(A.sum(axis=-1) - 1.0)) < SINKHORN_TOL:
            break
    else:  # nearly decomposable K converge slowly: finish x ⊙ (K x) = 1 by Newton's method
        x = _newton_balance(K, x)
        A = x[..., :, None] * K * x[..., None, :]
    A = 0.5 * (A + np.swapaxes(A, -1, -2))
    return A / A.sum(axis=-1, keepdims=True)


def _newton_balance(K: FloatArray, x: FloatArray, steps: int = 30) -> FloatArray:
    """Newton steps on ``F(x) = x ⊙ (K x) - 1`` (Jacobian ``diag(K x) + diag(x) K``) from a near root.

    Stops at round-off, or before a step that would leave the positive orthant.
    """
    for _ in range(steps):
        Kx = (K @ x[..., None])[..., 0]
        F = x * Kx - 1.0
        if np.max(np.abs(F)) < SINKHORN_TOL:
            break
        J = x[..., :, None] * K + Kx[..., :, None] * np.eye(K.shape[-1])
        step = np.linalg.solve(J, F[..., None])[..., 0]
        if np.any(x - step <= 0):
            break
        x = x - step
    return x


def attention_general(
    n: int, *, scale: float = 1.0, batch: tuple[int, ...] | int = (), rng: SeedLike = None
) -> FloatArray:
    """Positive row-stochastic A from non-symmetric Gaussian scores (complex spectrum in general).

    Returns
    -------
    (*batch, n, n) ndarray
    """
    _check_tokens(n)
    gen = as_generator(rng)
    return softmax(scale * gen.standard_normal((*_size(batch), n, n)))


def _orthogonal(d: int, batch: tuple[int, ...], gen: np.random.Generator) -> FloatArray:
    Q, R = np.linalg.qr(gen.standard_normal((*batch, d, d)))
    return Q * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., None, :]


def h_symmetric(
    eigenvalues: ArrayLike, *, batch: tuple[int, ...] | int = (), rng: SeedLike = None
) -> FloatArray:
    """Symmetric ``H = Q diag(eigenvalues) Q^T`` with a Haar-random orthogonal Q.

    Parameters
    ----------
    eigenvalues : (d,) or (*batch, d) array_like
        Real spectrum.

    Returns
    -------
    (*batch, d, d) ndarray
    """
    lam = as_float_array(eigenvalues, "eigenvalues", min_ndim=1)
    size = _size(batch)
    lam = np.broadcast_to(lam, (*size, lam.shape[-1])) if size else lam
    Q = _orthogonal(lam.shape[-1], lam.shape[:-1], as_generator(rng))
    return (Q * lam[..., None, :]) @ np.swapaxes(Q, -1, -2)


def h_nonsymmetric(
    eigenvalues: ArrayLike, *, condition: float = 10.0, rng: SeedLike = None
) -> FloatArray:
    """Non-symmetric real ``H = V B V^{-1}`` with a prescribed (possibly complex) spectrum.

    Complex eigenvalues must come in conjugate pairs; each pair ``a ± ib`` becomes the real block
    ``[[a, -b], [b, a]]`` in B. V has singular values spread log-uniformly in ``[1, condition]``.

    Parameters
    ----------
    eigenvalues : (d,) array_like of complex
    condition : float
        Condition number of the eigenvector basis V.

    Returns
    -------
    (d, d) ndarray
    """
    lam = np.asarray(eigenvalues, dtype=np.complex128)
    if lam.ndim != 1:
        raise InputError(f"`eigenvalues` must be one-dimensional; got shape {lam.shape}")
    B = _real_block_diagonal(lam)
    gen = as_generator(rng)
    d = lam.size
    U, W = _orthogonal(d, (), gen), _orthogonal(d, (), gen)
    V = (U * np.geomspace(1.0, condition, d)) @ W.T
    return V @ B @ np.linalg.inv(V)


def _real_block_diagonal(lam: np.ndarray) -> FloatArray:
    real = lam[np.abs(lam.imag) == 0].real
    upper = lam[lam.imag > 0]
    lower = np.sort_complex(np.conj(lam[lam.imag < 0]))
    if upper.size != lower.size or not np.allclose(
        np.sort_complex(upper), lower, rtol=0, atol=1e-12
    ):
        raise InputError(
            "`eigenvalues` must contain complex values in conjugate pairs; got an unpaired value"
        )
    d = lam.size
    B = np.zeros((d, d))
    B[np.arange(real.size), np.arange(real.size)] = real
    for k, z in enumerate(upper):
        i = real.size + 2 * k
        B[i : i + 2, i : i + 2] = [[z.real, -z.imag], [z.imag, z.real]]
    return B


@dataclass(frozen=True)
class Reparameterization:
    """The paper's parameterisation ``H = V Lambda V^T`` (docs/theory.md §5).

    Attributes
    ----------
    H : (d, d) ndarray
        Symmetric; its eigenvalues are exactly ``diag(Lambda)``.
    V : (d, d) ndarray
        Orthogonal factor of QR(Theta).
    eigenvalues : (d,) ndarray
        ``psi^2`` (plus) or ``clip(-psi^2, -1, 0)`` (minus).
    W_V, W_proj : ndarray
        ``W_V = V``, ``W_proj = Lambda V^T``, so that ``W_V W_proj = H``.
    """

    H: FloatArray
    V: FloatArray
    eigenvalues: FloatArray
    W_V: FloatArray
    W_proj: FloatArray


def reparameterize(
    Theta: ArrayLike, psi: ArrayLike, sign: Literal["plus", "minus"]
) -> Reparameterization:
    """Build ``H = V Lambda V^T`` with ``[V, R] = QR(Theta)`` and ``Lambda = ±psi^2``.

    Parameters
    ----------
    Theta : (d, d) array_like
        Full-rank parameter matrix.
    psi : (d,) array_like
    sign : {"plus", "minus"}
        ``plus``: Lambda = psi^2 (smoothing guaranteed, S6); ``minus``: Lambda = clip(-psi^2, -1, 0)
        (no input convergence, S5, when no entry is clipped to 0).

    Returns
    -------
    Reparameterization
    """
    check_choice(sign, "sign", ("plus", "minus"))
    Theta = as_float_array(Theta, "Theta", min_ndim=2)
    psi = as_float_array(psi, "psi", min_ndim=1)
    d = Theta.shape[-1]
    if Theta.shape != (d, d) or psi.shape != (d,):
        raise InputError(
            f"`Theta` must be (d, d) and `psi` (d,); got {Theta.shape} and {psi.shape}"
        )
    V, _ = np.linalg.qr(Theta)
    lam = psi**2 if sign == "plus" else np.clip(-(psi**2), -1.0, 0.0)
    W_proj = lam[:, None] * V.T
    return Reparameterization(V @ W_proj, V, lam, V, W_proj)
