"""The effective H's left factor: what a pre-norm does to the stream before W_V (docs/theory.md §6.8).

A pre-LN block's branch reads ``LN(x) = γ ⊙ (x − x̄)/σ(x) + β``. Row by row ``x − x̄ = x C`` with the
centring ``C = I − 𝟙𝟙ᵀ/d`` and ``γ ⊙ y = y diag(γ)``, so, the per-token 1/σ and the constant rows
aside, head h's linear map from the stream to the branch is ``M_h = C diag(γ) W_V^h W_O^h ⋯``.
:func:`prenorm_left` is that left factor applied to W_V, in one arithmetic shared by the audit
(:meth:`oversmooth.importers.weights.BlockWeights.effective_value_head`) and the training library
(:mod:`oversmooth.training.effective`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["prenorm_left"]


def prenorm_left(
    W_V: ArrayLike, scale_in: ArrayLike | None = None, *, centred: bool = False
) -> NDArray[np.float64]:
    """``C diag(s) W_V``: W_V's rows scaled by ``s``, then, when ``centred``, each column's mean
    removed (``C W = W − 𝟙 (𝟙ᵀ W)/d``).

    Parameters
    ----------
    W_V : (..., d, k) array_like
        Value weights in the row-vector convention ``y = x @ W`` (a leading axis for heads).
    scale_in : (d,) array_like, optional
        The pre-norm's γ (None: no scale).
    centred : bool
        A LayerNorm (True) or an RMSNorm or no norm (False).

    Returns
    -------
    (..., d, k) ndarray, float64
    """
    W = np.asarray(W_V, dtype=np.float64)
    scaled = W if scale_in is None else np.asarray(scale_in, dtype=np.float64)[:, None] * W
    return scaled - scaled.mean(axis=-2, keepdims=True) if centred else scaled
