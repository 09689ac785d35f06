"""Claims 12-20 (:mod:`oversmooth.simulator.checks.layer_dynamics`): the registry and the instances
that once failed."""

from __future__ import annotations

import pytest

from oversmooth.simulator import checks
from oversmooth.simulator.checks import layer_dynamics

# Moved from tests/simulator/test_checks.py.
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


# Moved from tests/simulator/test_checks.py.
@pytest.mark.parametrize(("name", "case_seed", "params"), REGRESSIONS)
def test_former_counterexamples_now_hold(
    name: str, case_seed: int | None, params: dict | None
) -> None:
    check = next(c for c in checks.CHECKS if c.name == name)
    margin = checks.run_case(check, case_seed) if params is None else check.run(params)
    assert margin >= 0, f"{name}: margin {margin}"


def test_the_module_registers_claims_12_to_20_with_claim_17s_counterexample() -> None:
    assert sorted({check.claim for check in layer_dynamics.CHECKS}) == list(range(12, 21))
    counterexamples = [check.claim for check in layer_dynamics.CHECKS if check.counterexample]
    assert counterexamples == [17]
