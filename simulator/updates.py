"""Update rules: one Transformer layer ``X_{l-1} -> X_l`` on batched tokens ``(..., n, d)``.

Every rule is a frozen dataclass, validated once when built, and called as
``rule(X, layer, cache) -> X_next`` where ``layer`` is the 0-based index of the block being applied
(``X_{layer} -> X_{layer+1}``) and ``cache`` is a dict private to one trajectory (NeuTRENO and
ResFormer keep the first layer's values there). ``__call__`` does no validation, because it runs at
every layer; :meth:`check_tokens` validates an input once (``simulator.dynamics.iterate`` calls it).

A rule's own matrices may carry leading batch axes, which broadcast against those of ``X``: a
``(64, n, n)`` stack of attention matrices with a ``(64, n, d)`` stack of inputs runs 64 systems.

``homogeneous`` is True iff ``rule(c X) = c rule(X)`` for every ``c > 0`` (with any arrays kept in
``cache["scaled"]`` scaled by the same c); the iterator may then renormalise X after every layer.

Cache protocol
--------------
``cache["scaled"]`` is a dict of arrays that are homogeneous of degree one in X (for example the
first layer's values ``V_0 = X_0 W_V``). Whoever rescales the state X by a factor must rescale these
arrays by the same factor, so that the rule stays homogeneous jointly in (X, cache).

Rules (docs/theory.md §3, §4, §7)
-----------------------------
LinearRule             -- X + A X W_V W_proj (eq. vec_update); without skip A X W_V W_proj (S7)
PreLNRule              -- X + A LN(X) W_V W_proj
PostLNRule             -- LN(X + A X W_V W_proj)
SoftmaxAttentionRule   -- multi-head softmax attention recomputed from X, optional LN and MLP
MLP                    -- act(X W_1 + b_1) W_2 + b_2, the optional feed-forward sub-block
NeuTRENORule           -- Nguyen et al. 2023: (A V_l + lam (V_0 - V_l)) W_proj on the residual
ValueResidualRule      -- ResFormer (w1 V_1 + w2 V_n) and SVFormer (V_n := V_1), Zhou et al. 2024
SimilarityRemovalRule  -- Yu & Zhang 2023: X + (I - tau 11^T/n) A X W_V W_proj
AttnScaleRule          -- Wang et al. 2022: A -> 11^T/n + (1 + omega)(A - 11^T/n)
FeatScaleRule          -- Wang et al. 2022: X + Y + s_d * DC[Y] + s_h * HC[Y], Y = A X W_V W_proj
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from simulator.attention import LN_EPS, attention_matrix, layer_norm
from simulator.errors import InputError
from simulator.validation import (
    FloatArray,
    as_float_array,
    as_row_stochastic,
    as_tokens,
    check_choice,
)

__all__ = [
    "MLP",
    "RULES",
    "RULE_OPTIONS",
    "SCALED",
    "SYSTEM_RULES",
    "AttnScaleRule",
    "FeatScaleRule",
    "LinearRule",
    "NeuTRENORule",
    "PostLNRule",
    "PreLNRule",
    "SimilarityRemovalRule",
    "SoftmaxAttentionRule",
    "ValueResidualRule",
    "rule_from_system",
]

#: Key of the cache dict holding arrays that scale with X (see the module docstring).
SCALED = "scaled"


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------


def _broadcast_batch(shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Broadcast the leading (batch) shapes of several arrays, naming them on failure."""
    try:
        return np.broadcast_shapes(*shapes.values())
    except ValueError:
        listed = ", ".join(f"`{name}` {shape}" for name, shape in shapes.items())
        raise InputError(f"the leading batch axes must broadcast together; got {listed}") from None


def _matrix(value: ArrayLike, name: str, rows: int | None, cols: int | None) -> FloatArray:
    """A finite float64 array ``(..., rows, cols)``; None leaves that size free."""
    array = as_float_array(value, name, min_ndim=2)
    expected = (rows, cols)
    if any(
        want is not None and got != want
        for want, got in zip(expected, array.shape[-2:], strict=True)
    ):
        wanted = ", ".join("k" if size is None else str(size) for size in expected)
        raise InputError(f"`{name}` must have shape (..., {wanted}); got {array.shape}")
    return array


def _vector(value: ArrayLike | None, name: str, d: int, default: float) -> FloatArray:
    """A per-feature vector ``(..., d)`` (a scalar broadcasts); ``default`` when None."""
    if value is None:
        return np.full(d, default)
    array = as_float_array(value, name)
    if array.ndim == 0:
        return np.full(d, float(array))
    if array.shape[-1] != d:
        raise InputError(
            f"`{name}` must have shape (..., {d}) (one per feature); got {array.shape}"
        )
    return array


def _check_eps(eps: float) -> float:
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not eps > 0:
        raise InputError(f"`eps` must be a positive number; got {eps!r}")
    return float(eps)


def _scalar(value: object, name: str) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"`{name}` must be a real number; got {value!r}") from None
    if not np.isfinite(number):
        raise InputError(f"`{name}` must be finite; got {number!r}")
    return number


def _per_system(value: ArrayLike, name: str) -> FloatArray:
    """A scalar or one value per system (batch shape), ready to broadcast over ``(n, n)``."""
    return as_float_array(value, name)[..., None, None]


def _token_mean(Y: FloatArray) -> FloatArray:
    """``LFC[Y] = (1/n) 1 1^T Y`` as a ``(..., 1, d)`` row, which broadcasts over the tokens."""
    return Y.mean(axis=-2, keepdims=True)


def _apply_layer_norm(X: FloatArray, gamma: FloatArray, beta: FloatArray, eps: float) -> FloatArray:
    """``LN(X) = N(X) diag(gamma) + 1 beta^T`` with N from :func:`simulator.attention.layer_norm`.

    ``gamma`` and ``beta`` may carry batch axes ``(..., d)``, so they are applied here.
    """
    return layer_norm(X, eps=eps) * gamma[..., None, :] + beta[..., None, :]


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return f"array{value.shape}"
    if isinstance(value, np.ndarray):
        return repr(float(value))
    return repr(value)


class _Repr:
    """A short ``repr``: arrays appear as their shapes."""

    def __repr__(self) -> str:
        shown = (f"{f.name}={_describe(getattr(self, f.name))}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}({', '.join(shown)})"


class _Rule(_Repr):
    """Shared input check: X must match the rule's token and feature sizes and batch axes."""

    #: Number of tokens the rule's fixed matrices require (None: any).
    _n: int | None
    #: Number of features.
    _d: int
    #: Broadcast batch shape of the rule's own arrays.
    _batch: tuple[int, ...]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading batch axes of the rule's own arrays (``()`` for one system)."""
        return self._batch

    def check_tokens(self, X: ArrayLike, name: str = "X") -> FloatArray:
        """Validate a token matrix (or batch) for this rule and return it as float64.

        Parameters
        ----------
        X : (..., n, d) array_like
        name : str
            Argument name used in error messages.

        Returns
        -------
        (..., n, d) ndarray
        """
        X = as_tokens(X, name)
        n, d = X.shape[-2:]
        if self._n is not None and n != self._n:
            raise InputError(f"`{name}` must have {self._n} tokens (rows) to match `A`; got {n}")
        if d != self._d:
            raise InputError(
                f"`{name}` must have {self._d} features (columns) to match `W_V`; got {d}"
            )
        _broadcast_batch({name: X.shape[:-2], "the rule's matrices": self._batch})
        return X


# ----------------------------------------------------------------------------------------------
# the MLP sub-block
# ----------------------------------------------------------------------------------------------


def _gelu(Z: FloatArray) -> FloatArray:
    """Exact GELU ``0.5 z (1 + erf(z / sqrt 2))`` (ONNX ``Gelu``, approximate="none")."""
    from scipy.special import erf

    return 0.5 * Z * (1.0 + erf(Z / np.sqrt(2.0)))


def _relu(Z: FloatArray) -> FloatArray:
    return np.maximum(Z, 0.0)


_ACTIVATIONS = {"gelu": _gelu, "relu": _relu}


@dataclass(frozen=True, eq=False, repr=False)
class MLP(_Repr):
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
    (see :class:`SoftmaxAttentionRule`).
    """

    W_1: ArrayLike
    b_1: ArrayLike | None
    W_2: ArrayLike
    b_2: ArrayLike | None
    activation: Literal["gelu", "relu"] = "gelu"

    def __post_init__(self) -> None:
        check_choice(self.activation, "activation", tuple(_ACTIVATIONS))
        W_1 = _matrix(self.W_1, "W_1", None, None)
        d, h = W_1.shape[-2:]
        W_2 = _matrix(self.W_2, "W_2", h, d)
        object.__setattr__(self, "W_1", W_1)
        object.__setattr__(self, "W_2", W_2)
        object.__setattr__(self, "b_1", _vector(self.b_1, "b_1", h, 0.0))
        object.__setattr__(self, "b_2", _vector(self.b_2, "b_2", d, 0.0))
        _broadcast_batch(
            {
                "W_1": W_1.shape[:-2],
                "b_1": self.b_1.shape[:-1],
                "W_2": W_2.shape[:-2],
                "b_2": self.b_2.shape[:-1],
            }
        )

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


def _check_mlp(mlp: MLP | None, d: int) -> None:
    if mlp is None:
        return
    if not isinstance(mlp, MLP):
        raise InputError(f"`mlp` must be an MLP or None; got {type(mlp).__name__}")
    if mlp.d != d:
        raise InputError(f"`mlp` must act on {d} features to match the block; got {mlp.d}")


def _with_mlp(Y: FloatArray, mlp: MLP | None, skip: bool) -> FloatArray:
    """``Y + MLP(Y)`` (or ``MLP(Y)`` without skip); ``Y`` when there is no MLP."""
    if mlp is None:
        return Y
    return Y + mlp(Y) if skip else mlp(Y)


# ----------------------------------------------------------------------------------------------
# fixed-attention rules
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class _FixedAttention(_Rule):
    """Base of the rules with a fixed row-stochastic A and value-projection ``M = W_V W_proj``."""

    A: ArrayLike
    W_V: ArrayLike
    W_proj: ArrayLike
    M: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        A = as_row_stochastic(self.A, "A")
        W_V = _matrix(self.W_V, "W_V", None, None)
        d, d_v = W_V.shape[-2:]
        W_proj = _matrix(self.W_proj, "W_proj", d_v, d)
        batch = _broadcast_batch(
            {"A": A.shape[:-2], "W_V": W_V.shape[:-2], "W_proj": W_proj.shape[:-2]}
        )
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "W_V", W_V)
        object.__setattr__(self, "W_proj", W_proj)
        object.__setattr__(self, "M", W_V @ W_proj)
        object.__setattr__(self, "_n", int(A.shape[-1]))
        object.__setattr__(self, "_d", int(d))
        object.__setattr__(self, "_batch", batch)

    def _extend_batch(self, **arrays: FloatArray) -> None:
        shapes = {"the system": self._batch, **arrays}
        object.__setattr__(self, "_batch", _broadcast_batch(shapes))

    @property
    def H(self) -> FloatArray:
        """``H = (W_V W_proj)^T``, the factor in ``I + H ⊗ A`` (docs/theory.md §1)."""
        return np.swapaxes(self.M, -1, -2)

    def _branch(self, X: FloatArray) -> FloatArray:
        """The attention branch ``A X W_V W_proj`` (two matrix products)."""
        return (self.A @ X) @ self.M


@dataclass(frozen=True, eq=False, repr=False)
class LinearRule(_FixedAttention):
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

    skip: bool = True
    mlp: MLP | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_mlp(self.mlp, self._d)

    @property
    def homogeneous(self) -> bool:
        """True unless an MLP with biases or GELU is attached."""
        return self.mlp is None or self.mlp.homogeneous

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        Y = self._branch(X)
        if self.skip:
            Y += X
        return _with_mlp(Y, self.mlp, self.skip)


@dataclass(frozen=True, eq=False, repr=False)
class _NormalisedLinear(_FixedAttention):
    """Base of Pre-LN and Post-LN: LayerNorm parameters on top of a fixed linear system."""

    gamma: ArrayLike | None = None
    beta: ArrayLike | None = None
    eps: float = LN_EPS

    def __post_init__(self) -> None:
        super().__post_init__()
        gamma = _vector(self.gamma, "gamma", self._d, 1.0)
        beta = _vector(self.beta, "beta", self._d, 0.0)
        object.__setattr__(self, "gamma", gamma)
        object.__setattr__(self, "beta", beta)
        object.__setattr__(self, "eps", _check_eps(self.eps))
        self._extend_batch(gamma=gamma.shape[:-1], beta=beta.shape[:-1])

    @property
    def homogeneous(self) -> bool:
        """False: LayerNorm removes the scale of its input."""
        return False

    def _ln(self, X: FloatArray) -> FloatArray:
        return _apply_layer_norm(X, self.gamma, self.beta, self.eps)


@dataclass(frozen=True, eq=False, repr=False)
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


@dataclass(frozen=True, eq=False, repr=False)
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


# ----------------------------------------------------------------------------------------------
# softmax attention recomputed from X
# ----------------------------------------------------------------------------------------------


def _split_columns(W: FloatArray, n_heads: int) -> FloatArray:
    """``(..., d, h*k) -> (..., h, d, k)``: heads are contiguous column blocks."""
    *batch, d, cols = W.shape
    return np.moveaxis(W.reshape(*batch, d, n_heads, cols // n_heads), -2, -3)


def _split_rows(W: FloatArray, n_heads: int) -> FloatArray:
    """``(..., h*k, d) -> (..., h, k, d)``: heads are contiguous row blocks."""
    *batch, rows, d = W.shape
    return W.reshape(*batch, n_heads, rows // n_heads, d)


@dataclass(frozen=True, eq=False, repr=False)
class SoftmaxAttentionRule(_Rule):
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

    W_Q: ArrayLike
    W_K: ArrayLike
    W_V: ArrayLike
    W_proj: ArrayLike
    n_heads: int = 1
    norm: Literal["pre", "post"] | None = None
    gamma: ArrayLike | None = None
    beta: ArrayLike | None = None
    eps: float = LN_EPS
    mlp: MLP | None = None
    skip: bool = True

    def __post_init__(self) -> None:
        if self.norm not in (None, "pre", "post"):
            raise InputError(f"`norm` must be one of None, 'pre', 'post'; got {self.norm!r}")
        if isinstance(self.n_heads, bool) or not isinstance(self.n_heads, int | np.integer):
            raise InputError(f"`n_heads` must be a positive integer; got {self.n_heads!r}")
        h = int(self.n_heads)
        if h <= 0:
            raise InputError(f"`n_heads` must be a positive integer; got {self.n_heads!r}")
        W_Q = _matrix(self.W_Q, "W_Q", None, None)
        d, qk = W_Q.shape[-2:]
        W_K = _matrix(self.W_K, "W_K", d, qk)
        W_V = _matrix(self.W_V, "W_V", d, None)
        W_proj = _matrix(self.W_proj, "W_proj", W_V.shape[-1], d)
        for name, cols in (("W_Q", qk), ("W_V", W_V.shape[-1])):
            if cols % h:
                raise InputError(
                    f"`{name}` must have a column count divisible by n_heads={h}; got {cols}"
                )
        gamma = _vector(self.gamma, "gamma", d, 1.0)
        beta = _vector(self.beta, "beta", d, 0.0)
        _check_mlp(self.mlp, d)
        batch = _broadcast_batch(
            {
                "W_Q": W_Q.shape[:-2],
                "W_K": W_K.shape[:-2],
                "W_V": W_V.shape[:-2],
                "W_proj": W_proj.shape[:-2],
                "gamma": gamma.shape[:-1],
                "beta": beta.shape[:-1],
            }
        )
        values: dict[str, Any] = {
            "W_Q": W_Q,
            "W_K": W_K,
            "W_V": W_V,
            "W_proj": W_proj,
            "n_heads": h,
            "gamma": gamma,
            "beta": beta,
            "eps": _check_eps(self.eps),
            "_query_heads": _split_columns(W_Q, h),
            "_key_heads": _split_columns(W_K, h),
            "_value_heads": _split_columns(W_V, h),
            "_proj_heads": _split_rows(W_proj, h),
            "_n": None,
            "_d": int(d),
            "_batch": batch,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def homogeneous(self) -> bool:
        """False: the softmax depends on the scale of X."""
        return False

    def _ln(self, X: FloatArray) -> FloatArray:
        return _apply_layer_norm(X, self.gamma, self.beta, self.eps)

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
        out = _with_mlp(Y, self.mlp, self.skip)
        return self._ln(out) if self.norm == "post" else out


# ----------------------------------------------------------------------------------------------
# mitigations (docs/theory.md §7)
# ----------------------------------------------------------------------------------------------


def _first_values(cache: dict[str, Any], layer: int, key: str, values: FloatArray) -> FloatArray:
    """The first layer's values, stored in ``cache["scaled"][key]`` at layer 0 (or first use)."""
    scaled = cache.setdefault(SCALED, {})
    if layer == 0 or key not in scaled:
        scaled[key] = values
    return scaled[key]


@dataclass(frozen=True, eq=False, repr=False)
class NeuTRENORule(_FixedAttention):
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
        0.6 in the DeiT code, 0.4 for WikiText-103.
    """

    lam: float = 0.6

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "lam", _scalar(self.lam, "lam"))

    @property
    def homogeneous(self) -> bool:
        """True: linear in (X, V_0) jointly."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        V = X @ self.W_V
        V0 = _first_values(cache, layer, "neutreno_v0", V)
        return X + (self.A @ V + self.lam * (V0 - V)) @ self.W_proj


@dataclass(frozen=True, eq=False, repr=False)
class ValueResidualRule(_FixedAttention):
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

    mode: Literal["resformer", "svformer"] = "resformer"
    weights: tuple[float, float] = (0.5, 0.5)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.mode, "mode", ("resformer", "svformer"))
        if not isinstance(self.weights, tuple | list) or len(self.weights) != 2:
            raise InputError(f"`weights` must be a pair (w_1, w_2); got {self.weights!r}")
        pair = (_scalar(self.weights[0], "weights[0]"), _scalar(self.weights[1], "weights[1]"))
        object.__setattr__(self, "weights", pair)

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


@dataclass(frozen=True, eq=False, repr=False)
class SimilarityRemovalRule(_FixedAttention):
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
        1 removes the whole low-frequency component of the branch.
    """

    tau: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "tau", _scalar(self.tau, "tau"))

    @property
    def homogeneous(self) -> bool:
        """True: linear."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        Y = self._branch(X)
        return X + Y - self.tau * _token_mean(Y)


@dataclass(frozen=True, eq=False, repr=False)
class AttnScaleRule(_FixedAttention):
    """AttnScale (Wang et al. 2022): the high-pass part of A rescaled (docs/theory.md §7.2, claim 25).

    ``Â = 11^T/n + (1 + omega)(A - 11^T/n)`` replaces A in ``X + Â X W_V W_proj``. ``Â 1 = 1``;
    ``omega = 0`` gives A back. The matrix ``Â`` is kept as attribute ``A_hat``.

    Parameters
    ----------
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    omega : float or (...) array_like
        One value, or one per system (broadcast against the batch axes).
    """

    omega: ArrayLike
    A_hat: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        omega = _per_system(self.omega, "omega")
        low = 1.0 / self._n
        A_hat = low + (1.0 + omega) * (self.A - low)
        object.__setattr__(self, "omega", omega[..., 0, 0])
        object.__setattr__(self, "A_hat", A_hat)
        self._extend_batch(omega=self.omega.shape)

    @property
    def homogeneous(self) -> bool:
        """True: linear."""
        return True

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""
        return X + (self.A_hat @ X) @ self.M


@dataclass(frozen=True, eq=False, repr=False)
class FeatScaleRule(_FixedAttention):
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

    s_d: ArrayLike
    s_h: ArrayLike
    code_faithful: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        s_d = _vector(self.s_d, "s_d", self._d, 0.0)
        s_h = _vector(self.s_h, "s_h", self._d, 0.0)
        object.__setattr__(self, "s_d", s_d)
        object.__setattr__(self, "s_h", s_h)
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


# ----------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------

#: Every rule class by name.
RULES: dict[str, type] = {
    "linear": LinearRule,
    "pre-ln": PreLNRule,
    "post-ln": PostLNRule,
    "softmax-attention": SoftmaxAttentionRule,
    "neutreno": NeuTRENORule,
    "value-residual": ValueResidualRule,
    "similarity-removal": SimilarityRemovalRule,
    "attnscale": AttnScaleRule,
    "featscale": FeatScaleRule,
}

#: Names accepted by :func:`rule_from_system`, each with its class and fixed keyword arguments.
_SYSTEM_RULES: dict[str, tuple[type, dict[str, Any]]] = {
    "linear": (LinearRule, {}),
    "no-skip": (LinearRule, {"skip": False}),
    "pre-ln": (PreLNRule, {}),
    "post-ln": (PostLNRule, {}),
    "neutreno": (NeuTRENORule, {}),
    "resformer": (ValueResidualRule, {"mode": "resformer"}),
    "svformer": (ValueResidualRule, {"mode": "svformer"}),
    "similarity-removal": (SimilarityRemovalRule, {}),
    "attnscale": (AttnScaleRule, {"omega": 0.5}),
    "featscale": (FeatScaleRule, {"s_d": 0.0, "s_h": 0.5}),
}

#: Rule names for a fixed system ``(A, W_V, W_proj[, gamma, beta])``, as used by ``simulate``.
SYSTEM_RULES: tuple[str, ...] = tuple(_SYSTEM_RULES)

#: Options each system rule accepts besides the system (for the command line).
RULE_OPTIONS: dict[str, tuple[str, ...]] = {
    "linear": (),
    "no-skip": (),
    "pre-ln": ("eps",),
    "post-ln": ("eps",),
    "neutreno": ("lam",),
    "resformer": ("weights",),
    "svformer": (),
    "similarity-removal": ("tau",),
    "attnscale": ("omega",),
    "featscale": ("s_d", "s_h", "code_faithful"),
}

_USES_LAYER_NORM = ("pre-ln", "post-ln")


def rule_from_system(
    name: str,
    *,
    A: ArrayLike,
    W_V: ArrayLike,
    W_proj: ArrayLike,
    gamma: ArrayLike | None = None,
    beta: ArrayLike | None = None,
    **options: Any,
) -> _FixedAttention:
    """Build the rule called ``name`` on a fixed system.

    Parameters
    ----------
    name : str
        One of :data:`SYSTEM_RULES`: ``linear``, ``no-skip``, ``pre-ln``, ``post-ln``, ``neutreno``,
        ``resformer``, ``svformer``, ``similarity-removal``, ``attnscale``, ``featscale``.
    A : (..., n, n) array_like
    W_V : (..., d, d_v) array_like
    W_proj : (..., d_v, d) array_like
    gamma, beta : (..., d) array_like, optional
        LayerNorm parameters; used by ``pre-ln`` and ``post-ln`` only, ignored by the others.
    **options
        The rule's own options (:data:`RULE_OPTIONS`). Defaults: ``lam=0.6``,
        ``weights=(0.5, 0.5)``, ``tau=1``; ``omega=0.5`` and ``s_h=0.5`` (``s_d=0``) are illustrative
        values that switch the mitigation on (the papers initialise them at 0, the identity).

    Returns
    -------
    rule
    """
    check_choice(name, "rule", SYSTEM_RULES)
    unknown = sorted(set(options) - set(RULE_OPTIONS[name]))
    if unknown:
        allowed = ", ".join(RULE_OPTIONS[name]) or "none"
        raise InputError(
            f"rule option `{unknown[0]}` is not accepted by rule {name!r} (accepted: {allowed})"
        )
    cls, fixed = _SYSTEM_RULES[name]
    kwargs = {**fixed, **options}
    if name in _USES_LAYER_NORM:
        kwargs.update(gamma=gamma, beta=beta)
    return cls(A, W_V, W_proj, **kwargs)
