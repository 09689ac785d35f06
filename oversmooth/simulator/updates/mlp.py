"""The feed-forward sub-block ``MLP(X) = act(X W_1 + 1 b_1^T) W_2 + 1 b_2^T`` a rule may append.

Public API
----------
MLP
    The sub-block, validated once when built.
check_mlp, with_mlp
    How a rule accepts an optional MLP and applies it after its attention sub-block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates.base import (
    ShortRepr,
    as_feature_vector,
    as_matrix,
    broadcast_batch,
    set_frozen,
)
from oversmooth.simulator.validation import FloatArray, check_choice

__all__ = ["MLP", "Activation", "check_mlp", "with_mlp"]

#: The activations an MLP may use.
Activation = Literal["gelu", "relu"]


def _gelu(Z: FloatArray) -> FloatArray:
    """Exact GELU ``0.5 z (1 + erf(z / sqrt 2))`` (ONNX ``Gelu``, approximate="none")."""
    from scipy.special import erf

    return 0.5 * Z * (1.0 + erf(Z / np.sqrt(2.0)))


def _relu(Z: FloatArray) -> FloatArray:
    return np.maximum(Z, 0.0)


_ACTIVATIONS: dict[str, Callable[[FloatArray], FloatArray]] = {"gelu": _gelu, "relu": _relu}


@dataclass(frozen=True, eq=False, repr=False, init=False)
class MLP(ShortRepr):
    """Feed-forward sub-block ``MLP(X) = act(X W_1 + 1 b_1^T) W_2 + 1 b_2^T``.

    Parameters
    ----------
    W_1 : (..., d, h) array_like
    b_1 : (..., h) array_like or None
        None means zeros.
    W_2 : (..., h, d) array_like
    b_2 : (..., d) array_like or None
    activation : {"gelu", "relu"}
        ``gelu`` is the exact (erf) form.

    Notes
    -----
    The residual connection and any normalisation around the MLP belong to the rule that uses it
    (see :class:`~oversmooth.simulator.updates.softmax.SoftmaxAttentionRule`).
    """

    W_1: FloatArray
    b_1: FloatArray
    W_2: FloatArray
    b_2: FloatArray
    activation: Activation

    def __init__(
        self,
        W_1: ArrayLike,
        b_1: ArrayLike | None,
        W_2: ArrayLike,
        b_2: ArrayLike | None,
        activation: Activation = "gelu",
    ) -> None:
        check_choice(activation, "activation", tuple(_ACTIVATIONS))
        W_1 = as_matrix(W_1, "W_1", None, None)
        d, h = W_1.shape[-2:]
        W_2 = as_matrix(W_2, "W_2", h, d)
        b_1 = as_feature_vector(b_1, "b_1", h, 0.0)
        b_2 = as_feature_vector(b_2, "b_2", d, 0.0)
        broadcast_batch(
            {
                "W_1": W_1.shape[:-2],
                "b_1": b_1.shape[:-1],
                "W_2": W_2.shape[:-2],
                "b_2": b_2.shape[:-1],
            }
        )
        set_frozen(self, W_1=W_1, b_1=b_1, W_2=W_2, b_2=b_2, activation=activation)

    @property
    def d(self) -> int:
        """Number of features the MLP reads and writes."""
        return int(self.W_1.shape[-2])

    @property
    def homogeneous(self) -> bool:
        """True for a bias-free ReLU MLP, the only positively homogeneous case."""
        return self.activation == "relu" and not np.any(self.b_1) and not np.any(self.b_2)

    def __call__(self, X: FloatArray) -> FloatArray:
        """Apply ``act(X W_1 + b_1) W_2 + b_2`` to ``(..., n, d)`` tokens."""
        hidden = _ACTIVATIONS[self.activation](X @ self.W_1 + self.b_1[..., None, :])
        return hidden @ self.W_2 + self.b_2[..., None, :]


def check_mlp(mlp: MLP | None, d: int) -> None:
    """Refuse anything but None or an :class:`MLP` acting on ``d`` features."""
    if mlp is None:
        return
    if not isinstance(mlp, MLP):
        raise InputError(f"`mlp` must be an MLP or None; got {type(mlp).__name__}")
    if mlp.d != d:
        raise InputError(f"`mlp` must act on {d} features to match the block; got {mlp.d}")


def with_mlp(Y: FloatArray, mlp: MLP | None, skip: bool) -> FloatArray:
    """``Y + MLP(Y)`` (or ``MLP(Y)`` without skip); ``Y`` when there is no MLP."""
    if mlp is None:
        return Y
    return Y + mlp(Y) if skip else mlp(Y)
