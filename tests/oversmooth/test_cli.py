"""The dispatcher's contract: one line per error, exit 130 on Ctrl-C even while starting."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from oversmooth import cli
from oversmooth.simulator.errors import InputError, one_line


def test_ctrl_c_while_the_cli_is_starting_is_one_line(monkeypatch, capsys) -> None:
    def interrupted() -> argparse.ArgumentParser:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["verify"]) == 130
    assert capsys.readouterr().err == "oversmooth: interrupted\n"


def test_a_multi_line_error_is_printed_as_one_line(monkeypatch, capsys) -> None:
    def failing(_args: argparse.Namespace) -> int:
        raise InputError("first line\n  second line\twith a tab")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser.set_defaults(func=failing)
    for action in parser._subparsers._group_actions:  # every subcommand runs `failing`
        for sub in action.choices.values():
            sub.set_defaults(func=failing)
    assert cli.main(["verify"]) == 2
    assert capsys.readouterr().err == (
        "oversmooth verify: error: first line second line with a tab\n"
    )


@pytest.mark.parametrize("message", ["a\nb", "  spaced  \n\n out  "])
def test_one_line_collapses_whitespace(message: str) -> None:
    assert "\n" not in one_line(message)
    assert "  " not in one_line(message)


def test_one_line_names_an_exception_without_text() -> None:
    assert one_line(ValueError()) == "ValueError"
    assert one_line("") == ""


def _half_built_future() -> None:
    """Make and drop a Dask future whose ``__init__`` never ran, as a Ctrl-C inside it leaves."""
    from distributed import Future

    future = Future.__new__(Future)
    del future


def test_a_ctrl_c_inside_a_dask_submission_leaves_no_ignored_exception_text(monkeypatch) -> None:
    """The flaky sweep test's stderr once held "Exception ignored in: <function Future.__del__>"
    before the one line: the hook the CLI runs under drops exactly that event."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    _half_built_future()
    assert len(seen) == 1  # the event is real without the filter
    assert seen[0].exc_type is AttributeError
    with cli._quiet_half_built_dask_futures():
        _half_built_future()
        sys.unraisablehook(types.SimpleNamespace(exc_type=ValueError, object=print))
        sys.unraisablehook(types.SimpleNamespace(exc_type=AttributeError, object=Path.__init__))
    assert [event.object for event in seen[1:]] == [print, Path.__init__]
    assert sys.unraisablehook == seen.append  # restored


def test_main_restores_the_unraisable_hook(monkeypatch, capsys) -> None:
    def interrupted() -> argparse.ArgumentParser:
        raise KeyboardInterrupt

    def mine(_unraisable: Any) -> None:
        return None

    monkeypatch.setattr(sys, "unraisablehook", mine)
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["verify"]) == 130
    assert sys.unraisablehook is mine
