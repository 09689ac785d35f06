"""Mitigations of oversmoothing from related work, each on a fixed system (docs/theory.md §7).

Public API
----------
NeuTRENORule
    Nguyen et al. 2023: ``X + (A V_l + lam (V_0 - V_l)) W_proj``.
ValueResidualRule
    ResFormer (``w1 V_1 + w2 V_n``) and SVFormer (``V_n := V_1``), Zhou et al. 2024.
SimilarityRemovalRule
    Yu & Zhang 2023: ``X + (I - tau 11^T/n) A X W_V W_proj``.
AttnScaleRule
    Wang et al. 2022: ``A -> 11^T/n + (1 + omega)(A - 11^T/n)``.
FeatScaleRule
    Wang et al. 2022: ``X + Y + s_d * DC[Y] + s_h * HC[Y]`` with ``Y = A X W_V W_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, SupportsFloat

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.updates.base import SCALED, as_feature_vector, set_frozen
from oversmooth.simulator.updates.linear import FixedAttentionRule
from oversmooth.simulator.validation import FloatArray, as_float_array, check_choice

__all__ = [
    "AttnScaleRule",
    "FeatScaleRule",
    "NeuTRENORule",
    "SimilarityRemovalRule",
    "ValueResidualRule",
]


def _scalar(value: SupportsFloat, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"`{name}` must be a real number; got {value!r}") from None
    if not np.isfinite(number):
        raise InputError(f"`{name}` must be finite; got {number!r}")
    return number


def _at_least(values: float | FloatArray, name: str, low: float, why: str) -> None:
    """Refuse parameters outside the method's domain (``why`` says what leaving it would mean)."""
    if np.any(np.asarray(values) < low):
        raise InputError(f"`{name}` must be at least {low:g} ({why}); got {values!r}")


def _per_system(value: ArrayLike, name: str) -> FloatArray:
    """A scalar or one value per system (batch shape), ready to broadcast over ``(n, n)``."""
    return as_float_array(value, name)[..., None, None]


def _token_mean(Y: FloatArray) -> FloatArray:
    """``LFC[Y] = (1/n) 1 1^T Y`` as a ``(..., 1, d)`` row, which broadcasts over the tokens."""
    return Y.mean(axis=-2, keepdims=True)


def _first_values(cache: dict[str, Any], layer: int, key: str, values: FloatArray) -> FloatArray:
    """The first layer's values, stored in ``cache["scaled"][key]`` at layer 0 (or first use)."""
    scaled = cache.setdefault(SCALED, {})
    if layer == 0 or key not in scaled:
        scaled[key] = values
    return scaled[key]


@dataclass(frozen=True, eq=False, repr=False, init=False)
class NeuTRENORule(FixedAttentionRule):
    """NeuTRENO (Nguyen, Nguyen & Baraniuk 2023) with fixed A (docs/theory.md §7.3, claim 27).

    With values ``V_l = X_{l-1} W_V`` and the first layer's ``V_0 = X_0 W_V`` (kept in the cache)::

        X_l = X_{l-1} + (A V_l + lam (V_0 - V_l)) W_proj

    At layer 0 the correction vanishes and the layer is the standard ``X + A X W_V W_proj``.

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    lam : float
        0.6 in the DeiT code, 0.4 for WikiText-103; must be non-negative (a correction towards
        V_0; a negative lam would push away from it).
    """

    lam: float

    def __init__(self, A: ArrayLike, W_V: ArrayLike, W_proj: ArrayLike, lam: float = 0.6) -> None:
        super().__init__(A, W_V, W_proj)
        lam = _scalar(lam, "lam")
        _at_least(
            lam, "lam", 0.0, "NeuTRENO pulls the values towards V_0; a negative lam pushes away"
        )
        set_frozen(self, lam=lam)

    @property
    def homogeneous(self) -> bool:
        """True: linear in (X, V_0) jointly."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        V = X @ self.W_V
        V0 = _first_values(cache, layer, "neutreno_v0", V)
        return X + (self.A @ V + self.lam * (V0 - V)) @ self.W_proj


@dataclass(frozen=True, eq=False, repr=False, init=False)
class ValueResidualRule(FixedAttentionRule):
    """ResFormer and SVFormer value residuals (Zhou et al. 2024) with fixed A (claim 28).

    Layer 0 computes and caches ``V_1 = X_0 W_V`` and is the standard layer. For layer ``n >= 1``
    with ``V_n = X_{n-1} W_V``::

        resformer:  X_n = X_{n-1} + A (w_1 V_1 + w_2 V_n) W_proj
        svformer:   X_n = X_{n-1} + A V_1 W_proj            (V_n := V_1; no new values)

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    mode : {"resformer", "svformer"}
    weights : (float, float)
        ``(w_1, w_2)``, the weights of V_1 and V_n (ResFormer's official code: 0.5, 0.5).
    """

    mode: Literal["resformer", "svformer"]
    weights: tuple[float, float]

    def __init__(
        self,
        A: ArrayLike,
        W_V: ArrayLike,
        W_proj: ArrayLike,
        mode: Literal["resformer", "svformer"] = "resformer",
        weights: tuple[float, float] | list[float] = (0.5, 0.5),
    ) -> None:
        super().__init__(A, W_V, W_proj)
        check_choice(mode, "mode", ("resformer", "svformer"))
        if not isinstance(weights, tuple | list) or len(weights) != 2:
            raise InputError(f"`weights` must be a pair (w_1, w_2); got {weights!r}")
        pair = (_scalar(weights[0], "weights[0]"), _scalar(weights[1], "weights[1]"))
        set_frozen(self, mode=mode, weights=pair)

    @property
    def homogeneous(self) -> bool:
        """True: linear in (X, V_1) jointly."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        scaled = cache.setdefault(SCALED, {})
        key = "value_residual_v1"
        if layer == 0 or key not in scaled:
            V = scaled[key] = X @ self.W_V
        elif self.mode == "svformer":
            V = scaled[key]
        else:
            w_1, w_2 = self.weights
            V = w_1 * scaled[key] + w_2 * (X @ self.W_V)
        return X + (self.A @ V) @ self.W_proj


@dataclass(frozen=True, eq=False, repr=False, init=False)
class SimilarityRemovalRule(FixedAttentionRule):
    """Yu & Zhang (2023) similarity removal on the attention branch (claim 29).

    ``X_l = X_{l-1} + (I - tau 11^T/n) A X_{l-1} W_V W_proj``: tau times the token mean is removed
    from the branch output before the residual add. The paper's placement is not recovered; this
    is the reconstruction of docs/theory.md §7.5 without the post-norm.

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    tau : float
        1 removes the whole low-frequency component of the branch; any real value is accepted
        (outside [0, 1] the mean is over- or under-removed, as the claim 29 check exercises).
    """

    tau: float

    def __init__(self, A: ArrayLike, W_V: ArrayLike, W_proj: ArrayLike, tau: float = 1.0) -> None:
        super().__init__(A, W_V, W_proj)
        # Any real tau is kept: the algebra (LFC scales by 1 - tau, HFC unchanged; claim 29) holds
        # for all of them, and tau outside [0, 1] over- or under-removes the mean on purpose.
        set_frozen(self, tau=_scalar(tau, "tau"))

    @property
    def homogeneous(self) -> bool:
        """True: linear."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        Y = self._branch(X)
        return X + Y - self.tau * _token_mean(Y)


@dataclass(frozen=True, eq=False, repr=False, init=False)
class AttnScaleRule(FixedAttentionRule):
    """AttnScale (Wang et al. 2022): the high-pass part of A rescaled (docs/theory.md §7.2, claim 25).

    ``Â = 11^T/n + (1 + omega)(A - 11^T/n)`` replaces A in ``X + Â X W_V W_proj``. ``Â 1 = 1``;
    ``omega = 0`` gives A back. The matrix ``Â`` is kept as attribute ``A_hat``.

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    omega : float or (...) array_like
        One value, or one per system (broadcast against the batch axes); at least -1, so that the
        high-pass part keeps its sign (-1 gives the uniform matrix 11^T/n).
    """

    omega: FloatArray
    A_hat: FloatArray = field(repr=False)

    def __init__(self, A: ArrayLike, W_V: ArrayLike, W_proj: ArrayLike, omega: ArrayLike) -> None:
        super().__init__(A, W_V, W_proj)
        scale = _per_system(omega, "omega")
        _at_least(scale, "omega", -1.0, "below -1 the high-pass part of A changes sign")
        low = 1.0 / self.A.shape[-1]
        A_hat = low + (1.0 + scale) * (self.A - low)
        set_frozen(self, omega=scale[..., 0, 0], A_hat=A_hat)
        self._extend_batch(omega=self.omega.shape)

    @property
    def homogeneous(self) -> bool:
        """True: linear."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        return X + (self.A_hat @ X) @ self.M


@dataclass(frozen=True, eq=False, repr=False, init=False)
class FeatScaleRule(FixedAttentionRule):
    """FeatScale (Wang et al. 2022) on the attention branch (docs/theory.md §7.2, claim 26).

    With ``Y = A X W_V W_proj``, ``DC[Y] = 11^T Y / n`` and ``HC[Y] = Y - DC[Y]``::

        paper form:     X_l = X + Y + s_d ⊙ DC[Y] + s_h ⊙ HC[Y]
        code_faithful:  X_l = X + Y + 2 s_d ⊙ DC[Y] + 2 s_h ⊙ HC[Y]

    ``⊙`` scales each feature (column). The official code adds the scaled parts twice (its issue #9).

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    s_d, s_h : (..., d) array_like or float
        Channel scales of the DC and high-frequency parts (0 in the official initialisation).
    code_faithful : bool
    """

    s_d: FloatArray
    s_h: FloatArray
    code_faithful: bool

    def __init__(
        self,
        A: ArrayLike,
        W_V: ArrayLike,
        W_proj: ArrayLike,
        s_d: ArrayLike,
        s_h: ArrayLike,
        code_faithful: bool = False,
    ) -> None:
        super().__init__(A, W_V, W_proj)
        s_d = as_feature_vector(s_d, "s_d", self._d, 0.0)
        s_h = as_feature_vector(s_h, "s_h", self._d, 0.0)
        set_frozen(self, s_d=s_d, s_h=s_h, code_faithful=code_faithful)
        self._extend_batch(s_d=s_d.shape[:-1], s_h=s_h.shape[:-1])

    @property
    def homogeneous(self) -> bool:
        """True: linear."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        factor = 2.0 if self.code_faithful else 1.0
        Y = self._branch(X)
        dc = _token_mean(Y)
        hc = Y - dc
        return X + Y + factor * (self.s_d[..., None, :] * dc + self.s_h[..., None, :] * hc)
