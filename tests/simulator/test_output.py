"""Output paths: only regular files and our own folders are ever replaced; errors are one line."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.output import (
    atomic_directory,
    atomic_output,
    current_umask,
    to_json,
    write_json,
    write_tidy_csv,
)


def _fifo(path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs named pipes")
    os.mkfifo(path)
    return path


def test_a_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with atomic_output(target) as handle:
        handle.write("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize("make", ["fifo", "folder"])
def test_a_non_regular_file_is_never_replaced(tmp_path: Path, make: str) -> None:
    target = tmp_path / "out"
    if make == "fifo":
        _fifo(target)
    else:
        target.mkdir()
    with pytest.raises(InputError, match="must be a regular file") as info, atomic_output(target):
        pass
    assert "\n" not in str(info.value)
    assert (stat.S_ISFIFO if make == "fifo" else stat.S_ISDIR)(target.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_too_long_name_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(InputError, match="must be a writable file path"),
        atomic_output(tmp_path / ("x" * 300)),
    ):
        pass
    assert list(tmp_path.iterdir()) == []


def test_an_empty_path_is_refused() -> None:
    with pytest.raises(InputError, match="empty string"), atomic_output(""):
        pass


def test_the_writers_refuse_an_empty_path_too() -> None:
    """``Path("")`` is ``"."``: the writers must hand the path itself to atomic_output."""
    with pytest.raises(InputError, match="`--out` must name a file; got an empty string"):
        write_tidy_csv("", ("a",), [(1,)], label="--out")
    with pytest.raises(InputError, match="empty string"):
        write_json("", {"a": 1})


def test_an_error_while_writing_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def interrupted_write() -> None:
        with atomic_output(target) as handle:
            handle.write("half")
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        interrupted_write()
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def _ours(folder: Path) -> bool:
    return (folder / "marker").is_file()


@pytest.mark.parametrize("existing", ["none", "empty", "ours"])
def test_a_folder_is_replaced_when_absent_empty_or_ours(tmp_path: Path, existing: str) -> None:
    target = tmp_path / "report"
    if existing != "none":
        target.mkdir()
    if existing == "ours":
        (target / "marker").write_text("")
        (target / "stale.csv").write_text("")
    with atomic_directory(target, ours=_ours) as staging:
        (staging / "marker").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["marker"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


@pytest.mark.parametrize("existing", ["foreign-folder", "file", "fifo", "symlink"])
def test_a_folder_never_replaces_what_is_not_ours(tmp_path: Path, existing: str) -> None:
    target = tmp_path / "report"
    if existing == "foreign-folder":
        target.mkdir()
        (target / "thesis.tex").write_text("precious")
    elif existing == "file":
        target.write_text("precious")
    elif existing == "fifo":
        _fifo(target)
    else:
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError) as info, atomic_directory(target, ours=_ours):
        pass
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if existing == "foreign-folder":
        assert (target / "thesis.tex").read_text() == "precious"


def test_tidy_csv_round_trips_floats_and_leaves_none_empty(tmp_path: Path) -> None:
    path = write_tidy_csv(tmp_path / "t.csv", ("a", "b"), [(0.1 + 0.2, None), {"a": 1, "b": 2.5}])
    assert path.read_text().splitlines() == ["a,b", "0.30000000000000004,", "1,2.5"]


def test_json_is_strict() -> None:
    text = to_json({"x": [np.float32(0.5), float("nan"), np.inf], "p": Path("a/b")}, indent=None)
    assert json.loads(text) == {"x": [0.5, None, None], "p": "a/b"}
    with pytest.raises(TypeError, match="not JSON serialisable: complex"):
        to_json({"z": 1j})


def test_a_disk_that_fills_mid_write_is_one_line_and_leaves_the_old_file(tmp_path: Path) -> None:
    import errno

    target = tmp_path / "out.csv"
    target.write_text("old")

    def fill_the_disk() -> None:
        with atomic_output(target, label="--out") as handle:
            handle.write("partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(InputError, match="No space left on device") as info:
        fill_the_disk()
    assert "\n" not in str(info.value)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set the process umask for one test, restored afterwards."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


@pytest.mark.parametrize(
    ("mask", "file_mode", "folder_mode"),
    [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)],
)
def test_outputs_take_the_users_umask_not_tempfiles_private_modes(
    tmp_path: Path, umask: Callable[[int], None], mask: int, file_mode: int, folder_mode: int
) -> None:
    """A report written into a shared folder is as readable as a plain ``open`` would make it
    (tempfile's mkstemp/mkdtemp alone give 0600/0700 whatever the umask)."""
    umask(mask)
    assert current_umask() == mask
    with atomic_output(tmp_path / "table.csv", "w") as handle:
        handle.write("a\n")
    with atomic_directory(tmp_path / "report") as staging:
        (staging / "inside.txt").write_text("x")
    assert stat.S_IMODE((tmp_path / "table.csv").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "report").stat().st_mode) == folder_mode
    assert stat.S_IMODE((tmp_path / "report" / "inside.txt").stat().st_mode) == file_mode
