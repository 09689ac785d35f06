"""The shared error classes and their one-line messages (:mod:`oversmooth.simulator.errors`)."""

from __future__ import annotations

import pytest

from oversmooth.simulator.errors import InputError, NumericalFloorWarning, OversmoothError, one_line


@pytest.mark.parametrize(
    ("message", "line"),
    [
        ("two\nlines", "two lines"),
        ("  spaced \t out\r\n  text  ", "spaced out text"),
        (ValueError("bad\n  value"), "bad value"),
        (KeyError("name"), "'name'"),  # str() of a KeyError quotes its key
        (RuntimeError(), "RuntimeError"),  # no text: the class name
        ("", ""),  # an empty string stays empty: only an exception is named
        (42, "42"),
    ],
)
def test_one_line_folds_every_run_of_whitespace(message: object, line: str) -> None:
    assert one_line(message) == line


def test_an_input_error_is_a_value_error_that_exits_2() -> None:
    assert issubclass(InputError, OversmoothError)
    assert issubclass(InputError, ValueError)
    assert InputError("x").exit_code == OversmoothError.exit_code == 2
    assert issubclass(NumericalFloorWarning, RuntimeWarning)
