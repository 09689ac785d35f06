"""Rules with a fixed attention matrix A: the linear layer and its Pre-LN and Post-LN variants.

Public API
----------
FixedAttentionRule
    Base of every rule on a fixed system ``(A, W_V, W_proj)``: validation, ``M``, ``H``.
LinearRule
    ``X + A X W_V W_proj`` (eq. vec_update); without skip ``A X W_V W_proj`` (S7).
PreLNRule
    ``X + A LN(X) W_V W_proj``.
PostLNRule
    ``LN(X + A X W_V W_proj)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.attention import LN_EPS
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
from oversmooth.simulator.validation import FloatArray, as_row_stochastic

__all__ = ["FixedAttentionRule", "LinearRule", "PostLNRule", "PreLNRule"]


@dataclass(frozen=True, eq=False, repr=False, init=False)
class FixedAttentionRule(RuleBase):
    """Base of the rules with a fixed row-stochastic A and value-projection ``M = W_V W_proj``."""

    A: FloatArray
    W_V: FloatArray
    W_proj: FloatArray
    M: FloatArray = field(repr=False)

    def __init__(self, A: ArrayLike, W_V: ArrayLike, W_proj: ArrayLike) -> None:
        A = as_row_stochastic(A, "A")
        W_V = as_matrix(W_V, "W_V", None, None)
        d, d_v = W_V.shape[-2:]
        W_proj = as_matrix(W_proj, "W_proj", d_v, d)
        batch = broadcast_batch(
            {"A": A.shape[:-2], "W_V": W_V.shape[:-2], "W_proj": W_proj.shape[:-2]}
        )
        set_frozen(self, A=A, W_V=W_V, W_proj=W_proj, M=W_V @ W_proj)
        set_frozen(self, _n=int(A.shape[-1]), _d=int(d), _batch=batch)

    def _extend_batch(self, **shapes: tuple[int, ...]) -> None:
        """Broadcast the batch shape with those of a subclass's own arrays."""
        set_frozen(self, _batch=broadcast_batch({"the system": self._batch, **shapes}))

    @property
    def H(self) -> FloatArray:
        """``H = (W_V W_proj)^T``, the factor in ``I + H ⊗ A`` (docs/theory.md §1)."""
        return np.swapaxes(self.M, -1, -2)

    def _branch(self, X: FloatArray) -> FloatArray:
        """The attention branch ``A X W_V W_proj`` (two matrix products)."""
        return (self.A @ X) @ self.M


@dataclass(frozen=True, eq=False, repr=False, init=False)
class LinearRule(FixedAttentionRule):
    """Linear attention layer with fixed A (paper eq. vec_update, S7 without skip).

    ``X_l = X_{l-1} + A X_{l-1} W_V W_proj``, i.e. ``vec(X_l) = (I + H ⊗ A) vec(X_{l-1})``;
    with ``skip=False``, ``X_l = A X_{l-1} W_V W_proj`` (Wang et al.'s low-pass setting, S7).

    Parameters
    ----------
    A : (..., n, n) array_like
        Row-stochastic attention, the same at every layer.
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    skip : bool
        Keep the residual connection(s).
    mlp : MLP, optional
        Appended as ``Y + MLP(Y)`` (``MLP(Y)`` without skip) after the attention sub-block.
    """

    skip: bool
    mlp: MLP | None

    def __init__(
        self,
        A: ArrayLike,
        W_V: ArrayLike,
        W_proj: ArrayLike,
        skip: bool = True,
        mlp: MLP | None = None,
    ) -> None:
        super().__init__(A, W_V, W_proj)
        check_mlp(mlp, self._d)
        set_frozen(self, skip=skip, mlp=mlp)

    @property
    def homogeneous(self) -> bool:
        """True unless an MLP with biases or GELU is attached."""
        return self.mlp is None or self.mlp.homogeneous

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        Y = self._branch(X)
        if self.skip:
            Y += X
        return with_mlp(Y, self.mlp, self.skip)


@dataclass(frozen=True, eq=False, repr=False, init=False)
class _NormalisedLinear(FixedAttentionRule):
    """Base of Pre-LN and Post-LN: LayerNorm parameters on top of a fixed linear system."""

    gamma: FloatArray
    beta: FloatArray
    eps: float

    def __init__(
        self,
        A: ArrayLike,
        W_V: ArrayLike,
        W_proj: ArrayLike,
        gamma: ArrayLike | None = None,
        beta: ArrayLike | None = None,
        eps: float = LN_EPS,
    ) -> None:
        super().__init__(A, W_V, W_proj)
        gamma = as_feature_vector(gamma, "gamma", self._d, 1.0)
        beta = as_feature_vector(beta, "beta", self._d, 0.0)
        set_frozen(self, gamma=gamma, beta=beta, eps=as_eps(eps))
        self._extend_batch(gamma=gamma.shape[:-1], beta=beta.shape[:-1])

    @property
    def homogeneous(self) -> bool:
        """False: LayerNorm removes the scale of its input."""
        return False

    def _ln(self, X: FloatArray) -> FloatArray:
        return apply_layer_norm(X, self.gamma, self.beta, self.eps)


@dataclass(frozen=True, eq=False, repr=False, init=False)
class PreLNRule(_NormalisedLinear):
    """Pre-LN linear layer ``X_l = X_{l-1} + A LN(X_{l-1}) W_V W_proj`` (docs/theory.md §4).

    ``LN(X) = N(X) diag(gamma) + 1 beta^T`` with ONNX semantics (biased variance, eps inside the
    square root); ``gamma`` may have either sign, and the effective value-projection product is
    ``diag(gamma) W_V W_proj`` (claim 21).

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    gamma, beta : (..., d) array_like, optional
        Default ones and zeros; a scalar means that value for every feature.
    eps : float
    """

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        return X + self._branch(self._ln(X))


@dataclass(frozen=True, eq=False, repr=False, init=False)
class PostLNRule(_NormalisedLinear):
    """Post-LN linear layer ``X_l = LN(X_{l-1} + A X_{l-1} W_V W_proj)`` (docs/theory.md §4).

    With ``beta = 0`` and a uniform ``gamma = ±c``, flipping the sign of gamma flips the sign of
    every ``X_l`` for l >= 1 exactly (claim 22): N is odd and the linear update commutes with sign.

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    gamma, beta : (..., d) array_like, optional
    eps : float
    """

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        Y = self._branch(X)
        Y += X
        return self._ln(Y)
