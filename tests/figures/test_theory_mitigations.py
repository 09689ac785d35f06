"""The mitigations figure (:mod:`oversmooth.figures.theory_mitigations`) on its quick draw: every
rule starts from the same tokens; the plain rule smooths, the rules that remove the mean or the
similarity keep the tokens apart."""

from __future__ import annotations

import pytest

from oversmooth.figures import theory_mitigations as mitigations


@pytest.fixture(scope="module")
def quick_rows() -> list[dict]:
    return mitigations.compute(quick=True)[0]


def _curve(rows: list[dict], rule: str, metric: str) -> list[dict]:
    return [r for r in rows if r["rule"] == rule and r["metric"] == metric]


def test_every_rule_and_metric_has_every_layer_from_the_same_start(quick_rows) -> None:
    layers = mitigations.QUICK["layers"]
    assert len(quick_rows) == len(mitigations.RULES) * len(mitigations.METRICS) * (layers + 1)
    for metric in mitigations.METRICS:
        starts = {_curve(quick_rows, rule, metric)[0]["median"] for rule in mitigations.RULES}
        assert len(starts) == 1, metric  # layer 0 is X0, before any rule acts
    assert all(r["q25"] <= r["median"] <= r["q75"] for r in quick_rows)


def test_the_plain_rule_smooths_and_the_mitigations_smooth_less(quick_rows) -> None:
    final = {rule: _curve(quick_rows, rule, "hfc_lfc")[-1]["median"] for rule in mitigations.RULES}
    first = _curve(quick_rows, "plain", "hfc_lfc")[0]["median"]
    assert final["plain"] < first / 10
    assert _curve(quick_rows, "plain", "cosine")[-1]["median"] > 0.99
    for rule in mitigations.RULES:
        if rule != "plain":
            assert final[rule] > final["plain"], rule
