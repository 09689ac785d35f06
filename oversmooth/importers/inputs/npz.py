"""Feeds stored in ``.npz`` files, read batch by batch so that files larger than memory work.

An ``.npz`` is a zip archive of ``.npy`` arrays. A member stored uncompressed (``np.savez``) is
memory-mapped straight from the archive; a deflated one (``np.savez_compressed``) is decompressed
in order, each batch continuing where the last stopped. A folder of ``.npz`` shards (same members,
same per-item shapes) is one sequence of inputs, the shards in name order, opened one at a time.

Opening checks every member's header (dtype, a declared size that the stored bytes hold, one item
within :func:`oversmooth.simulator.limits.check_elements`), the shapes against the graph inputs, then reads
every member once, piece by piece, for the digest and the token values
(:func:`~oversmooth.importers.inputs.feeds.check_values`) and that its floats are finite
(:func:`~oversmooth.importers.inputs.feeds.check_finite`): a damaged file is refused before anything runs.
A key/value cache input the file leaves out is fed empty (the model without a cache).

Public API
----------
from_npz
    Inputs read from one ``.npz`` or a folder of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oversmooth.importers.errors import FeedError, ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs.decoder_feeds import token_mask_input, with_empty_caches
from oversmooth.importers.inputs.feeds import (
    DIGEST_CHUNK_BYTES,
    Inputs,
    check_feeds,
    check_finite,
    check_values,
)
from oversmooth.simulator.errors import OversmoothError, one_line
from oversmooth.simulator.limits import check_elements
from oversmooth.simulator.npzfile import read_npy_data, read_npy_header
from oversmooth.simulator.validation import regular_file

__all__ = ["from_npz"]

#: What reading a damaged, truncated, encrypted or foreign ``.npz`` raises inside NumPy/zipfile.
NPZ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    KeyError,
    RuntimeError,
    NotImplementedError,
    zipfile.BadZipFile,
    struct.error,
    zlib.error,
)
_LABELS = "labels"
#: Fixed part of a zip local file header; the name and extra field follow it.
_LOCAL_HEADER = struct.Struct("<4s22xHH")


@dataclass(frozen=True)
class _Member:
    """One ``.npy`` member: where its data starts and how it is laid out."""

    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    header_bytes: int

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def stored(self) -> bool:
        return self.info.compress_type == zipfile.ZIP_STORED


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> _Member:
    """Read one member's ``.npy`` header (not its data) and check the size it declares."""
    label = f"array {info.filename!r} of `inputs`"
    with archive.open(info) as handle:
        try:
            shape, fortran, dtype = read_npy_header(handle)
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None
        header_bytes = handle.tell()
    check_elements(shape[1:], f"one item of {label}", error=ImporterInputError)
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if info.file_size != header_bytes + declared:
        raise ImporterInputError(
            f"{label} declares shape {tuple(shape)} of {dtype} ({declared:,} bytes) but holds "
            f"{info.file_size - header_bytes:,} bytes"
        )
    return _Member(info, tuple(shape), dtype, fortran, header_bytes)


def _read_whole(archive: zipfile.ZipFile, member: _Member) -> np.ndarray:
    """All of one member's data (its header was checked when the archive was opened)."""
    with archive.open(member.info) as handle:
        read_npy_header(handle)
        return read_npy_data(handle, member.shape, member.fortran, member.dtype)


def _members(path: Path) -> dict[str, _Member]:
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        if not infos:
            raise ValueError("the archive holds no arrays")
        return {info.filename.removesuffix(".npy"): _member(archive, info) for info in infos}


class _Shard:
    """One open ``.npz``: rows of its members, memory-mapped or decompressed in order."""

    def __init__(self, path: Path, members: Mapping[str, _Member]) -> None:
        self.path = path
        self.members = members
        self.archive = zipfile.ZipFile(path)
        self.streams: dict[str, Any] = {}
        self.whole: dict[str, np.ndarray] = {}

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()
        self.whole.clear()
        self.archive.close()

    def _data_offset(self, member: _Member) -> int:
        with open(self.path, "rb") as handle:
            handle.seek(member.info.header_offset)
            _, name_length, extra_length = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
        return (
            member.info.header_offset
            + _LOCAL_HEADER.size
            + name_length
            + extra_length
            + member.header_bytes
        )

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of member ``name``, as a new array."""
        member = self.members[name]
        if member.fortran and not member.stored:  # rows are not contiguous: read it whole, once
            if name not in self.whole:
                self.whole[name] = _read_whole(self.archive, member)
            return np.array(self.whole[name][start:stop])
        if member.stored:
            mapped = np.memmap(
                self.path,
                dtype=member.dtype,
                mode="r",
                offset=self._data_offset(member),
                shape=member.shape,
                order="F" if member.fortran else "C",
            )
            try:
                return np.array(mapped[start:stop])
            finally:
                del mapped
        return self._decompressed(name, member, start, stop)

    def _decompressed(self, name: str, member: _Member, start: int, stop: int) -> np.ndarray:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = self.archive.open(member.info)
        stream.seek(member.header_bytes + start * member.row_bytes)  # forward: no re-reading
        count = (stop - start) * member.row_bytes
        data = stream.read(count)
        if len(data) != count:
            raise EOFError(f"member {member.info.filename!r} ends early")
        return np.frombuffer(data, dtype=member.dtype).reshape((stop - start, *member.row_shape))


class _NpzReader:
    """The feeds of one ``.npz`` or of shards read one after the other (a FeedReader)."""

    def __init__(
        self,
        shards: Sequence[tuple[Path, dict[str, _Member]]],
        sizes: Sequence[int],
        names: Sequence[str],
        mask_name: str | None,
        graph: Sequence[GraphInput] = (),
    ) -> None:
        self.graph = tuple(graph)
        self.shards = list(shards)
        self.names = tuple(names)
        self.mask_name = mask_name
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self.n_items = int(self.starts[-1])
        self._open: tuple[int, _Shard] | None = None
        self._digest = ""

    def close(self) -> None:
        """Close the shard open last (each pass opens the shards it reads one at a time)."""
        if self._open is not None:
            self._open[1].close()
            self._open = None

    def __del__(self) -> None:  # the reader has no end-of-use call: its last shard closes here
        self.close()

    def _shard(self, index: int) -> _Shard:
        if self._open is None or self._open[0] != index:
            if self._open is not None:
                self._open[1].close()
            self._open = (index, _Shard(*self.shards[index]))
        return self._open[1]

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """(shard, local start, local stop) covering items ``[start, stop)``."""
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for index in range(max(first, 0), len(self.shards)):
            begin, end = int(self.starts[index]), int(self.starts[index + 1])
            if begin >= stop:
                break
            if end > start:
                yield index, max(start, begin) - begin, min(stop, end) - begin

    def read_feed(self, name: str, start: int, stop: int) -> np.ndarray:
        """Items ``[start, stop)`` of one feed."""
        member = self.shards[0][1][name]
        if not member.shape:  # a scalar feed is the same for every item
            with _reading(self.shards[0][0]), zipfile.ZipFile(self.shards[0][0]) as archive:
                return _read_whole(archive, member)
        parts = []
        for index, a, b in self._pieces(start, stop):
            with _reading(self.shards[index][0]):
                parts.append(self._shard(index).rows(name, a, b))
        if not parts:
            return np.empty((0, *member.row_shape), member.dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def read(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], NDArray[np.bool_] | None]:
        feeds = {name: self.read_feed(name, start, stop) for name in self.names}
        mask = feeds.get(self.mask_name) if self.mask_name else None
        token_mask = None if mask is None or mask.ndim != 2 else mask.astype(bool)
        return with_empty_caches(feeds, self.graph), token_mask

    def check_and_digest(self, expected: Sequence[GraphInput], labels: Sequence[str]) -> str:
        """Read every feed once, in pieces: check its token values and that its floats are finite
        (``labels`` name the items), return the feeds' digest."""
        digest = hashlib.sha256()
        for name in sorted(self.names):
            member = self.shards[0][1][name]
            shape = (self.n_items, *member.row_shape) if member.shape else ()
            digest.update(f"{name}|{member.dtype.str}|{shape}|".encode())
            step = max(1, DIGEST_CHUNK_BYTES // max(1, member.row_bytes))
            for start in range(0, max(self.n_items, 1) if member.shape else 1, step):
                piece = np.ascontiguousarray(self.read_feed(name, start, start + step))
                check_values({name: piece}, expected)
                check_finite({name: piece}, labels[start : start + step], start)
                digest.update(piece.tobytes())
        self._digest = digest.hexdigest()
        return self._digest

    def digest(self) -> str:
        return self._digest


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turn what a damaged ``.npz`` raises inside NumPy/zipfile into one line naming the file."""
    try:
        yield
    except OversmoothError:
        raise
    except NPZ_ERRORS as err:
        raise ImporterInputError(
            f"`inputs` must be a readable .npz file of arrays; cannot read {str(path)!r}: "
            f"{one_line(err)}"
        ) from None


def _shard_files(path: str | os.PathLike[str]) -> list[Path]:
    folder = Path(path)
    if not folder.is_dir():
        return [regular_file(path, "inputs", error=ImporterInputError)]
    files = sorted(child for child in folder.iterdir() if child.suffix == ".npz")
    if not files:
        raise ImporterInputError(
            f"`inputs` must be an .npz file or a folder of them; got none in {folder}"
        )
    return [regular_file(file, "inputs", error=ImporterInputError) for file in files]


def _read_members(file: Path) -> dict[str, _Member]:
    with _reading(file):
        members = _members(file)
    return members


def _labels(file: Path, member: _Member | None, n_rows: int, first: int) -> list[str]:
    if member is None:
        return [f"item-{first + index}" for index in range(n_rows)]
    check_elements(member.shape, "array 'labels' of `inputs`", error=ImporterInputError)
    with _reading(file), zipfile.ZipFile(file) as archive:
        values = _read_whole(archive, member)
    labels = [str(label) for label in np.asarray(values).reshape(-1)]
    if len(labels) != n_rows:
        raise ImporterInputError(
            f"`labels` in the npz must have {n_rows} entries; got {len(labels)}"
        )
    return labels


def _check_shapes(
    file: Path,
    members: Mapping[str, _Member],
    first: Mapping[str, _Member],
    graph: Sequence[GraphInput],
) -> int:
    """Check one shard's feeds against the graph (shapes only) and the first shard; its items."""
    views = {
        name: np.broadcast_to(np.zeros((), member.dtype), member.shape)
        for name, member in members.items()
        if name != _LABELS
    }
    check_feeds(with_empty_caches(views, graph), graph, any_batch=True, values=False)
    sizes = {int(view.shape[0]) for view in views.values() if view.ndim}
    if len(sizes) > 1:
        raise FeedError(
            f"the arrays of `inputs` must share one number of items along axis 0; {file.name} "
            f"holds {sorted(sizes)}"
        )
    for name, member in members.items():
        if name != _LABELS and (member.row_shape, member.dtype) != (
            first[name].row_shape,
            first[name].dtype,
        ):
            raise FeedError(
                f"every shard of `inputs` must hold the same arrays per item; {file.name}'s "
                f"{name!r} is {member.dtype} {member.row_shape} per item, the first shard's "
                f"{first[name].dtype} {first[name].row_shape}"
            )
    if set(members) != set(first):
        raise FeedError(
            f"every shard of `inputs` must hold the same arrays; {file.name} holds "
            f"{', '.join(sorted(members))}, the first shard {', '.join(sorted(first))}"
        )
    return next((int(view.shape[0]) for view in views.values() if view.ndim), 1)


def from_npz(path: str | os.PathLike[str], graph: Sequence[GraphInput]) -> Inputs:
    """Feeds stored in an ``.npz`` (or a folder of ``.npz`` shards) under the graph input names.

    An optional ``labels`` array names the items. The token mask is taken from the graph's mask
    input when there is one. The feeds are read per batch when the audit runs (memory does not
    grow with the file); opening reads every array once, in pieces, for the digest and the checks.

    Raises
    ------
    ImporterInputError
        A file cannot be read as an npz (the message names it), or declares more than it holds.
    FeedError
        The arrays do not fit the graph inputs, or the shards do not match each other.
    """
    files = _shard_files(path)
    shards = [(file, _read_members(file)) for file in files]
    first = shards[0][1]
    labels: list[str] = []
    sizes: list[int] = []
    for file, members in shards:
        sizes.append(_check_shapes(file, members, first, graph))
        labels += _labels(file, members.get(_LABELS), sizes[-1], len(labels))
    names = [name for name in first if name != _LABELS]
    mask_name = token_mask_input(graph)
    reader = _NpzReader(shards, sizes, names, mask_name, graph)
    digest = reader.check_and_digest(graph, labels)
    return Inputs(reader=reader, labels=labels, source=f"npz:{digest[:12]}", digest=digest)
