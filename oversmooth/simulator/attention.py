"""The building blocks every update rule and the ONNX auditor share: softmax, norms, attention.

These formulas live here once. They follow the ONNX operator definitions (``Softmax``,
``LayerNormalization``, ``RMSNormalization``) so that the simulator and a real exported graph agree.

Functions
---------
softmax            -- max-subtracted softmax along the last axis
layer_norm         -- ONNX ``LayerNormalization`` over the last axis (biased variance, eps inside sqrt)
rms_norm           -- RMSNorm over the last axis
attention_matrix   -- row-stochastic A = softmax(X W_Q (X W_K)^T / sqrt(k) + mask)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.validation import FloatArray, as_float_array, as_tokens

__all__ = ["attention_matrix", "layer_norm", "rms_norm", "softmax"]

#: LayerNorm epsilon used by the paper's setting and by PyTorch/ONNX exports.
LN_EPS = 1e-5


def softmax(S: ArrayLike, axis: int = -1) -> FloatArray:
    """Softmax along ``axis``, subtracting the maximum first (ONNX ``Softmax``, opset >= 13).

    Parameters
    ----------
    S : (..., n, n) array_like
        Scores.
    axis : int
        Axis to normalise.

    Returns
    -------
    (..., n, n) ndarray
        Nonnegative entries summing to one along ``axis``.
    """
    S = np.asarray(S, dtype=np.float64)
    shifted = S - np.max(S, axis=axis, keepdims=True)
    E = np.exp(shifted)
    return E / np.sum(E, axis=axis, keepdims=True)


def _feature_params(param: ArrayLike | None, d: int, name: str, default: float) -> FloatArray:
    if param is None:
        return np.full(d, default)
    array = as_float_array(param, name)
    if array.shape not in ((d,), ()):
        raise InputError(
            f"`{name}` must have shape ({d},) to match the feature axis; got {array.shape}"
        )
    return np.broadcast_to(array, (d,))


def layer_norm(
    X: ArrayLike,
    gamma: ArrayLike | None = None,
    beta: ArrayLike | None = None,
    *,
    eps: float = LN_EPS,
) -> FloatArray:
    """LayerNorm per token over the feature axis, exactly as ONNX ``LayerNormalization`` (axis -1).

    Parameters
    ----------
    X : (..., n, d) array_like
        Tokens in rows.
    gamma, beta : (d,) array_like, optional
        Scale and shift; default ones and zeros. ``gamma`` may have either sign.
    eps : float
        Added to the biased variance inside the square root.

    Returns
    -------
    (..., n, d) ndarray
        ``LN(X) = N(X) diag(gamma) + 1 beta^T`` with
        ``N(X)_i = (x_i - mean(x_i)) / sqrt(var(x_i) + eps)`` (docs/theory.md §4).
    """
    X = as_tokens(X)
    d = X.shape[-1]
    g = _feature_params(gamma, d, "gamma", 1.0)
    b = _feature_params(beta, d, "beta", 0.0)
    centred = X - X.mean(axis=-1, keepdims=True)
    variance = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(variance + eps) * g + b


def rms_norm(X: ArrayLike, gamma: ArrayLike | None = None, *, eps: float = LN_EPS) -> FloatArray:
    """RMSNorm per token: ``x / sqrt(mean(x^2) + eps) * gamma`` (Llama-style blocks).

    Parameters
    ----------
    X : (..., n, d) array_like
    gamma : (d,) array_like, optional

    Returns
    -------
    (..., n, d) ndarray
    """
    X = as_tokens(X)
    g = _feature_params(gamma, X.shape[-1], "gamma", 1.0)
    return X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + eps) * g


def attention_matrix(
    X: ArrayLike,
    W_Q: ArrayLike,
    W_K: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    scale: float | None = None,
) -> FloatArray:
    """Row-stochastic attention ``A = softmax(X W_Q (X W_K)^T * scale + mask)``.

    Parameters
    ----------
    X : (..., n, d) array_like
    W_Q, W_K : (d, k) array_like
        Query and key projections, row-vector convention.
    mask : (n, n) array_like, optional
        Additive mask (``-inf`` or a large negative value where attention is forbidden).
    scale : float, optional
        Default ``1/sqrt(k)`` (docs/theory.md §1).

    Returns
    -------
    (..., n, n) ndarray
    """
    X = as_tokens(X)
    W_Q = as_float_array(W_Q, "W_Q", min_ndim=2)
    W_K = as_float_array(W_K, "W_K", min_ndim=2)
    d = X.shape[-1]
    if W_Q.shape[-2] != d or W_K.shape[-2] != d or W_Q.shape[-1] != W_K.shape[-1]:
        raise InputError(
            f"`W_Q` and `W_K` must both have shape ({d}, k); got {W_Q.shape} and {W_K.shape}"
        )
    k = W_Q.shape[-1]
    scores = (X @ W_Q) @ np.swapaxes(X @ W_K, -1, -2) * (k**-0.5 if scale is None else scale)
    if mask is not None:
        scores = scores + np.asarray(mask, dtype=np.float64)
    return softmax(scores)
