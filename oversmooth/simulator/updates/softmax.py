"""Softmax attention recomputed from X at every layer: the full Transformer block.

Public API
----------
SoftmaxAttentionRule
    Multi-head softmax attention with optional Pre-/Post-LN and MLP, with or without residuals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.attention import LN_EPS, attention_matrix
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates.base import (
    RuleBase,
    apply_layer_norm,
    as_eps,
    as_feature_vector,
    as_matrix,
    broadcast_batch,
    set_frozen,
)
from oversmooth.simulator.updates.mlp import MLP, check_mlp, with_mlp
from oversmooth.simulator.validation import FloatArray

__all__ = ["SoftmaxAttentionRule"]


def _split_columns(W: FloatArray, n_heads: int) -> FloatArray:
    """``(..., d, h*k) -> (..., h, d, k)``: heads are contiguous column blocks."""
    *batch, d, cols = W.shape
    return np.moveaxis(W.reshape(*batch, d, n_heads, cols // n_heads), -2, -3)


def _split_rows(W: FloatArray, n_heads: int) -> FloatArray:
    """``(..., h*k, d) -> (..., h, k, d)``: heads are contiguous row blocks."""
    *batch, rows, d = W.shape
    return W.reshape(*batch, n_heads, rows // n_heads, d)


@dataclass(frozen=True, eq=False, repr=False, init=False)
class SoftmaxAttentionRule(RuleBase):
    """A Transformer block whose attention is recomputed from X at every layer.

    Attention sub-block, with ``Z = LN(X)`` for ``norm="pre"`` and ``Z = X`` otherwise::

        Attn(Z) = sum_h softmax(Z W_Q^h (Z W_K^h)^T / sqrt(d_head)) Z W_V^h W_proj^h

    where ``W_Q^h, W_K^h, W_V^h`` are the h-th contiguous column blocks (width ``cols / n_heads``)
    and ``W_proj^h`` the h-th contiguous row block (docs/theory.md §3.3). Then, exactly:

    - ``norm=None``:   ``Y = X + Attn(X)``;        with an MLP, ``X_l = Y + MLP(Y)``.
    - ``norm="pre"``:  ``Y = X + Attn(LN(X))``;    with an MLP, ``X_l = Y + MLP(LN(Y))``.
    - ``norm="post"``: ``Y = LN(X + Attn(X))``;    with an MLP, ``X_l = LN(Y + MLP(Y))``.

    Both LayerNorms of a block share ``gamma``, ``beta`` (one sign convention, as in Fig. 4).
    ``skip=False`` drops every residual term (``X +`` and ``Y +``), giving the pure
    self-attention path of Dong et al. (SAN, or SAN+MLP with an MLP).

    Parameters
    ----------
    W_Q, W_K : (..., d, n_heads * d_head) array_like
    W_V : (..., d, n_heads * d_v) array_like
    W_proj : (..., n_heads * d_v, d) array_like
    n_heads : int
    norm : {None, "pre", "post"}
    gamma, beta : (..., d) array_like, optional
    eps : float
    mlp : MLP, optional
    skip : bool
    """

    W_Q: FloatArray
    W_K: FloatArray
    W_V: FloatArray
    W_proj: FloatArray
    n_heads: int
    norm: Literal["pre", "post"] | None
    gamma: FloatArray
    beta: FloatArray
    eps: float
    mlp: MLP | None
    skip: bool
    #: The per-head blocks of W_Q, W_K, W_V (``(..., h, d, k)``) and of W_proj (``(..., h, k, d)``).
    _query_heads: FloatArray = field(repr=False)
    _key_heads: FloatArray = field(repr=False)
    _value_heads: FloatArray = field(repr=False)
    _proj_heads: FloatArray = field(repr=False)

    def __init__(
        self,
        W_Q: ArrayLike,
        W_K: ArrayLike,
        W_V: ArrayLike,
        W_proj: ArrayLike,
        n_heads: int = 1,
        norm: Literal["pre", "post"] | None = None,
        gamma: ArrayLike | None = None,
        beta: ArrayLike | None = None,
        eps: float = LN_EPS,
        mlp: MLP | None = None,
        skip: bool = True,
    ) -> None:
        if norm not in (None, "pre", "post"):
            raise InputError(f"`norm` must be one of None, 'pre', 'post'; got {norm!r}")
        if isinstance(n_heads, bool) or not isinstance(n_heads, int | np.integer):
            raise InputError(f"`n_heads` must be a positive integer; got {n_heads!r}")
        h = int(n_heads)
        if h <= 0:
            raise InputError(f"`n_heads` must be a positive integer; got {n_heads!r}")
        W_Q = as_matrix(W_Q, "W_Q", None, None)
        d, qk = W_Q.shape[-2:]
        W_K = as_matrix(W_K, "W_K", d, qk)
        W_V = as_matrix(W_V, "W_V", d, None)
        W_proj = as_matrix(W_proj, "W_proj", W_V.shape[-1], d)
        for name, cols in (("W_Q", qk), ("W_V", W_V.shape[-1])):
            if cols % h:
                raise InputError(
                    f"`{name}` must have a column count divisible by n_heads={h}; got {cols}"
                )
        gamma = as_feature_vector(gamma, "gamma", d, 1.0)
        beta = as_feature_vector(beta, "beta", d, 0.0)
        check_mlp(mlp, d)
        batch = broadcast_batch(
            {
                "W_Q": W_Q.shape[:-2],
                "W_K": W_K.shape[:-2],
                "W_V": W_V.shape[:-2],
                "W_proj": W_proj.shape[:-2],
                "gamma": gamma.shape[:-1],
                "beta": beta.shape[:-1],
            }
        )
        set_frozen(self, W_Q=W_Q, W_K=W_K, W_V=W_V, W_proj=W_proj, n_heads=h, norm=norm)
        set_frozen(self, gamma=gamma, beta=beta, eps=as_eps(eps), mlp=mlp, skip=skip)
        set_frozen(
            self,
            _query_heads=_split_columns(W_Q, h),
            _key_heads=_split_columns(W_K, h),
            _value_heads=_split_columns(W_V, h),
            _proj_heads=_split_rows(W_proj, h),
            _n=None,
            _d=int(d),
            _batch=batch,
        )

    @property
    def homogeneous(self) -> bool:
        """False: the softmax depends on the scale of X."""
        return False

    def _ln(self, X: FloatArray) -> FloatArray:
        return apply_layer_norm(X, self.gamma, self.beta, self.eps)

    def attention(self, Z: FloatArray) -> FloatArray:
        """Per-head attention matrices ``(..., n_heads, n, n)`` computed from ``Z``."""
        return attention_matrix(Z[..., None, :, :], self._query_heads, self._key_heads)

    def _attend(self, Z: FloatArray) -> FloatArray:
        values = Z[..., None, :, :] @ self._value_heads
        heads = (self.attention(Z) @ values) @ self._proj_heads
        return heads.sum(axis=-3)

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One block on ``(..., n, d)`` tokens."""
        residual = X if self.skip else 0.0
        if self.norm == "pre":
            Y = residual + self._attend(self._ln(X))
            if self.mlp is None:
                return Y
            return (Y if self.skip else 0.0) + self.mlp(self._ln(Y))
        Y = residual + self._attend(X)
        if self.norm == "post":
            Y = self._ln(Y)
        if self.mlp is None:
            return Y
        out = with_mlp(Y, self.mlp, self.skip)
        return self._ln(out) if self.norm == "post" else out
