"""Exception and warning classes shared by every oversmooth package.

Every error a user can cause derives from :class:`OversmoothError`; the command line turns it into a
one-line message and the exit status in :attr:`OversmoothError.exit_code`.
"""

from __future__ import annotations

__all__ = ["InputError", "NumericalFloorWarning", "OversmoothError", "one_line"]


class OversmoothError(Exception):
    """Base class of the errors a user can cause; ``exit_code`` is what the CLI returns."""

    exit_code = 2


class InputError(OversmoothError, ValueError):
    """An argument has the wrong shape, type, value or content."""


class NumericalFloorWarning(RuntimeWarning):
    """A quantity reached the float64 floor; results past it are round-off."""


def one_line(message: object) -> str:
    """``message`` (often an exception) as one line: every run of whitespace becomes one space; an
    exception without text gives its class name. Every error a user sees passes through this."""
    text = " ".join(str(message).split())
    if not text and isinstance(message, BaseException):
        return type(message).__name__
    return text
