"""The checks' machinery (:mod:`oversmooth.simulator.checks.core`): parameter spaces, validation
of an instance's parameters, the per-check seeds and the runner that turns failures into data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oversmooth.simulator import checks
from oversmooth.simulator.checks import Check, Choice, FloatRange, IntRange
from oversmooth.simulator.checks.core import run_checks
from oversmooth.simulator.errors import InputError

BY_NAME = {check.name: check for check in checks.CHECKS}


# Moved from tests/simulator/test_checks.py.
def _broken_check() -> Check:
    """Fails on every instance with x >= 7; the margin says by how much."""
    return Check(
        name="broken",
        claim=1,
        statement="x is below 7",
        unit="7 - x",
        space={"x": IntRange(0, 9), "seed": checks.SEED},
        body=lambda params: 6.5 - params["x"],
    )


# Moved from tests/simulator/test_checks.py.
def _raising_check() -> Check:
    def body(params: dict) -> float:
        raise ZeroDivisionError("deliberate")

    return Check("raises", 2, "never runs", "none", {"seed": checks.SEED}, body)


# Moved from tests/simulator/test_checks.py.
def test_a_broken_check_fails_with_a_seed_that_reproduces_the_worst_case() -> None:
    broken = _broken_check()
    (result,) = checks.verify(examples=40, seed=3, checks=[broken])
    assert not result.passed
    assert result.failing_seed is not None
    reproduced = checks.run_case(broken, result.failing_seed)
    assert reproduced < 0
    assert reproduced == result.worst_margin == -2.5  # x = 9 is drawn among 40 cases


# Moved from tests/simulator/test_checks.py.
def test_a_raising_check_is_a_failed_result_not_an_exception() -> None:
    (result,) = checks.verify(examples=2, checks=[_raising_check()])
    assert not result.passed
    assert result.worst_margin == -math.inf
    assert "ZeroDivisionError" in result.error
    assert result.as_dict()["worst_margin"] is None


# Moved from tests/simulator/test_checks.py.
def test_nan_margins_count_as_failures() -> None:
    nan_check = Check("nan", 3, "nan", "none", {"seed": checks.SEED}, lambda params: math.nan)
    (result,) = checks.verify(examples=2, checks=[nan_check])
    assert not result.passed
    assert result.failing_seed is not None


# Moved from tests/simulator/test_checks.py.
def test_verify_is_reproducible_and_seeds_depend_on_the_check() -> None:
    first = checks.verify(examples=4, seed=11, names=["closed_form"])[0]
    again = checks.verify(examples=4, seed=11, names=["closed_form"])[0]
    assert first.worst_margin == again.worst_margin
    assert checks.case_seeds("a", 11, 4) == checks.case_seeds("a", 11, 4)
    assert checks.case_seeds("a", 11, 4) != checks.case_seeds("b", 11, 4)
    assert checks.case_seeds("a", 11, 4) != checks.case_seeds("a", 12, 4)


# Moved from tests/simulator/test_checks.py.
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"examples": 0}, r"`examples` must be a positive integer; got 0"),
        ({"examples": 2.5}, r"`examples` must be a positive integer"),
        ({"seed": -1}, r"`seed` must be a non-negative integer; got -1"),
        ({"names": ["vec_identiy"]}, r"did you mean 'vec_identity'"),
    ],
)
def test_verify_rejects_bad_arguments(kwargs: dict, pattern: str) -> None:
    with pytest.raises(InputError, match=pattern):
        checks.verify(**kwargs)


# Moved from tests/simulator/test_checks.py.
def test_run_rejects_params_with_missing_or_unknown_keys() -> None:
    check = BY_NAME["vec_identity"]
    params = check.draw(0)
    with pytest.raises(InputError, match="missing \\['seed'\\]"):
        check.run({k: v for k, v in params.items() if k != "seed"})
    with pytest.raises(InputError, match="unknown \\['extra'\\]"):
        check.run({**params, "extra": 1})


# Moved from tests/simulator/test_checks.py.
def test_run_rejects_out_of_range_params() -> None:
    check = BY_NAME["vec_identity"]
    with pytest.raises(InputError, match=r"`params\['n'\]` must be in"):
        check.run({**check.draw(0), "n": 1000})


# Moved from tests/simulator/test_checks.py.
@pytest.mark.parametrize(
    ("spec", "inside", "outside"),
    [
        (IntRange(1, 3), 2, 4),
        (FloatRange(0.0, 1.0), 0.5, 1.5),
        (Choice(("a", "b")), "a", "c"),
    ],
)
def test_param_specs_sample_inside_themselves(spec, inside, outside) -> None:
    gen = np.random.default_rng(0)
    assert all(spec.contains(spec.sample(gen)) for _ in range(20))
    assert spec.contains(inside)
    assert not spec.contains(outside)
    assert not IntRange(0, 5).contains(True)


def _margin_check(name: str, margin: float) -> Check:
    return Check(name, 1, "fixed", "none", {"seed": checks.SEED}, lambda params: margin)


def test_run_checks_takes_a_pool_and_one_name_or_many_in_their_order() -> None:
    pool = [_margin_check("a", 1.0), _margin_check("b", 2.0), _margin_check("c", -1.0)]
    results = run_checks(pool, examples=2, seed=0, names=["c", "a"])
    assert [(r.name, r.worst_margin, r.passed) for r in results] == [
        ("c", -1.0, False),
        ("a", 1.0, True),
    ]
    (single,) = run_checks(pool, examples=1, seed=0, names="b")
    assert single.name == "b"
    assert [r.name for r in run_checks(pool, examples=1, seed=0, names=None)] == ["a", "b", "c"]


def test_case_seeds_are_the_seed_sequence_of_the_run_and_the_name() -> None:
    import zlib

    expected = np.random.SeedSequence([11, zlib.crc32(b"a")]).generate_state(4, dtype=np.uint32)
    assert checks.case_seeds("a", 11, 4) == [int(s) for s in expected]
    # the first seeds of a longer run are those of a shorter one: more examples extend the run
    assert checks.case_seeds("a", 11, 6)[:4] == checks.case_seeds("a", 11, 4)


def test_a_passing_result_keeps_its_finite_margin_in_the_dict() -> None:
    (result,) = run_checks([_margin_check("ok", 0.25)], examples=3, seed=1, names=None)
    data = result.as_dict()
    assert data["worst_margin"] == 0.25
    assert (data["passed"], data["failing_seed"], data["cases"]) == (True, None, 3)


def test_validate_refuses_a_non_mapping_and_bools_for_numbers() -> None:
    check = Check("v", 1, "s", "u", {"n": IntRange(1, 3), "x": FloatRange(0.0, 1.0)}, len)
    with pytest.raises(InputError, match="must be a mapping; got list"):
        check.validate([1, 2])
    with pytest.raises(InputError, match=r"`params\['n'\]`"):
        check.validate({"n": True, "x": 0.5})
    with pytest.raises(InputError, match=r"`params\['x'\]`"):
        check.validate({"n": 2, "x": False})
    check.validate({"n": np.int64(2), "x": 1})  # numpy ints and plain ints are numbers
