"""Reading the headers of ``.npy`` members safely: the one place NumPy's header parser is called.

An ``.npz`` is a zip archive of ``.npy`` members, each a short header (a Python literal: dtype,
order, shape) and then the data. NumPy parses that header with ``ast.literal_eval`` and, for
headers written by Python 2, ``tokenize``; a damaged or hostile header makes them raise
``ValueError``, ``SyntaxError``, ``tokenize.TokenError``, ``RecursionError`` and more, or warn. Every
reader of ``.npz`` files (``simulate --system``, ``audit --inputs``) reads each member's header
here first, checks the size it declares, and only then reads its data.

Public API
----------
read_npy_header, read_npy_data
    ``(shape, fortran_order, dtype)`` of an ``.npy`` stream (one ``ValueError`` for any bad header);
    then exactly the data it declares.
NPY_HEADER_ERRORS
    What NumPy's header parser raises on a bad header (all caught by :func:`read_npy_header`).
"""

from __future__ import annotations

import math
import struct
import tokenize
import warnings
from typing import IO

import numpy as np

__all__ = ["NPY_HEADER_ERRORS", "read_npy_data", "read_npy_header"]

#: What ``np.lib.format`` raises on a damaged or hostile header (a Python-literal parser, and for
#: Python 2 headers a tokenizer, on untrusted text).
NPY_HEADER_ERRORS = (
    ValueError,
    SyntaxError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    RecursionError,
    MemoryError,
    EOFError,
    struct.error,
    tokenize.TokenError,
)


def read_npy_header(handle: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The ``(shape, fortran_order, dtype)`` an ``.npy`` stream declares; nothing past it is read.

    Parameters
    ----------
    handle : binary file object
        Positioned at the start of the ``.npy`` data (for example ``ZipFile.open(member)``); left
        at the first byte of the array data.

    Returns
    -------
    shape : tuple of int
        As declared (possibly negative or huge: the caller checks it against
        :func:`oversmooth.simulator.limits.check_elements` before allocating anything).
    fortran_order : bool
    dtype : numpy.dtype
        Never an object dtype (those would need pickle).

    Raises
    ------
    ValueError
        One line for any header NumPy cannot parse (:data:`NPY_HEADER_ERRORS`), an unknown
        format version, or an object dtype. What reading the stream itself raises (``OSError``,
        ``zipfile.BadZipFile``, ``zlib.error``) is the caller's.
    """
    try:
        with warnings.catch_warnings():  # a Python 2 header warns; it reads the same
            warnings.simplefilter("ignore")
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    except NPY_HEADER_ERRORS as err:
        raise ValueError(
            f"not an .npy array header ({type(err).__name__}: {' '.join(str(err).split())[:120]})"
        ) from None
    if dtype.hasobject:
        raise ValueError(f"holds Python objects (dtype {dtype}), which are not read")
    return tuple(int(dim) for dim in shape), bool(fortran), dtype


def read_npy_data(
    handle: IO[bytes], shape: tuple[int, ...], fortran_order: bool, dtype: np.dtype
) -> np.ndarray:
    """The array data following a header :func:`read_npy_header` has read (and its caller has
    checked against the size limits): exactly the declared bytes, into one writable array.

    Raises
    ------
    EOFError
        The stream holds fewer bytes than the header declares.
    """
    count = math.prod(shape)
    buffer = bytearray(count * dtype.itemsize)
    view = memoryview(buffer)
    filled = 0
    while filled < len(buffer):
        got = handle.readinto(view[filled:])  # type: ignore[attr-defined]
        if not got:
            raise EOFError(f"the data ends after {filled:,} of {len(buffer):,} declared bytes")
        filled += got
    array = np.frombuffer(buffer, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran_order else "C")
