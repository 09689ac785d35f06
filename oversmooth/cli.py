"""The ``oversmooth`` command: one dispatcher over every subcommand of :mod:`oversmooth.commands`.

This is the application layer: it may import the three libraries (``simulator``, ``importers``,
``figures``) and none of them imports it. Only argparse work happens at start-up; each command
imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from oversmooth.simulator.errors import OversmoothError, one_line


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The full parser: every subcommand of :mod:`oversmooth.commands`."""
    from oversmooth import commands

    parser = _Parser(prog="oversmooth", description="Study oversmoothing in Transformers.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    commands.register(subparsers)
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
