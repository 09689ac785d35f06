"""Reading ``.npy`` headers and data (simulator.npzfile) against what ``np.save`` wrote.

The readers' one-line errors on garbage headers (``audit --inputs``, ``simulate --system``) are
tested across both in tests/importers/inputs/test_npz_headers.py; here, the two functions alone.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from oversmooth.simulator.npzfile import read_npy_data, read_npy_header


def _saved(array: np.ndarray, version: tuple[int, int] | None = None) -> io.BytesIO:
    """``array`` as ``.npy`` bytes (NumPy's own writer), positioned at the start."""
    stream = io.BytesIO()
    np.lib.format.write_array(stream, array, version=version, allow_pickle=True)
    stream.seek(0)
    return stream


class Trickle(io.RawIOBase):
    """A stream that hands out at most three bytes per read, as a slow pipe or zip member may."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        chunk = self._data.read(min(3, len(buffer)))
        buffer[: len(chunk)] = chunk
        return len(chunk)


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype="<i8").reshape(3, 4),
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.array([1.5, -2.0], dtype=">f4"),
        np.zeros((0, 5), dtype=np.complex128),
        np.array(7, dtype=np.uint8),
    ],
    ids=["int64", "fortran", "big-endian", "empty", "scalar"],
)
def test_a_saved_array_reads_back_with_its_header(array: np.ndarray, version) -> None:
    stream = _saved(array, version)
    shape, fortran, dtype = read_npy_header(stream)
    assert shape == array.shape
    assert fortran == (array.flags.f_contiguous and not array.flags.c_contiguous)
    assert dtype == array.dtype
    back = read_npy_data(stream, shape, fortran, dtype)
    np.testing.assert_array_equal(back, array)
    assert back.dtype == array.dtype
    assert back.flags.writeable
    assert stream.read() == b""  # exactly the declared bytes


def test_the_header_reader_stops_at_the_first_data_byte() -> None:
    array = np.arange(3, dtype="<f8")
    stream = _saved(array)
    read_npy_header(stream)
    assert stream.read() == array.tobytes()


def test_data_arriving_a_few_bytes_at_a_time_is_read_whole() -> None:
    array = np.arange(10, dtype="<i4")
    stream = Trickle(_saved(array).getvalue())
    shape, fortran, dtype = read_npy_header(stream)  # type: ignore[arg-type]
    np.testing.assert_array_equal(read_npy_data(stream, shape, fortran, dtype), array)  # type: ignore[arg-type]


def test_data_shorter_than_declared_is_an_eof_error() -> None:
    raw = _saved(np.arange(4, dtype="<f8")).getvalue()
    stream = io.BytesIO(raw[:-5])
    shape, fortran, dtype = read_npy_header(stream)
    with pytest.raises(EOFError, match="ends after 27 of 32 declared bytes"):
        read_npy_data(stream, shape, fortran, dtype)


def test_an_object_array_is_refused_without_unpickling() -> None:
    stream = _saved(np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match="holds Python objects"):
        read_npy_header(stream)


@pytest.mark.parametrize(
    "raw",
    [b"", b"not numpy at all", b"\x93NUMPY\x09\x00", b"\x93NUMPY\x01\x00\x04\x00{'d"],
    ids=["empty", "no-magic", "unknown-version", "truncated-header"],
)
def test_a_bad_header_is_one_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"^not an \.npy array header \(") as info:
        read_npy_header(io.BytesIO(raw))
    assert "\n" not in str(info.value)
