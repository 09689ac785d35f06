"""``python -m oversmooth.figures --quick``: every script writes its PNG, tidy CSV and JSON provenance.

One quick run of all scripts is shared by the module (the real-model scripts cost seconds each).
Without the pinned real models the real-model scripts are skipped, except in CI (``CI`` set), where
the run must include them.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from numpy.testing import assert_allclose

from oversmooth.figures import SCRIPTS
from oversmooth.figures.__main__ import main as figures_main
from oversmooth.simulator import tolerances as tol

pytestmark = pytest.mark.figures

ROOT = Path(__file__).resolve().parents[2]
#: Scripts that audit the zoo models (the rest only need the simulator).
REAL_MODEL_SCRIPTS = frozenset(
    {"fig2_smoothing", "fig3_reparam", "fig5_spectra", "table1_dominance"}
)
#: A simulator script cheap enough to run twice.
CHEAP_SCRIPT = "theory_regime_map"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class QuickRun:
    """The shared ``python -m oversmooth.figures --quick`` run: output folder, process, missing models."""

    out: Path
    process: subprocess.CompletedProcess
    missing: str | None


def _missing_models() -> str | None:
    from oversmooth.importers.zoo import model_status, models

    absent = [
        m.install_hint for m in models() if model_status(m.name) not in {"installed", "cached"}
    ]
    return f"real models not available: {'; '.join(absent)}" if absent else None


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> QuickRun:
    missing = _missing_models()
    if missing and os.environ.get("CI"):
        pytest.fail(missing)
    names = [name for name in SCRIPTS if not (missing and name in REAL_MODEL_SCRIPTS)]
    out = tmp_path_factory.mktemp("figures-quick")
    command = [
        sys.executable,
        "-m",
        "oversmooth.figures",
        "--quick",
        "--out",
        str(out),
        "--only",
        *names,
    ]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    return QuickRun(out, process, missing)


def _script(run: QuickRun, name: str) -> Path:
    """The output folder for ``name``'s checks, after skipping real-model scripts without models."""
    if name in REAL_MODEL_SCRIPTS and run.missing:
        pytest.skip(run.missing)
    assert run.process.returncode == 0, run.process.stderr
    return run.out


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _params(names: tuple[str, ...]) -> list:
    return [
        pytest.param(name, marks=pytest.mark.realmodel) if name in REAL_MODEL_SCRIPTS else name
        for name in names
    ]


def test_quick_run_exits_zero_and_names_every_script(quick_run: QuickRun) -> None:
    assert quick_run.process.returncode == 0, quick_run.process.stderr
    for name in SCRIPTS:
        if name in REAL_MODEL_SCRIPTS and quick_run.missing:
            continue
        assert f"{name}: wrote" in quick_run.process.stdout


@pytest.mark.parametrize("name", _params(SCRIPTS))
def test_csv_header_equals_columns(quick_run: QuickRun, name: str) -> None:
    out = _script(quick_run, name)
    with (out / f"{name}.csv").open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
        first = next(csv.reader(handle), None)
    assert tuple(header) == tuple(importlib.import_module(f"oversmooth.figures.{name}").COLUMNS)
    assert first is not None, f"{name}.csv has no data rows"


@pytest.mark.parametrize("name", _params(SCRIPTS))
def test_png_is_a_non_empty_image(quick_run: QuickRun, name: str) -> None:
    data = (_script(quick_run, name) / f"{name}.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > len(PNG_SIGNATURE)


@pytest.mark.parametrize("name", _params(SCRIPTS))
def test_json_provenance_has_git_versions_and_config(quick_run: QuickRun, name: str) -> None:
    meta = json.loads((_script(quick_run, name) / f"{name}.json").read_text(encoding="utf-8"))
    assert meta["figure"] == name
    assert meta["git"]["commit"]
    assert "numpy" in meta["versions"]
    assert meta["config"]["quick"] is True


def test_rerun_gives_a_byte_identical_csv(quick_run: QuickRun, tmp_path: Path) -> None:
    first = _script(quick_run, CHEAP_SCRIPT) / f"{CHEAP_SCRIPT}.csv"
    module = importlib.import_module(f"oversmooth.figures.{CHEAP_SCRIPT}")
    assert module.main(["--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{CHEAP_SCRIPT}.csv").read_bytes() == first.read_bytes()


def test_unknown_only_name_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        figures_main(["--quick", "--only", "fig2_smoothin", "--out", str(out)])
    assert exit_info.value.code == 2
    assert "fig2_smoothing" in capsys.readouterr().err  # the close-match hint
    assert not out.exists()


@pytest.mark.realmodel
def test_table1_markdown_sits_next_to_the_csv(quick_run: QuickRun) -> None:
    out = _script(quick_run, "table1_dominance")
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


@pytest.mark.realmodel
def test_table1_fractions_are_complementary(quick_run: QuickRun) -> None:
    rows = _rows(_script(quick_run, "table1_dominance") / "table1_dominance.csv")
    perron = np.array([float(r["perron_pct"]) for r in rows])
    non_perron = np.array([float(r["non_perron_pct"]) for r in rows])
    contracting = np.array([float(r["contracting_pct"] or 0.0) for r in rows])
    assert_allclose(perron + non_perron + contracting, 100.0, rtol=tol.STEP_RTOL)
    assert np.all((perron >= 0) & (perron <= 100))
    assert np.all(contracting >= 0)
    # the ⁻ transform puts every head's range in [-1, 0): contracting by construction (§6.10)
    minus = [r for r in rows if r["source"] == "ours" and r["transform"] == "minus"]
    assert any(float(r["contracting_pct"]) == 100.0 for r in minus if r["h"] != "stored")


@pytest.mark.realmodel
def test_table1_operator_rows_count_input_block_cases(quick_run: QuickRun) -> None:
    """The whole-operator rows: one case per (input, block) of the first input (quick run), their
    agreement with the per-head rule a share."""
    from oversmooth.importers.zoo import get_model

    rows = _rows(_script(quick_run, "table1_dominance") / "table1_dominance.csv")
    totals = [r for r in rows if r["unit"] == "operator" and r["block"] == "all"]
    assert {r["model"] for r in totals} == {"dinov2-vits14", "minilm-l6-int8", "minilm-l3"}
    for row in totals:
        assert int(row["cases"]) == get_model(row["model"]).n_layers  # 1 input x every block
        assert 0.0 <= float(row["agreement_pct"]) <= 100.0


@pytest.mark.realmodel
def test_table1_operating_rows_count_input_block_cases_with_their_chance(
    quick_run: QuickRun,
) -> None:
    """The operating-point rows: one case per (input, block) of the first input, as the operator
    rows; their agreement with the operator comes with its expectation under shuffling and a
    p-value (or none where every case is balanced on one side)."""
    from oversmooth.importers.zoo import get_model

    rows = _rows(_script(quick_run, "table1_dominance") / "table1_dominance.csv")
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


@pytest.mark.realmodel
def test_table1_reparameterised_products_follow_s5_and_s6(quick_run: QuickRun) -> None:
    """Plumbing check: with H the very product the ± transform sets (the effective one; both
    where nothing is folded), Λ > 0 gives Perron-type dominance for any A (S6), Λ in [-1, 0)
    never (S5)."""
    rows = _rows(_script(quick_run, "table1_dominance") / "table1_dominance.csv")
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


@pytest.mark.realmodel
def test_smoothing_curves_have_one_point_per_layer(quick_run: QuickRun) -> None:
    """Layers 0..L for every model (L attention blocks); cosines stay in [-1, 1], ratios ≥ 0."""
    from oversmooth.importers.zoo import get_model

    out = _script(quick_run, "fig2_smoothing")
    for name in ("fig2_smoothing", "fig3_reparam"):
        rows = _rows(out / f"{name}.csv")
        for model in {r["model"] for r in rows}:
            layers = {int(r["layer"]) for r in rows if r["model"] == model}
            assert layers == set(range(get_model(model).n_layers + 1)), (name, model)
        means = {
            m: [float(r["mean"]) for r in rows if r["metric"] == m] for m in ("cosine", "hfc_lfc")
        }
        assert all(-1 <= value <= 1 for value in means["cosine"])
        assert all(value >= 0 for value in means["hfc_lfc"])


@pytest.mark.realmodel
def test_spectra_histograms_are_densities(quick_run: QuickRun) -> None:
    rows = _rows(_script(quick_run, "fig5_spectra") / "fig5_spectra.csv")
    groups = {(r["model"], r["kind"]) for r in rows}
    assert {kind for _, kind in groups} >= {"head", "layer", "head-effective", "layer-effective"}
    for model, kind in groups:
        sel = [r for r in rows if (r["model"], r["kind"]) == (model, kind)]
        bins = [r for r in sel if r["stat"] == "density"]
        width = np.array([float(r["bin_right"]) - float(r["bin_left"]) for r in bins])
        mass = float(np.sum(width * np.array([float(r["value"]) for r in bins])))
        assert_allclose(mass, 1.0, rtol=tol.STEP_RTOL, err_msg=f"{model} {kind}")
        stats = {r["stat"]: float(r["value"]) for r in sel if r["stat"] != "density"}
        assert 0 <= stats["negative_fraction"] <= 1
        assert stats["max_abs_real"] <= stats["spectral_radius"]
