"""The ``oversmooth`` command: one dispatcher, subcommands registered by each package.

The simulator registers its own subcommands here; other installed packages add theirs through the
``oversmooth.commands`` entry-point group (a callable taking the argparse subparsers object), so this
module never imports them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import NoReturn

from simulator.errors import OversmoothError, one_line

ENTRY_POINT_GROUP = "oversmooth.commands"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    """argparse ``type`` of a count (``--threads``, ``--batch-size``, ...): refused at parse time,
    with the option named, before any work starts."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    return value


def _register_builtin(subparsers: argparse._SubParsersAction) -> None:
    from simulator import commands

    commands.register(subparsers)


def _plugins() -> list[Callable[[argparse._SubParsersAction], None]]:
    return [ep.load() for ep in entry_points(group=ENTRY_POINT_GROUP)]


def build_parser() -> argparse.ArgumentParser:
    """The full parser: simulator subcommands plus every registered plugin's."""
    parser = _Parser(prog="oversmooth", description="Study oversmoothing in Transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _register_builtin(subparsers)
    for register in _plugins():
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``oversmooth`` command; returns the exit status (0 ok, 1 failed check, 2 bad input).

    Errors a user can cause print as one line; Ctrl-C at any point, start-up included, prints
    one line and returns 130.
    """
    command = "oversmooth"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        command = f"oversmooth {args.command}"
        return int(args.func(args) or 0)
    except OversmoothError as err:
        print(f"{command}: error: {one_line(err)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
