"""Claims 1-11 (:mod:`oversmooth.simulator.checks.linear_algebra`): the registry and the spec's
counterexamples of claim 11."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oversmooth.simulator import theory
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.checks import CHECKS, linear_algebra

BY_NAME = {check.name: check for check in CHECKS}


# Moved from tests/simulator/test_checks.py.
def _two_token_attention(a: float) -> np.ndarray:
    return np.array([[1.0 - a, a], [a, 1.0 - a]])


# Moved from tests/simulator/test_checks.py.
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


# Moved from tests/simulator/test_checks.py.
def test_claim_11_counterexample_check_fails_inside_the_bound() -> None:
    # Inside [-1, 0) S5 holds, so the same construction must not be Perron-dominated.
    assert theory.dominance(_two_token_attention(0.25), [[-0.9]]).kind == "non-perron"


# Moved from tests/simulator/test_checks_complex_s5.py.
def test_claim_11_complex_check_family_contains_the_example() -> None:
    # alpha = 0.5 gives spec(A) in [0.5, 1]; y = 0.9 clears the boundary sqrt(2/1.5 - 1) by > 0.1.
    assert 0.9 - math.sqrt(2.0 / 1.5 - 1.0) > 0.1
    check = BY_NAME["s5_needs_real_h"]
    assert check.counterexample
    assert check.claim == 11


def test_the_module_registers_claims_1_to_11_with_claim_11s_counterexamples() -> None:
    assert sorted({check.claim for check in linear_algebra.CHECKS}) == list(range(1, 12))
    counterexamples = {check.claim for check in linear_algebra.CHECKS if check.counterexample}
    assert counterexamples == {11}
    assert [c.claim for c in linear_algebra.CHECKS] == sorted(
        c.claim for c in linear_algebra.CHECKS
    )
