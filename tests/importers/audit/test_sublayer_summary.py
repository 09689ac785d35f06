"""Per-block summaries of the attribution and the operating point (importers.audit.sublayer_summary)
on hand-made cases: means over inputs (NaN left out), the attention sublayer's total, the largest
residual, the shares of each kind and direction, and which ``audit.json`` keys appear."""

from __future__ import annotations

import math

import pytest

from oversmooth.importers.audit.operating_step import AttributionCase, OperatingCase
from oversmooth.importers.audit.sublayer_summary import (
    ATTRIBUTION_DEFINITION,
    OPERATING_DEFINITION,
    OTHER_PARTS,
    attribution_blocks,
    operating_blocks,
    sublayer_json,
)
from oversmooth.simulator.attribution import PARTS

#: Per part, the block-3 change of HFC/LFC on inputs 0 and 1 (the cosine's is minus ten times it).
CHANGES = {
    "linear": (-0.4, -0.2),
    "scale": (0.1, 0.3),
    "bias": (0.0, math.nan),  # a NaN on one input: the mean is the other's
    "norm": (0.0, 0.0),
    "reconstruction": (0.01, 0.03),
    "mlp": (0.5, 0.7),
}


def attribution_cases() -> list[AttributionCase]:
    """Block 3 on inputs 0 and 1 (:data:`CHANGES`), block 1 on input 0 (every part 1.0)."""
    cases = [
        AttributionCase(
            3,
            item,
            part,
            CHANGES[part][item],
            -10 * CHANGES[part][item],
            0.0,
            0.0,
            1e-6 * (item + 1),
        )
        for item in (0, 1)
        for part in PARTS
    ]
    cases += [AttributionCase(1, 0, part, 1.0, 1.0, 0.0, 0.0, 5e-7) for part in PARTS]
    return cases


def operating_case(block: int, item: int, kind: str, direction: str, limit: float) -> OperatingCase:
    """A case of block ``block`` on input ``item`` with the given kind, direction and limit."""
    return OperatingCase(
        input=item,
        block=block,
        scale="1/sigma",
        mean_inverse_scale=2.0 + item,
        kind=kind,
        rho=1.1,
        eigenvalue=complex(1.1, 0.0),
        hfc_share=0.25 * item,
        limit_low=limit,
        limit_high=limit + 0.1,
        input_hfc_lfc=1.0,
        direction=direction,
        dominating=0,
        gap=0.5,
        iterations=10,
        n_tokens=7,
    )


def test_attribution_blocks_average_each_part_over_the_inputs() -> None:
    first, last = attribution_blocks(attribution_cases())
    assert (first["block"], last["block"]) == (1, 3)  # sorted by block
    assert (first["inputs"], last["inputs"]) == (1, 2)
    parts = last["parts"]
    assert list(parts) == list(PARTS)
    assert parts["linear"]["delta_hfc_lfc"] == pytest.approx(-0.3)
    assert parts["scale"]["delta_cosine"] == pytest.approx(-2.0)
    assert parts["bias"] == {"delta_hfc_lfc": 0.0, "delta_cosine": 0.0}  # the NaN left out
    assert parts["mlp"]["delta_hfc_lfc"] == pytest.approx(0.6)
    # the attention sublayer: every part but mlp, -0.3 + 0.2 + 0 + 0 + 0.02
    assert last["attention_hfc_lfc"] == pytest.approx(-0.08)
    assert last["attention_cosine"] == pytest.approx(0.8)
    assert last["reconstruction_residual"] == 2e-6
    assert first["attention_hfc_lfc"] == len(PARTS) - 1
    assert set(OTHER_PARTS) == set(PARTS) - {"linear", "mlp"}


def test_a_part_with_no_finite_value_averages_to_nan() -> None:
    cases = [AttributionCase(0, 0, part, math.nan, 0.0, 0.0, 0.0, 0.0) for part in PARTS]
    (row,) = attribution_blocks(cases)
    assert math.isnan(row["parts"]["linear"]["delta_hfc_lfc"])
    assert row["parts"]["linear"]["delta_cosine"] == 0.0


def test_operating_blocks_share_kinds_and_directions_over_the_inputs() -> None:
    cases = [
        operating_case(2, 0, "perron", "smoothing", 0.1),
        operating_case(2, 1, "perron", "smoothing", 0.3),
        operating_case(2, 2, "non-perron", "no smoothing", math.nan),
        operating_case(2, 3, "balanced", "tie", 0.5),
        operating_case(0, 0, "non-perron", "no smoothing", 2.0),
    ]
    first, last = operating_blocks(cases)
    assert (first["block"], first["inputs"], first["non_perron"]) == (0, 1, 1.0)
    assert last["block"] == 2
    assert last["inputs"] == 4
    assert (last["perron"], last["non_perron"], last["balanced"]) == (0.5, 0.25, 0.25)
    assert (last["smoothing"], last["no_smoothing"], last["tie"]) == (0.5, 0.25, 0.25)
    assert last["limit_hfc_lfc"] == pytest.approx(0.3)  # (0.1 + 0.3 + 0.5) / 3, the NaN left out
    assert last["mean_inverse_scale"] == pytest.approx(3.5)
    assert last["hfc_share"] == pytest.approx(0.375)
    assert last["input_hfc_lfc"] == 1.0
    assert last["scale"] == "1/sigma"


def test_audit_json_gets_a_key_for_each_step_that_ran() -> None:
    attribution = attribution_cases()
    operating = [operating_case(0, 0, "perron", "smoothing", 0.1)]
    assert sublayer_json([], []) == {}
    assert list(sublayer_json([], attribution)) == ["attribution"]
    both = sublayer_json(operating, attribution)
    assert both["attribution"]["definition"] == ATTRIBUTION_DEFINITION
    assert both["operating"]["definition"] == OPERATING_DEFINITION
    assert both["attribution"]["per_block"] == attribution_blocks(attribution)
    assert both["operating"]["per_block"] == operating_blocks(operating)
