"""Where an array lives: NumPy on the host, or a NumPy-compatible device library (CuPy).

The audit's heavy per-input steps (the perron certificate of :mod:`oversmooth.simulator.perron`, the Gram
spectra of :mod:`oversmooth.simulator.statistics`) are written once against the NumPy API and run on
whatever library holds their input: NumPy arrays on the host, CuPy arrays on the GPU where the
model ran. This module finds that library from the array itself (nothing is imported here: a
device library is only ever used when the caller already holds one of its arrays) and moves
results to the host explicitly, counting the bytes, so that a caller can prove what came back.

Public API
----------
array_module
    The NumPy-compatible module of an array (``numpy`` for host arrays).
on_host
    False for an array that declares a device (the array API, CUDA or DLPack protocols) and is
    not NumPy's.
to_numpy
    Any array as a NumPy array (a device array copied): for small records, uncounted.
HostCopies
    Hands arrays to host code as NumPy, counting what it handed over and what crossed from a
    device.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["HostCopies", "array_module", "on_host", "to_numpy"]


def on_host(array: Any) -> bool:
    """True unless ``array`` belongs to a device library: not a NumPy array or scalar, and
    declaring :data:`_DEVICE_MARKS` (Python numbers and sequences are host data)."""
    return not _is_device_array(array)


#: Attributes by which an array declares it lives on a device (the array API, CUDA, DLPack).
_DEVICE_MARKS = ("__array_namespace__", "__cuda_array_interface__", "__dlpack_device__")


def _is_device_array(array: Any) -> bool:
    if isinstance(array, np.ndarray | np.generic):
        return False
    return any(hasattr(array, mark) for mark in _DEVICE_MARKS)


def array_module(array: Any) -> ModuleType:
    """The NumPy-compatible module that owns ``array``: ``numpy`` for host arrays, else the
    already imported top-level package of the array's type (``cupy`` for a CuPy array).

    Raises
    ------
    TypeError
        A device array whose package exposes no NumPy-compatible API (``asnumpy``, ``matmul``,
        ``linalg``).
    """
    if on_host(array):
        return np
    package = sys.modules.get(type(array).__module__.split(".")[0])
    if package is None or not all(
        hasattr(package, name) for name in ("asnumpy", "matmul", "linalg")
    ):
        raise TypeError(
            f"arrays of type {type(array).__module__}.{type(array).__name__} are not supported: "
            "expected NumPy or a NumPy-compatible device library such as CuPy"
        )
    return package


def to_numpy(array: Any) -> NDArray[Any]:
    """``array`` as a NumPy array; a device array is copied to the host (for small records:
    bookkeeping, per-case numbers; the large arrays go through :class:`HostCopies`)."""
    return np.asarray(array) if on_host(array) else np.asarray(array_module(array).asnumpy(array))


class HostCopies:
    """Hands arrays to host code (as NumPy) and counts what it handed over.

    A host array passes through unchanged; a device array is copied once (``module.asnumpy``).
    Every array counts in :attr:`bytes` (what the host side received: on the CPU the same call
    sites and the same sizes as on a GPU, so a CPU test can check what a GPU run would copy);
    :attr:`device_bytes` counts only the bytes that really crossed from a device. Thread-safe:
    the audit's worker threads share one counter.

    Attributes
    ----------
    bytes, arrays : int
        Bytes and arrays handed to the host so far.
    device_bytes : int
        The part of :attr:`bytes` copied from a device.
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.arrays = 0
        self.device_bytes = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Count from zero again."""
        with self._lock:
            self.bytes = self.arrays = self.device_bytes = 0

    def __call__(self, array: Any) -> NDArray[Any]:
        """``array`` as a NumPy array, counted."""
        device = not on_host(array)
        host = to_numpy(array)
        with self._lock:
            self.bytes += int(host.nbytes)
            self.arrays += 1
            self.device_bytes += int(host.nbytes) if device else 0
        return host
