"""Validation at public boundaries: convert, check, and explain what was expected."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from simulator.errors import InputError
from simulator.tolerances import STOCHASTIC_ATOL

FloatArray = NDArray[np.float64]
SeedLike = int | np.random.Generator | None



def as_generator(seed: SeedLike) -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for an int seed, a generator, or None."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (not isinstance(seed, int | np.integer) or seed < 0):
        raise InputError(f"`seed` must be a non-negative integer or a Generator; got {seed!r}")
    return np.random.default_rng(seed)


def as_float_array(value: ArrayLike, name: str, *, min_ndim: int = 0) -> FloatArray:
    """Convert to a finite float64 array with at least ``min_ndim`` axes."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise InputError(
            f"`{name}` must be a real numeric array; got {type(value).__name__}"
        ) from err
    if array.ndim < min_ndim:
        raise InputError(f"`{name}` must have at least {min_ndim} axes; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise InputError(f"`{name}` must be finite; got {bad} NaN or inf entries")
    return array


def as_tokens(X: ArrayLike, name: str = "X") -> FloatArray:
    """Validate a token matrix (or batch of them), shape ``(..., n, d)``."""
    return as_float_array(X, name, min_ndim=2)


def as_square(M: ArrayLike, name: str) -> FloatArray:
    """Validate a square matrix (or batch of them), shape ``(..., k, k)``."""
    array = as_float_array(M, name, min_ndim=2)
    if array.shape[-1] != array.shape[-2]:
        raise InputError(f"`{name}` must be square (..., k, k); got shape {array.shape}")
    return array


def as_row_stochastic(A: ArrayLike, name: str = "A") -> FloatArray:
    """Validate a row-stochastic matrix: square, nonnegative, rows summing to one."""
    array = as_square(A, name)
    if np.any(array < 0):
        raise InputError(
            f"`{name}` must be row-stochastic (nonnegative entries); got min {array.min():.3g}"
        )
    err = float(np.max(np.abs(array.sum(axis=-1) - 1.0)))
    if err > STOCHASTIC_ATOL:
        raise InputError(
            f"`{name}` must be row-stochastic (rows summing to 1 within {STOCHASTIC_ATOL:g}); "
            f"got a row sum off by {err:.3g}"
        )
    return array


def check_positive_int(value: object, name: str) -> int:
    """Validate a positive integer (layers, sizes)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise InputError(f"`{name}` must be a positive integer; got {value!r}")
    return int(value)


def check_choice(value: str, name: str, choices: tuple[str, ...]) -> str:
    """Validate that ``value`` is one of ``choices``."""
    if value not in choices:
        raise InputError(f"`{name}` must be one of {', '.join(choices)}; got {value!r}")
    return value
