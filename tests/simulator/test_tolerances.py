"""The one table of tolerances (:mod:`oversmooth.simulator.tolerances`): every entry a positive,
finite number, and the iterated tolerance's growth with the steps and the scale."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oversmooth.simulator import tolerances
from oversmooth.simulator.tolerances import EPS, iterated_atol

TABLE = {name: value for name, value in vars(tolerances).items() if name.isupper()}


def test_eps_is_float64s() -> None:
    assert np.finfo(np.float64).eps == EPS


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_tolerance_is_a_positive_finite_number(name: str) -> None:
    value = TABLE[name]
    assert isinstance(value, float), name
    assert math.isfinite(value)
    assert value > 0


def test_the_iterated_tolerance_is_c_steps_eps_times_the_scale() -> None:
    assert iterated_atol(40, 2.0) == pytest.approx(10.0 * 40 * EPS * 2.0)
    assert iterated_atol(40, 2.0, c=3.0) == pytest.approx(3.0 * 40 * EPS * 2.0)
    assert iterated_atol(0, 5.0) == 0.0
    assert iterated_atol(80, 1.0) == pytest.approx(2 * iterated_atol(40, 1.0))
