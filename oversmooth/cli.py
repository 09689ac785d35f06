"""The ``oversmooth`` command: one dispatcher over every subcommand of :mod:`oversmooth.commands`.

This is the application layer: it may import the three libraries (``simulator``, ``importers``,
``figures``) and none of them imports it. Only argparse work happens at start-up; each command
imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

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


def _half_built_dask_future(unraisable: Any) -> bool:
    """Whether an unraisable exception is a Dask ``Future`` finalising before it was built.

    A Ctrl-C that lands inside ``distributed``'s ``Future.__init__`` (while a task is being
    submitted to a cluster) leaves a future without its attributes; when it is collected, its
    ``__del__`` raises an ``AttributeError`` that ``distributed`` swallows only at interpreter
    shutdown, so Python prints "Exception ignored in ..." and a traceback beside our one line.
    The future was never submitted: nothing is lost by ignoring it.
    """
    finaliser = unraisable.object
    return (
        isinstance(unraisable.exc_type, type)
        and issubclass(unraisable.exc_type, AttributeError)
        and getattr(finaliser, "__qualname__", None) == "Future.__del__"
        and getattr(finaliser, "__module__", "").startswith("distributed.")
    )


@contextlib.contextmanager
def _quiet_half_built_dask_futures() -> Iterator[None]:
    """While inside, :func:`_half_built_dask_future` events are dropped; every other unraisable
    exception goes to the hook that was set before."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _half_built_dask_future(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``oversmooth`` command; returns the exit status (0 ok, 1 failed check, 2 bad input).

    Errors a user can cause print as one line; Ctrl-C at any point, start-up included, prints
    one line and returns 130 (also when it interrupts a task's submission to a Dask cluster,
    :func:`_half_built_dask_future`).
    """
    with _quiet_half_built_dask_futures():
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
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
