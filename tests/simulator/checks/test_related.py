"""Claims 25-30 (:mod:`oversmooth.simulator.checks.related`): related methods against the rank-one
residual. Every check's instances run in ``tests/simulator/test_checks.py``; here, the registry."""

from __future__ import annotations

from oversmooth.simulator.checks import CHECKS, related


def test_the_module_registers_claims_25_to_30_none_a_counterexample() -> None:
    assert sorted({check.claim for check in related.CHECKS}) == list(range(25, 31))
    assert not any(check.counterexample for check in related.CHECKS)


def test_every_related_check_is_in_the_registry_in_claim_order() -> None:
    names = [check.name for check in CHECKS]
    positions = [names.index(check.name) for check in related.CHECKS]
    assert positions == sorted(positions)
    assert [check.claim for check in related.CHECKS] == sorted(c.claim for c in related.CHECKS)
