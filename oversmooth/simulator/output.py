"""Output helpers shared by every package: atomic files and folders, the one tidy-CSV writer, the one
JSON serialiser, and provenance.

Public API
----------
atomic_output
    Write a file through a temporary sibling; an error leaves the destination untouched.
atomic_directory, check_output_folder
    Build a folder in a staging sibling; it replaces the destination whole, or not at all (and
    the same refusal, checked before any work). Both leave the modes a plain ``open`` or
    ``mkdir`` would (the user's umask), not ``tempfile``'s private 0600/0700.
current_umask
    The process's umask, read without changing it where the system allows.
write_tidy_csv, has_csv_header, npz_members
    One header line, one line per row; floats written with ``repr`` so they read back exactly.
    The predicates tell whether an existing file is an earlier output (only those are replaced
    without ``--force``).
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
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import numpy as np

from oversmooth.simulator.errors import InputError


def current_umask() -> int:
    """The process's file-mode creation mask, read without changing it where the system tells
    (Linux: ``/proc/self/status``), else by setting it and setting it back at once."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as status:
            line = next(line for line in status if line.startswith("Umask:"))
            return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_if_created(path: str | os.PathLike[str] | int, folder: bool) -> None:
    """Give a file (an open descriptor) or folder made private by ``tempfile`` the mode an
    ``open``/``mkdir`` would have given it: 0o666 (files) or 0o777 (folders) less the umask, so a
    report written into a shared folder is as readable as anything else the user writes there."""
    mode = (0o777 if folder else 0o666) & ~current_umask()
    if isinstance(path, int):
        os.fchmod(path, mode)
    else:
        os.chmod(path, mode)


def _kind(path: Path) -> str:
    """What ``path`` is, in words, for error messages."""
    if path.is_dir():
        return "folder"
    if path.is_char_device() or path.is_block_device():
        return "device"
    if path.is_fifo():
        return "named pipe"
    if path.is_socket():
        return "socket"
    return "special file"


def _checked_target(path: str | os.PathLike[str], what: str, label: str) -> Path:
    if not os.fspath(path):
        raise InputError(f"`{label}` must name a {what}; got an empty string")
    return Path(path)


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str],
    mode: str = "w",
    *,
    label: str = "output",
    ours: Callable[[Path], bool] | None = None,
) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success rename it onto ``path``, else delete it.

    Only a regular file (or nothing) is ever replaced: a folder, device, pipe, socket or symbolic
    link at ``path`` is refused before anything is written, so a device file can never be renamed over. Any
    ``OSError`` while writing (read-only folder, a name too long, a full disk) becomes one
    :class:`~oversmooth.simulator.errors.InputError` line, and nothing is left behind.

    Parameters
    ----------
    path : path-like
        Final destination. Its folder is created if missing.
    mode : {"w", "wb"}
        Text (UTF-8, ``newline=""`` for CSV) or binary.
    label : str
        How error messages name the destination (a command passes its option, e.g. ``"--out"``).
    ours : callable, optional
        ``ours(path)`` says whether an existing file is an earlier output of the same command; any
        other existing file is refused (a command passes None when the user says ``--force``).
    """
    target = _checked_target(path, "file", label)
    tmp = None
    try:
        if target.is_symlink() or (target.exists() and not target.is_file()):
            kind = "symbolic link" if target.is_symlink() else _kind(target)
            raise InputError(
                f"`{label}` must be a regular file or not exist yet; {str(target)!r} is a {kind}"
            )
        if ours is not None and target.is_file() and not ours(target):
            raise InputError(
                f"`{label}` {str(target)!r} exists and is not an earlier output of this command; "
                f"choose another path or pass --force to replace it"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        _as_if_created(fd, folder=False)
        kwargs: dict[str, Any] = {"encoding": "utf-8", "newline": ""} if "b" not in mode else {}
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
        os.replace(tmp, target)
    except OSError as err:
        raise InputError(
            f"`{label}` must be a writable file path; cannot write {str(target)!r}: "
            f"{err.strerror or err}"
        ) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def check_output_folder(
    path: str | os.PathLike[str],
    *,
    ours: Callable[[Path], bool] | None = None,
    label: str = "output",
) -> Path:
    """Refuse ``path`` now, before any work, if :func:`atomic_directory` would refuse it later."""
    target = _checked_target(path, "folder", label)
    try:
        _check_folder_target(target, ours, label)
    except OSError as err:
        raise InputError(
            f"`{label}` must be a writable folder path; cannot use {str(target)!r}: "
            f"{err.strerror or err}"
        ) from None
    return target


def _check_folder_target(target: Path, ours: Callable[[Path], bool] | None, label: str) -> None:
    if target.is_symlink() or target.is_file():
        kind = "symbolic link" if target.is_symlink() else "file"
        raise InputError(
            f"`{label}` must be a folder of ours or not exist yet; {str(target)!r} is a {kind}"
        )
    if target.exists():
        if not target.is_dir():
            raise InputError(
                f"`{label}` must be a folder of ours or not exist yet; {str(target)!r} is a "
                f"{_kind(target)}"
            )
        if any(target.iterdir()) and not (ours is not None and ours(target)):
            raise InputError(
                f"`{label}` {str(target)!r} exists and is not an earlier output of this command; "
                f"choose another folder or remove it"
            )


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike[str],
    *,
    ours: Callable[[Path], bool] | None = None,
    label: str = "output",
) -> Iterator[Path]:
    """Yield an empty staging folder beside ``path``; on success it replaces ``path`` as a whole.

    On any error (or interrupt) the staging folder is removed and ``path`` is left as it was, so a
    report folder is never half written. An existing ``path`` is replaced only when it is an empty
    folder or ``ours(path)`` says it is an earlier output of the same command; anything else (a
    file, a device, someone's folder) is refused before anything is written.
    """
    target = _checked_target(path, "folder", label)
    staging = None
    try:
        _check_folder_target(target, ours, label)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        )
        _as_if_created(staging, folder=True)
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
        staging = None
    except OSError as err:
        raise InputError(
            f"`{label}` must be a writable folder path; cannot write {str(target)!r}: "
            f"{err.strerror or err}"
        ) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


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
    *,
    label: str = "output",
    replace_any: bool = False,
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
    label : str
        How error messages name the destination.
    replace_any : bool
        Replace an existing file whatever it holds (``--force``); by default only a CSV with the
        same header (an earlier output of the same kind) is replaced.

    Returns
    -------
    pathlib.Path
    """
    ours = None if replace_any else has_csv_header(columns)
    with atomic_output(path, label=label, ours=ours) as handle:  # "" is refused, not "."
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            cells = [row.get(c) for c in columns] if isinstance(row, Mapping) else row
            writer.writerow([_csv_cell(cell) for cell in cells])
    return Path(path)


def has_csv_header(columns: Sequence[str]) -> Callable[[Path], bool]:
    """A predicate: does a file start with exactly this CSV header line (an earlier tidy output)?"""
    header = ",".join(columns)

    def check(path: Path) -> bool:
        try:
            with path.open(encoding="utf-8", newline="") as handle:
                return handle.readline(len(header) + 2).rstrip("\r\n") == header
        except (OSError, UnicodeDecodeError):
            return False

    return check


def npz_members(path: Path) -> set[str] | None:
    """The array names of an ``.npz`` file (None when it is not a readable zip)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return {name.removesuffix(".npy") for name in archive.namelist()}
    except (OSError, zipfile.BadZipFile, ValueError):
        return None


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


def write_json(path: str | os.PathLike[str], value: Any, *, label: str = "output") -> Path:
    """Write :func:`to_json` of ``value`` (plus a final newline) to ``path`` atomically."""
    with atomic_output(path, label=label) as handle:  # the path itself: "" is refused, not "."
        handle.write(to_json(value) + "\n")
    return Path(path)
