"""Output helpers shared by every package: atomic files and folders, the one tidy-CSV writer, the one
JSON serialiser, and provenance.

Public API
----------
atomic_output
    Write a file through a temporary sibling; an error leaves the destination untouched.
atomic_directory
    Build a folder in a staging sibling; it replaces the destination whole, or not at all.
write_tidy_csv
    One header line, one line per row; floats written with ``repr`` so they read back exactly.
to_json, write_json
    Strict JSON (RFC 8259): NumPy scalars and arrays, paths and objects with ``to_dict()`` are
    converted, NaN and infinities become ``null``, anything else is a ``TypeError``.
package_versions
    Installed versions of named distributions, for provenance records.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import numpy as np


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success rename it onto ``path``, else delete it.

    Parameters
    ----------
    path : path-like
        Final destination. Its folder is created if missing.
    mode : {"w", "wb"}
        Text (UTF-8, ``newline=""`` for CSV) or binary.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        kwargs = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging folder beside ``path``; on success it replaces ``path`` as a whole.

    On any error (or interrupt) the staging folder is removed and ``path`` is left as it was, so a
    report folder is never half written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    )
    try:
        yield staging
        if target.exists():
            old = Path(
                tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent)
            )
            os.replace(target, old / target.name)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """Installed version of each named distribution, for provenance records (missing ones omitted)."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _csv_cell(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return repr(float(value))
    if value is None:
        return ""
    return value


def write_tidy_csv(
    path: str | os.PathLike[str],
    columns: Sequence[str],
    rows: Iterable[Sequence[Any] | Mapping[str, Any]],
) -> Path:
    """Write a tidy CSV atomically: a header of ``columns``, then one line per row.

    Parameters
    ----------
    path : path-like
        Destination (written through :func:`atomic_output`).
    columns : sequence of str
        Header names, in order.
    rows : iterable of sequences or mappings
        A sequence gives the cells in column order; a mapping is read by column name (missing keys
        are empty cells). Floats are written with ``repr`` (shortest round-trip form), None as "".

    Returns
    -------
    pathlib.Path
    """
    target = Path(path)
    with atomic_output(target) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            cells = [row.get(c) for c in columns] if isinstance(row, Mapping) else row
            writer.writerow([_csv_cell(cell) for cell in cells])
    return target


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON types (see :func:`to_json`)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic | np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict())
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(value: Any, *, indent: int | None = 2) -> str:
    """Serialise ``value`` as strict JSON text.

    NumPy scalars and arrays become numbers and lists, paths strings, objects with a ``to_dict()``
    method their dict; NaN and ±inf become ``null`` (JSON has no such numbers). Any other type
    raises ``TypeError``: nothing is silently stringified.
    """
    return json.dumps(_jsonable(value), indent=indent, allow_nan=False)


def write_json(path: str | os.PathLike[str], value: Any) -> Path:
    """Write :func:`to_json` of ``value`` (plus a final newline) to ``path`` atomically."""
    target = Path(path)
    with atomic_output(target) as handle:
        handle.write(to_json(value) + "\n")
    return target
