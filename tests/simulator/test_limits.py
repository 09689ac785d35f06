"""Size limits (simulator.limits): defaults, their environment variables, and the one-line refusals.

What each reader does with a declared size (``.npz`` headers, images, text files, random feeds) is
tested across the importers in tests/importers/test_limits.py; here, the limits themselves.
"""

from __future__ import annotations

import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.limits import LIMITS, check_elements, check_size, limit


class OwnError(InputError):
    """A package's own InputError, as the importer raises."""


@pytest.fixture
def elements_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """``max_elements`` set to 1000 through its environment variable."""
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "1000")
    return 1000


def test_limits_are_configurable_and_checked(monkeypatch):
    for name, (default, variable, _) in LIMITS.items():
        assert limit(name) == default
        monkeypatch.setenv(variable, "12345")
        assert limit(name) == 12345
        monkeypatch.setenv(variable, "-1")
        with pytest.raises(ValueError, match=variable):
            limit(name)
        monkeypatch.delenv(variable)


def test_the_documented_defaults() -> None:
    """The table of the module docstring, number by number."""
    defaults = {name: default for name, (default, _, _) in LIMITS.items()}
    assert defaults == {
        "max_elements": 268_435_456,
        "max_image_side": 4096,
        "max_text_bytes": 67_108_864,
        "max_examples": 1_000_000,
        "max_sweep_cells": 100_000,
    }
    assert {variable for _, variable, _ in LIMITS.values()} == {
        "OVERSMOOTH_MAX_ELEMENTS",
        "OVERSMOOTH_MAX_IMAGE_SIDE",
        "OVERSMOOTH_MAX_TEXT_BYTES",
        "OVERSMOOTH_MAX_EXAMPLES",
        "OVERSMOOTH_MAX_SWEEP_CELLS",
    }


@pytest.mark.parametrize("text", ["0", "ten", "1e6", "  "])
def test_a_variable_that_is_not_a_positive_integer_is_refused(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("OVERSMOOTH_MAX_EXAMPLES", text)
    with pytest.raises(InputError, match=r"`OVERSMOOTH_MAX_EXAMPLES` must be a positive integer"):
        limit("max_examples")


def test_an_empty_variable_means_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERSMOOTH_MAX_EXAMPLES", "")
    assert limit("max_examples") == 10**6


def test_a_size_at_the_limit_passes_and_one_above_is_refused_naming_the_variable(
    elements_limit: int,
) -> None:
    assert check_size(elements_limit, "n", "max_elements") == elements_limit
    with pytest.raises(OwnError) as info:
        check_size(elements_limit + 1, "n", "max_elements", error=OwnError)
    assert str(info.value) == (
        "`n` must be at most 1,000 (elements in one array; raise OVERSMOOTH_MAX_ELEMENTS to "
        "allow more); got 1,001"
    )


def test_a_shape_is_checked_by_its_product(elements_limit: int) -> None:
    assert check_elements([10, 100], "X") == (10, 100)
    assert check_elements((), "scalar") == ()
    with pytest.raises(InputError, match=r"`X \(shape \(10, 101\)\)` must be at most 1,000"):
        check_elements((10, 101), "X")


def test_a_huge_shape_is_refused_before_anything_is_allocated() -> None:
    with pytest.raises(InputError, match="OVERSMOOTH_MAX_ELEMENTS"):
        check_elements((2**40, 2**40), "A")


def test_a_negative_size_is_refused_even_when_the_product_is_small() -> None:
    with pytest.raises(OwnError, match=r"`A` must have non-negative sizes; got shape \(-1, 4\)"):
        check_elements((-1, 4), "A", error=OwnError)
    with pytest.raises(InputError, match="non-negative sizes"):
        check_elements((-2, -3), "A")  # product 6, but no array has these sizes
