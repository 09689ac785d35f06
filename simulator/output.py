"""Output helpers: atomic files and folders (an error leaves nothing behind), and provenance."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import IO


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
