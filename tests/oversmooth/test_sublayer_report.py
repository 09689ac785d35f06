"""The attribution's and the operating point's files and report sections (oversmooth.sublayer_report)
on hand-made cases: which files are written, the tables' cells, the sentence per block and the
reason it gives. (On an audit of a builder model: tests/importers/audit/test_operating_step.py.)"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from oversmooth.importers.audit.operating_step import (
    ATTRIBUTION_COLUMNS,
    OPERATING_COLUMNS,
    AttributionCase,
    OperatingCase,
)
from oversmooth.simulator.attribution import PARTS
from oversmooth.sublayer_report import (
    ATTRIBUTION_FILE,
    OPERATING_FILE,
    sublayer_sections,
    write_sublayer_files,
)

#: Block 2's change of HFC/LFC per part on its one input: the linear operator lowers it, the
#: scale raises it more, so the sublayer raises it because of the scale.
CHANGES = {
    "linear": -0.1,
    "scale": 0.3,
    "bias": 0.0,
    "norm": 0.0,
    "reconstruction": 1e-7,
    "mlp": -0.05,
}


def attribution() -> list[AttributionCase]:
    """Block 2 on input 0, the parts of :data:`CHANGES`."""
    return [
        AttributionCase(2, 0, part, CHANGES[part], 0.0, CHANGES[part], 0.0, 3e-7) for part in PARTS
    ]


def operating() -> list[OperatingCase]:
    """Block 2 on inputs 0 and 1: one perron and smoothing, one non-perron and not."""
    common = {"block": 2, "scale": "1/sigma", "mean_inverse_scale": 1.5, "rho": 1.2}
    common |= {
        "eigenvalue": complex(1.2),
        "hfc_share": 0.1,
        "limit_high": 0.0,
        "input_hfc_lfc": 0.8,
    }
    common |= {"dominating": 0, "gap": 0.3, "iterations": 9, "n_tokens": 6}
    return [
        OperatingCase(input=0, kind="perron", limit_low=0.2, direction="smoothing", **common),
        OperatingCase(
            input=1, kind="non-perron", limit_low=0.4, direction="no smoothing", **common
        ),
    ]


def result(*, with_attribution: bool, with_operating: bool) -> SimpleNamespace:
    """What the two functions read of an AuditResult."""
    return SimpleNamespace(
        attribution=attribution() if with_attribution else [],
        operating=operating() if with_operating else [],
    )


VERDICTS = [SimpleNamespace(block=2, predicted="no smoothing")]


def test_only_the_files_of_the_steps_that_ran_are_written(tmp_path: Path) -> None:
    assert (
        write_sublayer_files(result(with_attribution=False, with_operating=False), tmp_path) == []
    )
    assert list(tmp_path.iterdir()) == []
    paths = write_sublayer_files(result(with_attribution=True, with_operating=True), tmp_path)
    assert paths == [tmp_path / ATTRIBUTION_FILE, tmp_path / OPERATING_FILE]
    for path, columns, count in (
        (paths[0], ATTRIBUTION_COLUMNS, len(PARTS)),
        (paths[1], OPERATING_COLUMNS, 2),
    ):
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            assert reader.fieldnames == list(columns)
            assert len(list(reader)) == count


def test_no_step_no_section() -> None:
    assert sublayer_sections(result(with_attribution=False, with_operating=False), VERDICTS) == []


def test_the_attribution_section_has_a_row_and_a_sentence_per_block() -> None:
    lines = sublayer_sections(result(with_attribution=True, with_operating=False), VERDICTS)
    assert "## What moved HFC/LFC: attribution (docs/theory.md §6.12)" in lines
    assert any(line.startswith("On the first 1 input(s),") for line in lines)
    (row,) = [line for line in lines if line.startswith("| 2 |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # block, predicted, linear, scale, bias, norm, residual, sublayer, MLP, Δcos x2, rel. residual
    assert cells[:10] == [
        "2",
        "no smoothing",
        "-0.100",
        "+0.300",
        "+0.000",
        "+0.000",
        "+0.000",
        "+0.200",
        "-0.050",
        "+0.000",
    ]
    assert cells[-1] == "3.0e-07"
    (sentence,) = [line for line in lines if line.startswith("- block 2:")]
    assert "predicted **no smoothing**" in sentence
    assert "the effective-H operator alone lowers HFC/LFC (-0.100)" in sentence
    assert "the attention sublayer raises it (+0.200)" in sentence
    assert (
        "mostly because of the scale +0.300, outside the theory (linear -0.100, scale +0.300)"
        in sentence
    )
    assert sentence.endswith("the MLP -0.050.")
    assert not any("operating point" in line for line in lines)


def test_a_block_without_a_verdict_is_predicted_by_a_dash() -> None:
    lines = sublayer_sections(result(with_attribution=True, with_operating=True), [])
    assert any(line.startswith("| 2 | — |") for line in lines)
    assert any("predicted **—**" in line for line in lines)


def test_the_operating_section_gives_the_shares_in_percent() -> None:
    lines = sublayer_sections(result(with_attribution=False, with_operating=True), VERDICTS)
    assert lines[1].startswith("### The operating point")
    (row,) = [line for line in lines if line.startswith("| 2 |")]
    assert row == "| 2 | 1/sigma | 1.5 | 50% | 50% | 0% | 50% | 50% | 0.3 | 0.8 | no smoothing |"


@pytest.mark.parametrize(
    ("observed", "linear", "scale", "bias", "expected"),
    [
        (-0.2, -0.1, -0.05, -0.05, "mostly through the effective-H operator"),
        (1.25, 0.004, 0.456, 0.791, "mostly because of the bias +0.791"),
        (0.5, -0.1, 0.7, -0.1, "mostly because of the scale +0.700"),
        (0.01, -0.1, -0.2, -0.3, "against every part's sign"),
    ],
)
def test_the_reason_given_is_a_part_that_moved_hfc_lfc_the_observed_way(
    observed: float, linear: float, scale: float, bias: float, expected: str
) -> None:
    from oversmooth.sublayer_report import _because

    parts = {
        "scale": {"delta_hfc_lfc": scale},
        "bias": {"delta_hfc_lfc": bias},
        "norm": {"delta_hfc_lfc": float("nan")},
        "reconstruction": {"delta_hfc_lfc": 1e-7},
    }
    assert _because({"parts": parts}, observed, linear).startswith(expected)
