"""Validation at public boundaries (simulator.validation): what passes, and the one-line refusals.

Every refusal is an :class:`~oversmooth.simulator.errors.InputError` (or the subclass a caller
names) whose message names the argument and what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.tolerances import STOCHASTIC_ATOL
from oversmooth.simulator.validation import (
    as_float_array,
    as_generator,
    as_row_stochastic,
    as_square,
    as_tokens,
    check_choice,
    check_positive_int,
    regular_file,
)


class OwnError(InputError):
    """A package's own InputError, as the importer raises."""


# -- seeds -----------------------------------------------------------------------------------------


def test_a_generator_is_passed_through_and_an_int_seed_is_reproducible() -> None:
    generator = np.random.default_rng(3)
    assert as_generator(generator) is generator
    assert as_generator(5).random() == np.random.default_rng(5).random()
    assert as_generator(np.int64(5)).random() == np.random.default_rng(5).random()
    assert isinstance(as_generator(None), np.random.Generator)


@pytest.mark.parametrize("seed", [-1, 1.5, "7", [1]])
def test_a_seed_that_is_not_a_non_negative_integer_is_refused(seed: object) -> None:
    with pytest.raises(InputError, match=r"`seed` must be a non-negative integer"):
        as_generator(seed)  # type: ignore[arg-type]
    with pytest.raises(OwnError):
        as_generator(seed, error=OwnError)  # type: ignore[arg-type]


# -- arrays ----------------------------------------------------------------------------------------


def test_numbers_become_float64_arrays() -> None:
    array = as_float_array([[1, 2], [3, 4]], "M", min_ndim=2)
    assert array.dtype == np.float64
    np.testing.assert_array_equal(array, [[1.0, 2.0], [3.0, 4.0]])
    assert as_float_array(np.float32(0.5), "x").shape == ()


def test_non_numeric_input_is_refused_by_name() -> None:
    with pytest.raises(InputError, match=r"`M` must be a real numeric array; got str"):
        as_float_array("abc", "M")
    with pytest.raises(InputError, match="real numeric"):
        as_float_array([[1.0], [1.0, 2.0]], "M")  # ragged


def test_too_few_axes_are_refused_with_the_shape() -> None:
    with pytest.raises(InputError, match=r"`X` must have at least 2 axes; got shape \(3,\)"):
        as_tokens([1.0, 2.0, 3.0])


def test_non_finite_entries_are_counted_in_the_refusal() -> None:
    with pytest.raises(OwnError, match=r"`v` must be finite; got 2 NaN or inf entries"):
        as_float_array([1.0, np.nan, -np.inf, 4.0], "v", error=OwnError)


def test_square_batches_pass_and_rectangular_ones_are_refused() -> None:
    assert as_square(np.zeros((4, 3, 3)), "H").shape == (4, 3, 3)
    with pytest.raises(
        InputError, match=r"`H` must be square \(\.\.\., k, k\); got shape \(3, 2\)"
    ):
        as_square(np.zeros((3, 2)), "H")


def test_row_stochastic_matrices_pass_within_the_tolerance() -> None:
    A = np.array([[0.25, 0.75], [1.0, 0.0]])
    np.testing.assert_array_equal(as_row_stochastic(A), A)
    near = A.copy()
    near[0, 0] += 0.5 * STOCHASTIC_ATOL
    np.testing.assert_array_equal(as_row_stochastic(near), near)


def test_a_negative_entry_or_a_row_sum_off_by_more_than_the_tolerance_is_refused() -> None:
    negative = np.array([[1.1, -0.1], [0.5, 0.5]])
    with pytest.raises(
        InputError, match=r"`A` must be row-stochastic \(nonnegative entries\); got min -0\.1"
    ):
        as_row_stochastic(negative)
    loose = np.array([[0.5, 0.5], [0.5, 0.5 + 3 * STOCHASTIC_ATOL]])
    with pytest.raises(
        InputError, match=r"rows summing to 1 within 1e-08\); got a row sum off by 3e-08"
    ):
        as_row_stochastic(loose, "P")  # the name is used too
    with pytest.raises(InputError, match=r"^`P`"):
        as_row_stochastic(loose, "P")


# -- scalars ---------------------------------------------------------------------------------------


def test_positive_integers_pass_as_int() -> None:
    assert check_positive_int(3, "layers") == 3
    value = check_positive_int(np.int32(4), "layers")
    assert value == 4
    assert type(value) is int


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "3", None])
def test_anything_else_is_not_a_positive_integer(value: object) -> None:
    with pytest.raises(OwnError, match=r"`layers` must be a positive integer; got "):
        check_positive_int(value, "layers", error=OwnError)


def test_a_choice_is_one_of_the_options_listed_in_the_refusal() -> None:
    assert check_choice("mean", "how", ("mean", "max")) == "mean"
    with pytest.raises(InputError, match=r"`how` must be one of mean, max; got 'sum'"):
        check_choice("sum", "how", ("mean", "max"))


# -- files -----------------------------------------------------------------------------------------


def test_a_regular_file_is_returned_as_a_path(tmp_path: Path) -> None:
    file = tmp_path / "system.npz"
    file.write_bytes(b"x")
    assert regular_file(str(file), "system") == file


def test_a_missing_file_or_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"`system` must be an existing file; .*\(no such file\)"):
        regular_file(tmp_path / "absent.npz", "system")
    with pytest.raises(OwnError, match=r"must be a regular file; .*\(not a regular file\)"):
        regular_file(tmp_path, "system", error=OwnError)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "feeds"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        regular_file(fifo, "inputs")
