"""Claims 21-24 (:mod:`oversmooth.simulator.checks.reparameterization`): the registry and the
Pre-LN medians behind claim 21."""

from __future__ import annotations

from oversmooth.simulator.checks import CHECKS, reparameterization

BY_NAME = {check.name: check for check in CHECKS}


# Moved from tests/simulator/test_checks_complex_s5.py.
def test_claim_21_the_four_pre_ln_systems_are_different() -> None:
    check = BY_NAME["pre_ln_sign_flip"]
    median = reparameterization.pre_ln_medians(check.draw(3))
    # With H- = -H+ these pairs were the same system, hence exactly equal medians.
    assert median[-1.0, 1.0] != median[1.0, -1.0]
    assert median[1.0, 1.0] != median[-1.0, -1.0]
    assert median[-1.0, 1.0] > median[1.0, 1.0]
    assert median[1.0, -1.0] > median[-1.0, -1.0]


def test_the_module_registers_claims_21_to_24_none_a_counterexample() -> None:
    assert sorted({check.claim for check in reparameterization.CHECKS}) == list(range(21, 25))
    assert not any(check.counterexample for check in reparameterization.CHECKS)


def test_pre_ln_medians_are_reproducible_from_the_instance() -> None:
    params = BY_NAME["pre_ln_sign_flip"].draw(5)
    median = reparameterization.pre_ln_medians(params)
    assert set(median) == {(h, g) for h in (1.0, -1.0) for g in (1.0, -1.0)}
    assert reparameterization.pre_ln_medians(params) == median
