"""The dispatcher's contract: one line per error, exit 130 on Ctrl-C even while starting."""

from __future__ import annotations

import argparse

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
