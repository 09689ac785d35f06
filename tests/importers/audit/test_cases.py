"""oversmooth.importers.audit.cases: the operator summary's agreement with the per-head rule, and
its chance level."""

from __future__ import annotations

import numpy as np

from oversmooth.importers.audit.cases import (
    Agreement,
    DominanceCase,
    OperatorCase,
    operator_summary,
)

NAN = complex(np.nan, np.nan)


def _heads(item: int, block: int, kinds: str) -> list[DominanceCase]:
    """One case per character: p(erron), n(on-perron), c(ontracting)."""
    names = {"p": "perron", "n": "non-perron", "c": "contracting"}
    return [
        DominanceCase(item, block, head, names[k], NAN, NAN, NAN, 8) for head, k in enumerate(kinds)
    ]


def _operator(item: int, block: int, kind: str) -> OperatorCase:
    return OperatorCase(item, block, kind, 1.5, 1.2, complex(1.5), 10, 8)


def test_operator_agreement_counts_the_majority_rule_and_its_chance_level() -> None:
    # (input, block): per-head majority perron in (0,0) and (1,0) (half counts), not in (0,1), (1,1)
    dominance = _heads(0, 0, "ppn") + _heads(0, 1, "pnc") + _heads(1, 0, "pn") + _heads(1, 1, "nnp")
    operator = [
        _operator(0, 0, "perron"),  # agrees
        _operator(0, 1, "perron"),  # disagrees
        _operator(1, 0, "perron"),  # agrees
        _operator(1, 1, "non-perron"),  # agrees
    ]
    summary = operator_summary(operator, dominance)
    assert summary is not None
    assert summary.agreement == 0.75
    test = summary.agreement_test
    assert test == Agreement.of_pairs([(True, True), (False, True), (True, True), (False, False)])
    assert (test.agree, test.decided) == (3, 4)
    # margins: 2 majority-perron, 3 operator-perron: a shuffle agrees in 2·3/4 + 2·1/4 = 2 on average
    assert np.isclose(test.expected, 2.0)
    assert 0.0 < test.p_value <= 1.0


def test_no_operator_cases_no_summary() -> None:
    assert operator_summary([], _heads(0, 0, "pp")) is None
