"""oversmooth.importers.audit.records: the block verdicts' agreement against chance, and the classes' shares."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from oversmooth.importers.audit.cases import Agreement, BlockVerdict, kind_fractions


def _verdict(predicted: str, observed: str) -> BlockVerdict:
    agree = None if observed == "mixed" or predicted == "tie" else predicted == observed
    return BlockVerdict(
        block=0,
        part="attention",
        cases=1,
        perron=0.5,
        non_perron=0.5,
        balanced=0.0,
        contracting=0.0,
        hfc_lfc_ratio=1.0,
        cosine_change=0.0,
        predicted=predicted,
        observed=observed,
        agree=agree,
        mlp_hfc_lfc_ratio=1.0,
        mlp_cosine_change=0.0,
    )


def _by_enumeration(predicted: list[str], observed: list[str]) -> tuple[float, float]:
    """(mean agreements, P(agreements >= measured)) over every permutation of ``observed``."""
    measured = sum(p == o for p, o in zip(predicted, observed, strict=True))
    counts = [
        sum(p == o for p, o in zip(predicted, order, strict=True))
        for order in itertools.permutations(observed)
    ]
    return float(np.mean(counts)), float(np.mean([c >= measured for c in counts]))


@pytest.mark.parametrize(
    ("predicted", "observed"),
    [
        ("SSSSSNN", "SSSNNSN"),
        ("SSSSSSS", "SSNNNNS"),
        ("SNSNSN", "SNSNSN"),
        ("NNNNS", "SSSSN"),
        ("SSNN", "SSSS"),
    ],
)
def test_agreement_equals_the_exhaustive_permutation_test(predicted: str, observed: str) -> None:
    names = {"S": "smoothing", "N": "no smoothing"}
    verdicts = [_verdict(names[p], names[o]) for p, o in zip(predicted, observed, strict=True)]
    found = Agreement.of(verdicts)
    assert found is not None
    expected, p_value = _by_enumeration(list(predicted), list(observed))
    assert found.decided == len(predicted)
    assert found.agree == sum(p == o for p, o in zip(predicted, observed, strict=True))
    assert found.expected == pytest.approx(expected, abs=1e-12)
    assert found.p_value == pytest.approx(p_value, abs=1e-12)


def test_ties_and_mixed_blocks_are_left_out_of_the_agreement() -> None:
    verdicts = [
        _verdict("tie", "smoothing"),
        _verdict("smoothing", "mixed"),
        _verdict("smoothing", "smoothing"),
        _verdict("no smoothing", "smoothing"),
    ]
    found = Agreement.of(verdicts)
    assert found is not None
    assert (found.agree, found.decided) == (1, 2)
    assert Agreement.of(verdicts[:2]) is None


def test_fractions_keep_the_contracting_class_apart() -> None:
    kinds = np.array(["perron", "non-perron", "balanced", "contracting", "contracting"])
    perron, non_perron, balanced, contracting = kind_fractions(kinds)
    assert (perron, balanced, contracting) == (0.2, 0.2, 0.4)
    assert math.isclose(non_perron, 0.4)
