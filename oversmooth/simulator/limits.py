"""Size limits, in one place: declared sizes are checked against them before anything is allocated.

Auditors run oversmooth on files they did not write; a graph input declaring a batch of 2^40, an
``.npz`` header declaring 2^40 elements or ``--seq-len 10**12`` must end in one line naming the
limit, not in a MemoryError. Each limit can be raised through an environment variable for the
rare real job that needs more.

=====================  ==================  ===============================================
limit                  default             environment variable
=====================  ==================  ===============================================
``max_elements``       2**28 (268 M)       ``OVERSMOOTH_MAX_ELEMENTS``: one array's elements
``max_image_side``     4096 pixels         ``OVERSMOOTH_MAX_IMAGE_SIDE``: ``--image-size``, decoded images
``max_text_bytes``     64 MiB              ``OVERSMOOTH_MAX_TEXT_BYTES``: a ``--text`` file
``max_examples``       10**6               ``OVERSMOOTH_MAX_EXAMPLES``: ``verify --examples``
``max_sweep_cells``    10**5               ``OVERSMOOTH_MAX_SWEEP_CELLS``: cells of a ``sweep`` grid
=====================  ==================  ===============================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable

from oversmooth.simulator.errors import InputError

__all__ = ["LIMITS", "check_elements", "check_size", "limit"]

#: name -> (default, environment variable, what it bounds).
LIMITS: dict[str, tuple[int, str, str]] = {
    "max_elements": (2**28, "OVERSMOOTH_MAX_ELEMENTS", "elements in one array"),
    "max_image_side": (4096, "OVERSMOOTH_MAX_IMAGE_SIDE", "pixels on an image side"),
    "max_text_bytes": (64 * 2**20, "OVERSMOOTH_MAX_TEXT_BYTES", "bytes in a text file"),
    "max_examples": (10**6, "OVERSMOOTH_MAX_EXAMPLES", "instances per check of verify"),
    "max_sweep_cells": (10**5, "OVERSMOOTH_MAX_SWEEP_CELLS", "cells in a sweep grid"),
}


def limit(name: str) -> int:
    """The current value of limit ``name`` (its environment variable, else its default)."""
    default, variable, _ = LIMITS[name]
    text = os.environ.get(variable, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise InputError(f"`{variable}` must be a positive integer; got {text!r}")
    return value


def check_size(
    value: int, name: str, limit_name: str, *, error: type[InputError] = InputError
) -> int:
    """Raise ``error`` unless ``0 < value <= limit(limit_name)``; the message names the limit."""
    bound = limit(limit_name)
    if value > bound:
        variable = LIMITS[limit_name][1]
        raise error(
            f"`{name}` must be at most {bound:,} ({LIMITS[limit_name][2]}; raise {variable} to allow "
            f"more); got {value:,}"
        )
    return value


def check_elements(
    shape: Iterable[int], name: str, *, error: type[InputError] = InputError
) -> tuple[int, ...]:
    """Check that an array of ``shape`` may be allocated: every dim non-negative, at most
    ``max_elements`` elements in all. Returns the shape as a tuple of ints."""
    dims = tuple(int(dim) for dim in shape)
    if any(dim < 0 for dim in dims):
        raise error(f"`{name}` must have non-negative sizes; got shape {dims}")
    check_size(math.prod(dims), f"{name} (shape {dims})", "max_elements", error=error)
    return dims
