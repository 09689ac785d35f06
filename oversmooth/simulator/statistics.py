"""Sufficient statistics of a token matrix: every smoothing metric from a few numbers and one Gram.

The metrics of :mod:`oversmooth.simulator.metrics` need the token matrix X only through

- the token count ``n`` (real rows), ``||X - 1 x̄ᵀ||_F²`` and ``n ||x̄||²`` (HFC/LFC, Def. 1);
- the unit rows ``u_i = x_i / ||x_i||`` through ``||Σ_i u_i||²``, ``Σ_i ||u_i||²`` and the count m
  of nonzero rows, since ``Σ_{i≠j} cos(x_i, x_j) = ||Σ_i u_i||² - Σ_i ||u_i||²`` (Def. 2);
- the products (max column sum) × (max row sum) of ``|X - 1 x̄ᵀ|`` and of ``|X|`` (Dong et al.);
- the singular values, i.e. the eigenvalues of either Gram matrix ``X Xᵀ`` (n×n) or ``Xᵀ X``
  (d×d): ``σ_k = sqrt(λ_k)`` (Def. 3, effective rank).

So a caller that cannot afford to move X (a GPU running the model) can reduce X where it lives
to these statistics and finish here: :func:`metrics_from_statistics` gives the same values as
:func:`oversmooth.simulator.metrics.all_metrics` up to the round-off of the reduction. :func:`token_statistics`
is the NumPy reduction (the reference for other implementations, e.g. ONNX nodes).

Public API
----------
TokenStatistics
    The statistics, batched over leading axes.
token_statistics
    Reduce X (optionally only its masked rows) to its statistics.
metrics_from_statistics
    The metrics of :data:`oversmooth.simulator.metrics.METRICS` from the statistics.
SPECTRAL_METRICS
    The metrics that need the Gram eigenvalues.
gram_eigenvalues
    The Gram matrices' eigenvalues, where the matrices are.
redo_unconverged
    A device eigensolver's spectra checked, the failures recomputed on the host.
unconverged
    Which spectra fail that check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.backend import array_module, to_numpy
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import _FROM_SINGULAR_VALUES, METRICS, _safe_divide
from oversmooth.simulator.tolerances import EPS, GRAM_DEFECT_ULPS
from oversmooth.simulator.validation import FloatArray, as_tokens, check_choice

__all__ = [
    "SCALAR_FIELDS",
    "SPECTRAL_METRICS",
    "SPECTRAL_NORM_METRIC",
    "TokenStatistics",
    "centred_gram_top",
    "gram_eigenvalues",
    "metrics_from_statistics",
    "redo_unconverged",
    "token_statistics",
    "unconverged",
]

#: Metrics that need the singular values (the Gram eigenvalues); the others need scalars only.
SPECTRAL_METRICS: tuple[str, ...] = tuple(_FROM_SINGULAR_VALUES)

#: HFC/LFC in the spectral norm (the poster's variant, :func:`oversmooth.simulator.metrics.hfc_lfc` with
#: ``norm="spectral"``): from :attr:`TokenStatistics.hfc_top`; computed only when asked for.
SPECTRAL_NORM_METRIC = "hfc_lfc_spectral"

#: The scalar statistics, in the order a packed ``(..., 8)`` array holds them.
SCALAR_FIELDS: tuple[str, ...] = (
    "n_tokens",
    "hfc_sq",
    "lfc_sq",
    "unit_sum_sq",
    "unit_trace",
    "n_nonzero",
    "dong_num_sq",
    "dong_den_sq",
)


@dataclass(frozen=True)
class TokenStatistics:
    """Sufficient statistics of token matrices X, each field of shape ``(...)``.

    Attributes
    ----------
    n_tokens : ndarray
        n, the rows (real tokens) counted.
    hfc_sq, lfc_sq : ndarray
        ``||X - 1 x̄ᵀ||_F²`` and ``n ||x̄||²`` with the token mean x̄.
    unit_sum_sq, unit_trace : ndarray
        ``||Σ_i u_i||²`` and ``Σ_i ||u_i||²`` over the unit rows (zero rows contribute 0).
    n_nonzero : ndarray
        m, the nonzero rows.
    dong_num_sq, dong_den_sq : ndarray
        ``||·||_1 ||·||_∞`` (max column abs sum × max row abs sum) of ``X - 1 x̄ᵀ`` and of X.
    gram_eigenvalues : ndarray of shape (..., k), optional
        Eigenvalues of ``X Xᵀ`` or ``Xᵀ X`` (any order; extra zeros are harmless), needed only by
        :data:`SPECTRAL_METRICS`.
    hfc_top : ndarray, optional
        ``||X - 1 x̄ᵀ||_2²``, the largest eigenvalue of the centred Gram matrix
        (:func:`centred_gram_top`), needed only by :data:`SPECTRAL_NORM_METRIC`.
    """

    n_tokens: FloatArray
    hfc_sq: FloatArray
    lfc_sq: FloatArray
    unit_sum_sq: FloatArray
    unit_trace: FloatArray
    n_nonzero: FloatArray
    dong_num_sq: FloatArray
    dong_den_sq: FloatArray
    gram_eigenvalues: FloatArray | None = None
    hfc_top: FloatArray | None = None

    @classmethod
    def from_packed(
        cls, scalars: ArrayLike, gram_eigenvalues: ArrayLike | None = None
    ) -> TokenStatistics:
        """Statistics from a ``(..., 8)`` array in :data:`SCALAR_FIELDS` order."""
        packed = np.asarray(scalars, dtype=np.float64)
        if packed.shape[-1:] != (len(SCALAR_FIELDS),):
            raise InputError(
                f"`scalars` must have a last axis of {len(SCALAR_FIELDS)} statistics; got shape "
                f"{packed.shape}"
            )
        fields = {name: packed[..., i] for i, name in enumerate(SCALAR_FIELDS)}
        eig = None if gram_eigenvalues is None else np.asarray(gram_eigenvalues, np.float64)
        return cls(**fields, gram_eigenvalues=eig)


def _norm_1_inf_sq(absolute: FloatArray) -> FloatArray:
    return absolute.sum(axis=-2).max(axis=-1) * absolute.sum(axis=-1).max(axis=-1)


def token_statistics(
    X: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    gram: Literal["tokens", "features", "none"] = "tokens",
) -> TokenStatistics:
    """Reduce token matrices to their :class:`TokenStatistics` (the NumPy reference).

    Parameters
    ----------
    X : (..., n, d) array_like
    mask : (..., n) array_like of bool, optional
        Rows to count (default all). Masked-out rows are treated as absent: X restricted to the
        kept rows has the same statistics (its Gram has extra zero eigenvalues, which no metric sees).
    gram : {"tokens", "features", "none"}
        Eigenvalues of ``X Xᵀ`` (n×n), of ``Xᵀ X`` (d×d), or none (no spectral metric then); with
        a Gram matrix, ``hfc_top`` too (the centred one's largest eigenvalue).

    Returns
    -------
    TokenStatistics
    """
    check_choice(gram, "gram", ("tokens", "features", "none"))
    X = as_tokens(X)
    keep = np.ones(X.shape[:-1]) if mask is None else np.asarray(mask, dtype=np.float64)
    if keep.shape != X.shape[:-1]:
        raise InputError(f"`mask` must have shape {X.shape[:-1]}; got {keep.shape}")
    Xm = X * keep[..., None]
    n = keep.sum(axis=-1)
    totals = Xm.sum(axis=-2)
    mean = np.divide(totals, n[..., None], out=np.zeros_like(totals), where=n[..., None] > 0)
    centered = (X - mean[..., None, :]) * keep[..., None]
    norms = np.linalg.norm(Xm, axis=-1)
    unit = np.divide(Xm, norms[..., None], out=np.zeros_like(Xm), where=norms[..., None] > 0)
    eig: FloatArray | None = None
    top: FloatArray | None = None
    if gram == "tokens":
        eig = np.asarray(np.linalg.eigvalsh(Xm @ np.swapaxes(Xm, -1, -2)), dtype=np.float64)
    elif gram == "features":
        eig = np.asarray(np.linalg.eigvalsh(np.swapaxes(Xm, -1, -2) @ Xm), dtype=np.float64)
    if gram != "none":
        top = np.linalg.eigvalsh(np.swapaxes(centered, -1, -2) @ centered)[..., -1]
    return TokenStatistics(
        n_tokens=n,
        hfc_sq=np.sum(centered**2, axis=(-2, -1)),
        lfc_sq=n * np.sum(mean**2, axis=-1),
        unit_sum_sq=np.sum(unit.sum(axis=-2) ** 2, axis=-1),
        unit_trace=np.sum(unit**2, axis=(-2, -1)),
        n_nonzero=(norms > 0).sum(axis=-1).astype(np.float64),
        dong_num_sq=_norm_1_inf_sq(np.abs(centered)),
        dong_den_sq=_norm_1_inf_sq(np.abs(Xm)),
        gram_eigenvalues=eig,
        hfc_top=top,
    )


def centred_gram_top(
    gram: ArrayLike,
    orientation: Literal["tokens", "features"],
    *,
    weights: ArrayLike | None = None,
    totals: ArrayLike | None = None,
    n_tokens: ArrayLike | None = None,
) -> FloatArray:
    """``||X - 1 x̄ᵀ||_2²`` over the counted rows, from the Gram matrix of the masked rows ``Xm``.

    With ``w`` the 0/1 token weights, ``n = Σ w`` and ``s = Xmᵀ w`` the sum of the counted rows,
    the centred rows are ``C = Xm - w x̄ᵀ`` (``x̄ = s / n``), and

    - tokens, ``G = Xm Xmᵀ``: ``C Cᵀ = P G P`` with ``P = I - w wᵀ / n`` (needs ``weights``);
    - features, ``G = Xmᵀ Xm``: ``Cᵀ C = G - s sᵀ / n`` (needs ``totals`` s and ``n_tokens``).

    Parameters
    ----------
    gram : (..., k, k) array_like
    orientation : {"tokens", "features"}
    weights : (..., n) array_like, optional
    totals : (..., d) array_like, optional
    n_tokens : (...) array_like, optional

    Returns
    -------
    (...) ndarray
        The largest eigenvalue of the centred Gram matrix (float64).
    """
    G = np.asarray(gram, dtype=np.float64)
    if orientation == "tokens":
        if weights is None:
            raise InputError("`weights` must be given with a tokens Gram matrix; got none")
        w = np.asarray(weights, dtype=np.float64)
        n = w.sum(axis=-1)[..., None, None]
        P = np.eye(G.shape[-1]) - w[..., :, None] * w[..., None, :] / n
        centred = P @ G @ P
    else:
        if totals is None or n_tokens is None:
            raise InputError("`totals` and `n_tokens` must be given with a features Gram matrix")
        t = np.asarray(totals, dtype=np.float64)
        n = np.asarray(n_tokens, dtype=np.float64)[..., None, None]
        centred = G - t[..., :, None] * t[..., None, :] / n
    return np.asarray(np.linalg.eigvalsh(centred)[..., -1], dtype=np.float64)


def gram_eigenvalues(gram: Any) -> FloatArray:
    """Ascending eigenvalues of symmetric Gram matrices, in float64, where the matrices are.

    Parameters
    ----------
    gram : (..., k, k) array
        NumPy, or a device library's (CuPy): then the batched symmetric eigensolver of that
        library runs on the device (cuSOLVER's Jacobi solver, float64) and only the ``(..., k)``
        eigenvalues come to the host. This branch is the generic one for any NumPy-like device
        library; a caller with a faster solver for one library (the audit has one for CuPy,
        built on CUDA kernels this NumPy-only layer does not import) uses its own.

    Returns
    -------
    (..., k) float64 ndarray
        On the host. A device's spectra are checked (:func:`redo_unconverged`): one that fails
        is recomputed on the host.
    """
    xp = array_module(gram)
    if xp is np:
        return np.linalg.eigvalsh(np.asarray(gram, np.float64))
    gram = gram.astype(xp.float64, copy=False)
    return redo_unconverged(gram, xp.linalg.eigvalsh(gram))


def redo_unconverged(gram: Any, eig: Any) -> FloatArray:
    """``eig`` on the host, with every spectrum that fails the Frobenius check recomputed there.

    An iterative eigensolver that stops early (a Jacobi method after its last sweep) returns the
    diagonal d of Qᵀ G Q = diag(d) + E, and ``‖G‖_F² = Σ d_i² + ‖E‖_F²``; by the Wielandt–Hoffman
    theorem ``‖λ(G) − sort(d)‖_2 ≤ ‖E‖_F``. So a spectrum is kept when
    ``|‖G‖_F² − Σ eig_i²| ≤ GRAM_DEFECT_ULPS · k ε ‖G‖_F²``, and recomputed by LAPACK
    (``eigvalsh``) otherwise.

    Parameters
    ----------
    gram : (..., k, k) float64 array
        Symmetric, NumPy or a device library's; the check runs where it is.
    eig : (..., k) float64 array
        Its ascending eigenvalues as computed, in the same library.

    Returns
    -------
    (..., k) float64 ndarray
    """
    xp = array_module(gram)
    k = gram.shape[-1]
    failed = np.flatnonzero(unconverged(gram, eig))
    values = np.array(to_numpy(eig), dtype=np.float64)  # a copy: the recomputed rows go in
    if failed.size:
        flat = values.reshape(-1, k)
        redo = to_numpy(gram.reshape(-1, k, k)[xp.asarray(failed)])
        flat[failed] = np.linalg.eigvalsh(np.asarray(redo, np.float64))
    return values


def unconverged(gram: Any, eig: Any) -> np.ndarray:
    """(...,) bool on the host: the spectra whose Frobenius defect
    ``|‖G‖_F² − Σ eig_i²|`` exceeds ``GRAM_DEFECT_ULPS · k ε ‖G‖_F²`` (:func:`redo_unconverged`)."""
    xp = array_module(gram)
    frobenius = xp.sum(gram * gram, axis=(-2, -1))
    defect = xp.abs(frobenius - xp.sum(eig * eig, axis=-1))
    return np.asarray(to_numpy(defect > GRAM_DEFECT_ULPS * gram.shape[-1] * EPS * frobenius))


def _singular_values_from_gram(eig: FloatArray) -> FloatArray:
    """Descending singular values from Gram eigenvalues; round-off level ones become exactly 0.

    A Gram matrix computed in float64 carries errors of about ``k ε λ_max``; eigenvalues below
    that are noise (negative ones included) and would otherwise add spurious ``sqrt(k ε) σ_1``
    singular values to the effective rank.
    """
    eig = np.sort(np.asarray(eig, dtype=np.float64), axis=-1)[..., ::-1]
    floor = eig.shape[-1] * np.finfo(np.float64).eps * np.maximum(eig[..., :1], 0.0)
    return np.sqrt(np.where(eig > floor, eig, 0.0))


def metrics_from_statistics(
    stats: TokenStatistics, names: Iterable[str] | None = None
) -> dict[str, FloatArray]:
    """The metrics of :data:`~oversmooth.simulator.metrics.METRICS` named in ``names`` (default all).

    Equal to :func:`oversmooth.simulator.metrics.all_metrics` on the counted rows, up to the round-off of the
    statistics (about ``sqrt(k ε)`` relative for the spectral metrics' smallest singular values).

    Raises
    ------
    InputError
        An unknown metric name, fewer than 2 tokens counted, or a spectral metric without
        ``gram_eigenvalues``.
    """
    wanted = list(METRICS) if names is None else list(names)
    known = (*METRICS, SPECTRAL_NORM_METRIC)
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise InputError(f"metric names must be among {', '.join(known)}; got {unknown[0]!r}")
    if np.any(np.asarray(stats.n_tokens) < 2):
        raise InputError(
            "every token matrix must have at least 2 tokens (rows) for a smoothing metric; got "
            f"{int(np.min(stats.n_tokens))}"
        )
    spectral = [name for name in wanted if name in SPECTRAL_METRICS]
    if spectral and stats.gram_eigenvalues is None:
        raise InputError(f"metric {spectral[0]!r} needs `gram_eigenvalues`; got none")
    values: dict[str, FloatArray] = {}
    if spectral:
        s = _singular_values_from_gram(stats.gram_eigenvalues)  # type: ignore[arg-type]
        values.update({name: _FROM_SINGULAR_VALUES[name](s) for name in spectral})
    for name in wanted:
        if name == "hfc_lfc":
            values[name] = _safe_divide(np.sqrt(stats.hfc_sq), np.sqrt(stats.lfc_sq))
        elif name == SPECTRAL_NORM_METRIC:
            if stats.hfc_top is None:
                raise InputError(f"metric {name!r} needs `hfc_top`; got none")
            top = np.sqrt(np.maximum(stats.hfc_top, 0.0))
            values[name] = _safe_divide(top, np.sqrt(stats.lfc_sq))
        elif name == "cosine":
            m = np.asarray(stats.n_nonzero, dtype=np.float64)
            pairs = _safe_divide(stats.unit_sum_sq - stats.unit_trace, m * (m - 1))
            values[name] = np.where(m >= 2, pairs, np.nan)  # no pair: NaN, as all_metrics
        elif name == "dong_residual":
            values[name] = _safe_divide(np.sqrt(stats.dong_num_sq), np.sqrt(stats.dong_den_sq))
    return {name: values[name] for name in wanted}
