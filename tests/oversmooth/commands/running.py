"""Running ``oversmooth`` subcommands in this process, for the command tests."""

from __future__ import annotations

from oversmooth.cli import main

__all__ = ["run_cli"]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of ``oversmooth ARGV`` (each argument made a string)."""
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err
