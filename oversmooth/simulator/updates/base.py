"""The UpdateRule protocol, and what every rule shares: argument validation, repr, input check.

Public API
----------
UpdateRule
    The protocol every rule satisfies: what :func:`oversmooth.simulator.dynamics.iterate` and the checks use.
SCALED
    Key of the cache dict holding the arrays that scale with X (see :mod:`oversmooth.simulator.updates`).
RuleBase
    Base class of the rules: ``batch_shape`` and ``check_tokens``.
ShortRepr, set_frozen
    A ``repr`` showing arrays as their shapes, and building a frozen dataclass in ``__init__``.
broadcast_batch, as_matrix, as_feature_vector, as_eps, apply_layer_norm
    Validation and LayerNorm helpers used by several rule modules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import Field, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from oversmooth.simulator.attention import layer_norm
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.validation import FloatArray, as_float_array, as_tokens

__all__ = [
    "SCALED",
    "RuleBase",
    "ShortRepr",
    "UpdateRule",
    "apply_layer_norm",
    "as_eps",
    "as_feature_vector",
    "as_matrix",
    "broadcast_batch",
    "set_frozen",
]

#: Key of the cache dict holding arrays that scale with X (see :mod:`oversmooth.simulator.updates`).
SCALED = "scaled"


@runtime_checkable
class UpdateRule(Protocol):
    """One Transformer layer ``X_{l-1} -> X_l`` as :func:`oversmooth.simulator.dynamics.iterate` uses it.

    Every rule class of :mod:`oversmooth.simulator.updates` satisfies it; so may any other object with these
    members (``isinstance(obj, UpdateRule)`` checks that they are present, not their signatures).
    """

    @property
    def homogeneous(self) -> bool:
        """True iff ``rule(c X) = c rule(X)`` for every ``c > 0`` (the cache's scaled arrays too)."""
        ...

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading batch axes of the rule's own arrays (``()`` for one system)."""
        ...

    def check_tokens(self, X: ArrayLike, name: str = "X") -> FloatArray:
        """Validate an input ``(..., n, d)`` for this rule once, before the first layer."""
        ...

    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """Apply block ``layer`` (0-based) to ``(..., n, d)`` tokens; ``cache`` lives one run."""
        ...


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------


def broadcast_batch(shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """Broadcast the leading (batch) shapes of several arrays, naming them on failure.

    Parameters
    ----------
    shapes : dict of str to tuple of int
        Each array's name and batch shape.

    Returns
    -------
    tuple of int
        The broadcast batch shape.
    """
    try:
        return np.broadcast_shapes(*shapes.values())
    except ValueError:
        listed = ", ".join(f"`{name}` {shape}" for name, shape in shapes.items())
        raise InputError(f"the leading batch axes must broadcast together; got {listed}") from None


def as_matrix(value: ArrayLike, name: str, rows: int | None, cols: int | None) -> FloatArray:
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


def as_feature_vector(value: ArrayLike | None, name: str, d: int, default: float) -> FloatArray:
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


def as_eps(eps: float) -> float:
    """The LayerNorm ``eps``, a positive number."""
    if not isinstance(eps, int | float) or isinstance(eps, bool) or not eps > 0:
        raise InputError(f"`eps` must be a positive number; got {eps!r}")
    return float(eps)


def apply_layer_norm(X: FloatArray, gamma: FloatArray, beta: FloatArray, eps: float) -> FloatArray:
    """``LN(X) = N(X) diag(gamma) + 1 beta^T`` with N from :func:`oversmooth.simulator.attention.layer_norm`.

    ``gamma`` and ``beta`` may carry batch axes ``(..., d)``, so they are applied here.
    """
    return layer_norm(X, eps=eps) * gamma[..., None, :] + beta[..., None, :]


# ----------------------------------------------------------------------------------------------
# shared base classes
# ----------------------------------------------------------------------------------------------


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray) and value.ndim > 0:
        return f"array{value.shape}"
    if isinstance(value, np.ndarray):
        return repr(float(value))
    return repr(value)


def set_frozen(obj: object, **values: object) -> None:
    """Set attributes of a frozen dataclass from its own ``__init__`` (validated values only)."""
    for name, value in values.items():
        object.__setattr__(obj, name, value)


class ShortRepr:
    """A short ``repr`` for dataclasses: arrays appear as their shapes."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __repr__(self) -> str:
        shown = (f"{f.name}={_describe(getattr(self, f.name))}" for f in fields(self) if f.repr)
        return f"{type(self).__name__}({', '.join(shown)})"


class RuleBase(ShortRepr, ABC):
    """Base of the rule classes: the shared input check, and what each rule must define.

    A subclass is a frozen dataclass that validates its arguments in ``__init__`` (arrays are kept
    as float64) and sets ``_n``, ``_d`` and ``_batch`` there; it satisfies :class:`UpdateRule`.
    """

    #: Number of tokens the rule's fixed matrices require (None: any).
    _n: int | None
    #: Number of features.
    _d: int
    #: Broadcast batch shape of the rule's own arrays.
    _batch: tuple[int, ...]

    @property
    @abstractmethod
    def homogeneous(self) -> bool:
        """True iff ``rule(c X) = c rule(X)`` for every ``c > 0``."""

    @abstractmethod
    def __call__(self, X: FloatArray, layer: int, cache: dict[str, Any]) -> FloatArray:
        """One layer on ``(..., n, d)`` tokens."""

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
        broadcast_batch({name: X.shape[:-2], "the rule's matrices": self._batch})
        return X
