"""The claims as data: every registered check holds on hypothesis-drawn instances (claims 1-30 and
34-35), the registry, and ``verify`` over registered checks.

Each claim module's own tests, and the machinery's, sit in ``tests/simulator/checks/``.
"""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oversmooth.simulator import checks
from oversmooth.simulator.checks import CHECKS, Check, CheckResult
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


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------


def test_divergence_holds_where_h_annihilates_the_perron_mode() -> None:
    """λ^H = −1 against A's Perron root 1 (the space's corner h_low = h_ratio = 1, d = 1, which
    hypothesis found): every Perron mode is zero, the predicted growth infinite; the first layer
    sends HFC/LFC to round-off's ceiling, so claim 13 holds, rather than dividing by zero."""
    params = {"n": 4, "d": 1, "scale": 1.4375, "h_low": 1.0, "h_ratio": 1.0, "seed": 83878}
    _assert_holds(BY_NAME["doubly_stochastic_divergence"], params)


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
