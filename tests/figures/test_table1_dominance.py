"""Table 1 (:mod:`oversmooth.figures.table1_dominance`): the dominance shares of the zoo models,
their reparameterised variants and the paper's numbers, as CSV and markdown."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.figures.table1_dominance import COUNTERPART, PAPER, markdown
from oversmooth.simulator import tolerances as tol
from tests.figures.quick import QuickRun, csv_rows, script_output


def _ours(unit: str = "head", block: str = "all", **values) -> dict:
    row = {"source": "ours", "model": "minilm-l3", "transform": "plus", "h": "effective"}
    row |= {"unit": unit, "block": block, "n_inputs": 3, "cases": 36, "counterpart": None}
    row |= {"perron_pct": 75.0, "perron_lo": 60.0, "perron_hi": 90.0}
    row |= {"non_perron_pct": 20.0, "contracting_pct": 5.0}
    return row | values


def _paper(model: str, perron: float, non_perron: float) -> dict:
    return {"source": "paper", "model": model, "perron_pct": perron, "non_perron_pct": non_perron}


def test_markdown_puts_the_papers_counterpart_beside_our_overall_head_rows() -> None:
    counterpart = COUNTERPART["language", "plus"]
    rows = [
        _ours(counterpart=counterpart),
        _ours(block="0", perron_pct=11.0),  # per block: not in the table
        _ours(unit="operator", agreement_pct=80.0, agreement_p=0.01234),
        _paper(counterpart, 100.0, 0.0),
        _paper("ViT-B/16 (ImageNet)", 70.27, 29.73),
    ]
    lines = markdown(rows).splitlines()
    ours = [line for line in lines if line.startswith("| minilm-l3 | plus |")]
    assert ours == [
        f"| minilm-l3 | plus | effective | 3 | 36 | 75.00% [60.0, 90.0] | 20.00% | 5.00% "
        f"| {counterpart} | 100.00% | 0.00% |"
    ]
    assert "| minilm-l3 | 3 | 36 | 75.00% | 80.00% | — | 0.0123 |" in lines
    assert "| ViT-B/16 (ImageNet) | 70.27% | 29.73% |" in lines
    assert not any("11.00%" in line for line in lines)


def test_the_paper_rows_add_up_to_100_percent() -> None:
    for model, _, perron, non_perron in PAPER:
        assert perron + non_perron == pytest.approx(100.0), model


# Moved from tests/figures/test_figures.py.
@pytest.mark.figures
@pytest.mark.realmodel
def test_table1_markdown_sits_next_to_the_csv(quick_run: QuickRun) -> None:
    out = script_output(quick_run, "table1_dominance")
    text = (out / "table1_dominance.md").read_text(encoding="utf-8")
    from oversmooth.figures.table1_dominance import OPERATOR_ROWS, OURS, PAPER

    # four headers and the rows (the operator and the operating point: one row per model each)
    assert text.count("\n| ") == 4 * 1 + len(OURS) + 2 * len(OPERATOR_ROWS) + len(PAPER)
    assert "The whole operator of each block" in text
    assert "The operating point of each block" in text
    for _, _, perron, non_perron in PAPER:
        assert f"{perron:.2f}%" in text
        assert f"{non_perron:.2f}%" in text
    assert "not the paper's" in text


# Moved from tests/figures/test_figures.py.
@pytest.mark.figures
@pytest.mark.realmodel
def test_table1_fractions_are_complementary(quick_run: QuickRun) -> None:
    rows = csv_rows(script_output(quick_run, "table1_dominance") / "table1_dominance.csv")
    perron = np.array([float(r["perron_pct"]) for r in rows])
    non_perron = np.array([float(r["non_perron_pct"]) for r in rows])
    contracting = np.array([float(r["contracting_pct"] or 0.0) for r in rows])
    assert_allclose(perron + non_perron + contracting, 100.0, rtol=tol.STEP_RTOL)
    assert np.all((perron >= 0) & (perron <= 100))
    assert np.all(contracting >= 0)
    # the ⁻ transform puts every head's range in [-1, 0): contracting by construction (§6.10)
    minus = [r for r in rows if r["source"] == "ours" and r["transform"] == "minus"]
    assert any(float(r["contracting_pct"]) == 100.0 for r in minus if r["h"] != "stored")


# Moved from tests/figures/test_figures.py.
@pytest.mark.figures
@pytest.mark.realmodel
def test_table1_operator_rows_count_input_block_cases(quick_run: QuickRun) -> None:
    """The whole-operator rows: one case per (input, block) of the first input (quick run), their
    agreement with the per-head rule a share."""
    from oversmooth.importers.zoo import get_model

    rows = csv_rows(script_output(quick_run, "table1_dominance") / "table1_dominance.csv")
    totals = [r for r in rows if r["unit"] == "operator" and r["block"] == "all"]
    assert {r["model"] for r in totals} == {"dinov2-vits14", "minilm-l6-int8", "minilm-l3"}
    for row in totals:
        assert int(row["cases"]) == get_model(row["model"]).n_layers  # 1 input x every block
        assert 0.0 <= float(row["agreement_pct"]) <= 100.0


# Moved from tests/figures/test_figures.py.
@pytest.mark.figures
@pytest.mark.realmodel
def test_table1_operating_rows_count_input_block_cases_with_their_chance(
    quick_run: QuickRun,
) -> None:
    """The operating-point rows: one case per (input, block) of the first input, as the operator
    rows; their agreement with the operator comes with its expectation under shuffling and a
    p-value (or none where every case is balanced on one side)."""
    from oversmooth.importers.zoo import get_model

    rows = csv_rows(script_output(quick_run, "table1_dominance") / "table1_dominance.csv")
    totals = [r for r in rows if r["unit"] == "operating" and r["block"] == "all"]
    assert {r["model"] for r in totals} == {"dinov2-vits14", "minilm-l6-int8", "minilm-l3"}
    for row in totals:
        assert int(row["cases"]) == get_model(row["model"]).n_layers
        assert float(row["perron_pct"]) + float(row["non_perron_pct"]) == pytest.approx(100.0)
        assert 0.0 <= float(row["smoothing_pct"]) <= 100.0
        if row["agreement_pct"]:
            assert 0.0 <= float(row["agreement_pct"]) <= 100.0
            assert 0.0 <= float(row["agreement_expected_pct"]) <= 100.0
            assert 0.0 <= float(row["agreement_p"]) <= 1.0


# Moved from tests/figures/test_figures.py.
@pytest.mark.figures
@pytest.mark.realmodel
def test_table1_reparameterised_products_follow_s5_and_s6(quick_run: QuickRun) -> None:
    """Plumbing check: with H the very product the ± transform sets (the effective one; both
    where nothing is folded), Λ > 0 gives Perron-type dominance for any A (S6), Λ in [-1, 0)
    never (S5)."""
    rows = csv_rows(script_output(quick_run, "table1_dominance") / "table1_dominance.csv")
    ours = [
        r
        for r in rows
        if r["source"] == "ours" and r["h"] in ("effective", "both") and r["unit"] == "head"
    ]
    expected = {"plus": 100.0, "minus": 0.0}
    checked = [r for r in ours if r["transform"] in expected]
    assert checked
    for row in checked:
        assert float(row["perron_pct"]) == expected[row["transform"]], row
