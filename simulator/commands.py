"""Register the simulator's subcommands (``simulate``, ``verify``) with the dispatcher."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the simulator's subcommands to ``subparsers``."""
    from simulator import cmd_simulate, cmd_verify

    cmd_simulate.register(subparsers)
    cmd_verify.register(subparsers)
