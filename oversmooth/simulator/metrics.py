"""Scale-invariant smoothing metrics of token matrices, batched over leading axes ``(..., n, d)``.

Each metric measures one of the paper's three notions of smoothing (docs/theory.md §2):

hfc_lfc         -- Def. 1, input convergence: ||HFC[X]|| / ||LFC[X]|| (-> 0 when smoothing)
cosine          -- Def. 2, angle convergence: mean cosine between token rows (-> 1 when smoothing)
sigma_ratio     -- Def. 3, rank collapse: sigma_2 / sigma_1 (-> 0 under rank collapse)
rank1_residual  -- Def. 3, ||X - [X]_(1)||_F / ||X||_F (best rank-one approximation)
dong_residual   -- Dong et al. 2021: ||X - 1 mean(X)||_{1,inf} / ||X||_{1,inf} (token mean, not argmin)
effective_rank  -- Roy & Vetterli: exp(entropy of the normalised singular values)

Conventions for degenerate input (documented values, never silent guesses):

- fewer than 2 tokens is an :class:`~oversmooth.simulator.errors.InputError` (no pair, no frequency split);
- the zero matrix has every metric NaN (no direction at all);
- in ``cosine``, pairs involving a zero row are left out of the mean; NaN if no pair remains;
- ``hfc_lfc`` is ``inf`` when the token mean is exactly zero but X is not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.validation import FloatArray, as_tokens, check_choice

__all__ = [
    "METRICS",
    "all_metrics",
    "cosine",
    "dong_residual",
    "effective_rank",
    "hfc_lfc",
    "hfc_lfc_limit",
    "lfc_hfc_split",
    "rank1_residual",
    "sigma_ratio",
]


def _tokens(X: ArrayLike) -> FloatArray:
    X = as_tokens(X)
    if X.shape[-2] < 2:
        raise InputError(
            f"`X` must have at least 2 tokens (rows) for a smoothing metric; got shape {X.shape}"
        )
    return X


def _safe_divide(num: ArrayLike, den: ArrayLike) -> FloatArray:
    """num / den for den >= 0: 0/0 -> nan, positive/0 -> inf, without floating-point warnings."""
    num, den = np.broadcast_arrays(np.asarray(num, float), np.asarray(den, float))
    out = np.full(num.shape, np.nan)
    pos = den > 0
    out[pos] = num[pos] / den[pos]
    out[~pos & (num > 0)] = np.inf
    return out[()] if out.ndim == 0 else out


def lfc_hfc_split(X: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Split X into its low- and high-frequency components along the token axis.

    Parameters
    ----------
    X : (..., n, d) array_like

    Returns
    -------
    lfc, hfc : (..., n, d) ndarray
        ``LFC[X] = (1/n) 1 1^T X`` (the token mean in every row) and ``HFC[X] = X - LFC[X]``
        (docs/theory.md §2.1; Wang et al. 2022).
    """
    X = as_tokens(X)
    lfc = np.broadcast_to(X.mean(axis=-2, keepdims=True), X.shape)
    return lfc, X - lfc


def hfc_lfc(X: ArrayLike, *, norm: Literal["fro", "spectral"] = "fro") -> FloatArray:
    """Ratio of high- to low-frequency energy, ``||HFC[X]|| / ||LFC[X]||`` (Def. 1).

    Parameters
    ----------
    X : (..., n, d) array_like
    norm : {"fro", "spectral"}
        Frobenius (default, docs/theory.md §9.1) or spectral norm of both parts. The LFC has rank one, so
        both norms agree on it; they differ only on the HFC.

    Returns
    -------
    (...) ndarray
        Tends to 0 under input convergence (oversmoothing).
    """
    check_choice(norm, "norm", ("fro", "spectral"))
    X = _tokens(X)
    mean = X.mean(axis=-2)
    lfc_norm = np.sqrt(X.shape[-2]) * np.linalg.norm(mean, axis=-1)
    hfc = X - mean[..., None, :]
    if norm == "fro":
        hfc_norm = np.linalg.norm(hfc, axis=(-2, -1))
    else:
        hfc_norm = np.linalg.norm(hfc, ord=2, axis=(-2, -1))
    return _safe_divide(hfc_norm, lfc_norm)


def cosine(X: ArrayLike, *, absolute: bool = False) -> FloatArray:
    """Mean cosine similarity between token rows over ordered pairs ``i != j`` (Def. 2).

    ``mean_cos(X) = (1^T C 1 - tr C) / (m (m - 1))`` with ``C`` the Gram matrix of the row-normalised
    nonzero rows and ``m`` their number (docs/theory.md §2.3).

    Parameters
    ----------
    X : (..., n, d) array_like
    absolute : bool
        Average ``|cos|`` instead: the sign-agnostic "all tokens collinear" condition.

    Returns
    -------
    (...) ndarray
        In [-1, 1]; tends to 1 under angle convergence.
    """
    X = _tokens(X)
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    nonzero = (norms > 0).astype(float)
    unit = np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)
    C = unit @ np.swapaxes(unit, -1, -2)
    if absolute:
        C = np.abs(C)
    m = nonzero[..., 0].sum(axis=-1)
    off_diagonal = C.sum(axis=(-2, -1)) - np.trace(C, axis1=-2, axis2=-1)
    # With fewer than two nonzero rows there is no pair: the sum is 0 over 0 pairs, hence NaN.
    return _safe_divide(off_diagonal, m * (m - 1))


def _singular_values(X: FloatArray) -> FloatArray:
    return np.asarray(np.linalg.svd(X, compute_uv=False), dtype=np.float64)


def _sigma_ratio(s: FloatArray) -> FloatArray:
    second = s[..., 1] if s.shape[-1] > 1 else np.zeros(s.shape[:-1])
    return _safe_divide(second, s[..., 0])


def _rank1_residual(s: FloatArray) -> FloatArray:
    total = np.sqrt(np.sum(s * s, axis=-1))
    tail = np.sqrt(np.sum(s[..., 1:] ** 2, axis=-1))
    return _safe_divide(tail, total)


def _effective_rank(s: FloatArray) -> FloatArray:
    total = s.sum(axis=-1, keepdims=True)
    p = np.divide(s, total, out=np.zeros_like(s), where=total > 0)
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    entropy = -np.sum(p * logs, axis=-1)
    result = np.where(total[..., 0] > 0, np.exp(entropy), np.nan)
    return result[()] if result.ndim == 0 else result


def sigma_ratio(X: ArrayLike) -> FloatArray:
    """Ratio of the two largest singular values, ``sigma_2 / sigma_1`` (Def. 3, rank collapse).

    Parameters
    ----------
    X : (..., n, d) array_like

    Returns
    -------
    (...) ndarray
        In [0, 1]; 0 when X has rank one (also when ``d == 1``); NaN for the zero matrix.
    """
    return _sigma_ratio(_singular_values(_tokens(X)))


def rank1_residual(X: ArrayLike) -> FloatArray:
    """Relative distance to the best rank-one approximation, ``sqrt(sum_{k>=2} s_k^2) / ||X||_F``.

    Parameters
    ----------
    X : (..., n, d) array_like

    Returns
    -------
    (...) ndarray
        In [0, 1]; tends to 0 under rank collapse (docs/theory.md §2.4).
    """
    return _rank1_residual(_singular_values(_tokens(X)))


def _norm_1_inf(X: FloatArray) -> FloatArray:
    """Dong et al.'s composite norm ``sqrt(||X||_1 ||X||_inf)`` (max column sum x max row sum)."""
    absolute = np.abs(X)
    return np.sqrt(absolute.sum(axis=-2).max(axis=-1) * absolute.sum(axis=-1).max(axis=-1))


def dong_residual(X: ArrayLike) -> FloatArray:
    """Dong et al.'s residual ``||X - 1 xbar^T||_{1,inf} / ||X||_{1,inf}`` with the token mean xbar.

    This is Dong, Cordonnier & Loukas (2021)'s plotted quantity, not the paper's rank collapse: it
    vanishes only when all rows are equal (docs/theory.md §2.4, claim 30).

    Parameters
    ----------
    X : (..., n, d) array_like

    Returns
    -------
    (...) ndarray
    """
    X = _tokens(X)
    return _safe_divide(_norm_1_inf(X - X.mean(axis=-2, keepdims=True)), _norm_1_inf(X))


def effective_rank(X: ArrayLike) -> FloatArray:
    """Effective rank ``exp(-sum p_k log p_k)`` with ``p_k = s_k / sum s`` (Roy & Vetterli 2007).

    Parameters
    ----------
    X : (..., n, d) array_like

    Returns
    -------
    (...) ndarray
        In [1, min(n, d)]; NaN for the zero matrix.
    """
    return _effective_rank(_singular_values(_tokens(X)))


def hfc_lfc_limit(u: ArrayLike) -> float:
    """HFC/LFC (Frobenius) of any matrix ``u s^T``: ``||(I - Pi) u|| / ||Pi u||`` (S3a).

    Parameters
    ----------
    u : (n,) array_like
        Token-space direction.

    Returns
    -------
    float
        ``inf`` when ``1^T u = 0``.
    """
    u = np.asarray(u, dtype=np.float64)
    mean = u.mean()
    return float(_safe_divide(np.linalg.norm(u - mean), np.sqrt(u.size) * abs(mean)))


#: Every metric by name; the order is the order of CSV output.
METRICS: dict[str, Callable[[ArrayLike], FloatArray]] = {
    "hfc_lfc": hfc_lfc,
    "cosine": cosine,
    "sigma_ratio": sigma_ratio,
    "rank1_residual": rank1_residual,
    "dong_residual": dong_residual,
    "effective_rank": effective_rank,
}


#: Metrics that are functions of the singular values alone (one SVD serves them all).
_FROM_SINGULAR_VALUES: dict[str, Callable[[FloatArray], FloatArray]] = {
    "sigma_ratio": _sigma_ratio,
    "rank1_residual": _rank1_residual,
    "effective_rank": _effective_rank,
}


def all_metrics(X: ArrayLike, names: Iterable[str] | None = None) -> dict[str, FloatArray]:
    """The metrics of :data:`METRICS` named in ``names`` (default all) on X, shape ``(...)`` each.

    The singular values are computed once and shared by the metrics that need them.
    """
    X = _tokens(X)
    wanted = list(METRICS) if names is None else list(names)
    unknown = [name for name in wanted if name not in METRICS]
    if unknown:
        raise InputError(f"metric names must be among {', '.join(METRICS)}; got {unknown[0]!r}")
    s: FloatArray | None = None  # computed on first need, then shared
    values: dict[str, FloatArray] = {}
    for name in wanted:
        if name in _FROM_SINGULAR_VALUES:
            s = _singular_values(X) if s is None else s
            values[name] = _FROM_SINGULAR_VALUES[name](s)
        else:
            values[name] = METRICS[name](X)
    return values
