"""The claims as data: every registered check holds on hypothesis-drawn instances (claims 1-30 and
34-35).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversmooth.simulator import checks, theory
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.checks import CHECKS, Check, CheckResult, Choice, FloatRange, IntRange
from oversmooth.simulator.errors import InputError
from tests.strategies import check_params, seeds

BY_NAME = {check.name: check for check in CHECKS}


# ----------------------------------------------------------------------------------------------
# every claim holds (or, for counterexample checks, its implication fails as the spec says)
# ----------------------------------------------------------------------------------------------


#: Checks that iterate hundreds to thousands of layers per instance (claims 12-18, 20, 21's medians).
LONG_RUNS = {c.name for c in CHECKS if 12 <= c.claim <= 20 and c.claim != 19} | {"pre_ln_sign_flip"}
SHORT = [check for check in CHECKS if check.name not in LONG_RUNS]
LONG = [check for check in CHECKS if check.name in LONG_RUNS]


def _assert_holds(check: Check, params: dict) -> None:
    margin = check.run(params)
    assert margin >= 0, f"claim {check.claim} ({check.name}) failed: margin {margin} on {params}"


@pytest.mark.parametrize("check", SHORT, ids=lambda check: check.name)
@given(data=st.data())
def test_check_holds_on_drawn_instances(check: Check, data: st.DataObject) -> None:
    _assert_holds(check, data.draw(check_params(check), label="params"))


@pytest.mark.parametrize("check", LONG, ids=lambda check: check.name)
@settings(max_examples=max(8, settings.default.max_examples // 4))
@given(data=st.data())
def test_long_run_check_holds_on_drawn_instances(check: Check, data: st.DataObject) -> None:
    _assert_holds(check, data.draw(check_params(check), label="params"))


def _two_token_attention(a: float) -> np.ndarray:
    return np.array([[1.0 - a, a], [a, 1.0 - a]])


def test_claim_11_spec_instances_are_perron_dominated() -> None:
    # The two counterexamples of docs/theory.md claim 11, exactly as written there.
    assert BY_NAME["s5_bound_needed_2x2"].run({"a": 0.25, "h": -1.9}) > 0
    spec_a = theory.dominance(_two_token_attention(0.25), [[-1.9]])
    assert spec_a.kind == "perron"
    assert spec_a.mu.real == pytest.approx(-0.9, rel=tol.STEP_RTOL)
    # lambda^A_1 = 0.1 (a = 0.45) with lambda^H = -5: |mu| = 4 (Perron) against 0.5.
    spec_b = theory.dominance(_two_token_attention(0.45), [[-5.0]])
    assert spec_b.kind == "perron"
    assert spec_b.modulus == pytest.approx(4.0, rel=tol.STEP_RTOL)


def test_claim_11_counterexample_check_fails_inside_the_bound() -> None:
    # Inside [-1, 0) S5 holds, so the same construction must not be Perron-dominated.
    assert theory.dominance(_two_token_attention(0.25), [[-0.9]]).kind == "non-perron"


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------


def test_registry_covers_at_least_25_distinct_claims_of_1_to_30_and_claims_34_35() -> None:
    claims = {check.claim for check in CHECKS}
    assert claims <= set(range(1, 31)) | {34, 35}
    assert {34, 35} <= claims
    assert len(claims) >= 27
    assert len(CHECKS) >= 25


def test_registry_names_are_unique_snake_case_and_statements_one_line() -> None:
    names = [check.name for check in CHECKS]
    assert len(set(names)) == len(names)
    for check in CHECKS:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", check.name), check.name
        assert check.statement
        assert "\n" not in check.statement
        assert check.unit
        assert "\n" not in check.unit


def test_the_spec_counterexamples_are_registered() -> None:
    counterexamples = {check.claim for check in CHECKS if check.counterexample}
    assert {11, 17} <= counterexamples


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.name)
@given(seed=seeds())
def test_draw_stays_in_the_space_and_is_reproducible(check: Check, seed: int) -> None:
    params = check.draw(seed)
    check.validate(params)
    assert params == check.draw(seed)
    for value in params.values():
        assert isinstance(value, int | float | str)


# ----------------------------------------------------------------------------------------------
# verify(): results are data, failures reproduce
# ----------------------------------------------------------------------------------------------


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


def _raising_check() -> Check:
    def body(params: dict) -> float:
        raise ZeroDivisionError("deliberate")

    return Check("raises", 2, "never runs", "none", {"seed": checks.SEED}, body)


def test_verify_returns_data_for_each_requested_check() -> None:
    names = ["vec_identity", "dong_vs_rank1", "frequency_split"]
    results = checks.verify(examples=3, seed=5, names=names)
    assert [result.name for result in results] == names
    for result in results:
        assert isinstance(result, CheckResult)
        assert result.cases == 3
        assert result.passed
        assert result.failing_seed is None
        assert result.error is None
        assert result.worst_margin >= 0
        assert result.seconds >= 0
        assert result.claim == BY_NAME[result.name].claim
        json.dumps(result.as_dict(), allow_nan=False)


def test_a_broken_check_fails_with_a_seed_that_reproduces_the_worst_case() -> None:
    broken = _broken_check()
    (result,) = checks.verify(examples=40, seed=3, checks=[broken])
    assert not result.passed
    assert result.failing_seed is not None
    reproduced = checks.run_case(broken, result.failing_seed)
    assert reproduced < 0
    assert reproduced == result.worst_margin == -2.5  # x = 9 is drawn among 40 cases


def test_a_raising_check_is_a_failed_result_not_an_exception() -> None:
    (result,) = checks.verify(examples=2, checks=[_raising_check()])
    assert not result.passed
    assert result.worst_margin == -math.inf
    assert "ZeroDivisionError" in result.error
    assert result.as_dict()["worst_margin"] is None


def test_nan_margins_count_as_failures() -> None:
    nan_check = Check("nan", 3, "nan", "none", {"seed": checks.SEED}, lambda params: math.nan)
    (result,) = checks.verify(examples=2, checks=[nan_check])
    assert not result.passed
    assert result.failing_seed is not None


def test_verify_is_reproducible_and_seeds_depend_on_the_check() -> None:
    first = checks.verify(examples=4, seed=11, names=["closed_form"])[0]
    again = checks.verify(examples=4, seed=11, names=["closed_form"])[0]
    assert first.worst_margin == again.worst_margin
    assert checks.case_seeds("a", 11, 4) == checks.case_seeds("a", 11, 4)
    assert checks.case_seeds("a", 11, 4) != checks.case_seeds("b", 11, 4)
    assert checks.case_seeds("a", 11, 4) != checks.case_seeds("a", 12, 4)


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


# ----------------------------------------------------------------------------------------------
# parameter validation
# ----------------------------------------------------------------------------------------------


def test_run_rejects_params_with_missing_or_unknown_keys() -> None:
    check = BY_NAME["vec_identity"]
    params = check.draw(0)
    with pytest.raises(InputError, match="missing \\['seed'\\]"):
        check.run({k: v for k, v in params.items() if k != "seed"})
    with pytest.raises(InputError, match="unknown \\['extra'\\]"):
        check.run({**params, "extra": 1})


def test_run_rejects_out_of_range_params() -> None:
    check = BY_NAME["vec_identity"]
    with pytest.raises(InputError, match=r"`params\['n'\]` must be in"):
        check.run({**check.draw(0), "n": 1000})


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


# Instances that once failed (found by wider `oversmooth verify` runs); each stays a regression test.
REGRESSIONS = (
    # claim 13: the layer budget ended before HFC/LFC reached 1e10 (growth slows near saturation)
    (
        "doubly_stochastic_divergence",
        None,
        {"n": 11, "d": 6, "scale": 1.0, "h_low": 0.25, "h_ratio": 0.25, "seed": 89123},
    ),
    # claim 17: the rank-two limit's rate must count the other modes of the dominating rows
    ("balanced_no_rank_collapse", 2613704626, None),
    # claim 14: a limit of 3.6e5 (u_1 nearly orthogonal to 1) amplifies the LFC's corrections
    ("non_perron_hfc_limit", 3776124960, None),
)


@pytest.mark.parametrize(("name", "case_seed", "params"), REGRESSIONS)
def test_former_counterexamples_now_hold(
    name: str, case_seed: int | None, params: dict | None
) -> None:
    check = next(c for c in checks.CHECKS if c.name == name)
    margin = checks.run_case(check, case_seed) if params is None else check.run(params)
    assert margin >= 0, f"{name}: margin {margin}"
