"""Validation at public boundaries: convert, check, and explain what was expected."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.tolerances import STOCHASTIC_ATOL

FloatArray = NDArray[np.float64]
SeedLike = int | np.random.Generator | None


def as_generator(seed: SeedLike, *, error: type[InputError] = InputError) -> np.random.Generator:
    """Return a ``numpy.random.Generator`` for an int seed, a generator, or None.

    ``error`` (here and below) is the exception class raised, so a package can raise its own
    subclass of :class:`~oversmooth.simulator.errors.InputError`.
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (not isinstance(seed, int | np.integer) or seed < 0):
        raise error(f"`seed` must be a non-negative integer or a Generator; got {seed!r}")
    return np.random.default_rng(seed)


def as_float_array(
    value: ArrayLike, name: str, *, min_ndim: int = 0, error: type[InputError] = InputError
) -> FloatArray:
    """Convert to a finite float64 array with at least ``min_ndim`` axes."""
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise error(f"`{name}` must be a real numeric array; got {type(value).__name__}") from err
    if array.ndim < min_ndim:
        raise error(f"`{name}` must have at least {min_ndim} axes; got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise error(f"`{name}` must be finite; got {bad} NaN or inf entries")
    return array


def as_tokens(X: ArrayLike, name: str = "X") -> FloatArray:
    """Validate a token matrix (or batch of them), shape ``(..., n, d)``."""
    return as_float_array(X, name, min_ndim=2)


def as_square(M: ArrayLike, name: str, *, error: type[InputError] = InputError) -> FloatArray:
    """Validate a square matrix (or batch of them), shape ``(..., k, k)``."""
    array = as_float_array(M, name, min_ndim=2, error=error)
    if array.shape[-1] != array.shape[-2]:
        raise error(f"`{name}` must be square (..., k, k); got shape {array.shape}")
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


def check_positive_int(value: object, name: str, *, error: type[InputError] = InputError) -> int:
    """Validate a positive integer (layers, sizes)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise error(f"`{name}` must be a positive integer; got {value!r}")
    return int(value)


def check_choice(
    value: str, name: str, choices: tuple[str, ...], *, error: type[InputError] = InputError
) -> str:
    """Validate that ``value`` is one of ``choices``."""
    if value not in choices:
        raise error(f"`{name}` must be one of {', '.join(choices)}; got {value!r}")
    return value


def regular_file(
    path: str | os.PathLike[str], name: str, *, error: type[InputError] = InputError
) -> Path:
    """Return ``path`` if it names an existing regular file, else raise a one-line InputError.

    Checked before opening, so a named pipe, a device (``/dev/zero``) or a folder given where a
    file is expected is refused instead of blocking or reading forever.
    """
    file = Path(path)
    if not file.exists():
        raise error(f"`{name}` must be an existing file; got {str(path)!r} (no such file)")
    if not file.is_file():
        raise error(f"`{name}` must be a regular file; got {str(path)!r} (not a regular file)")
    return file
