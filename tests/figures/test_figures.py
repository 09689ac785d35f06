"""``python -m oversmooth.figures --quick``: every script writes its PNG, tidy CSV and JSON provenance.

The cross-cutting checks of every script's outputs, reruns and the one-command runner; each
script's own checks sit in ``tests/figures/test_<script>.py``. The quick run of all scripts is
shared by the session (``quick_run``, :mod:`tests.figures.quick`).
"""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import pytest

from oversmooth.figures import SCRIPTS
from oversmooth.figures.__main__ import main as figures_main
from tests.figures.quick import REAL_MODEL_SCRIPTS, QuickRun, csv_rows, script_output

pytestmark = pytest.mark.figures

#: A simulator script cheap enough to run twice.
CHEAP_SCRIPT = "theory_regime_map"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
    out = script_output(quick_run, name)
    with (out / f"{name}.csv").open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
        first = next(csv.reader(handle), None)
    assert tuple(header) == tuple(importlib.import_module(f"oversmooth.figures.{name}").COLUMNS)
    assert first is not None, f"{name}.csv has no data rows"


@pytest.mark.parametrize("name", _params(SCRIPTS))
def test_png_is_a_non_empty_image(quick_run: QuickRun, name: str) -> None:
    data = (script_output(quick_run, name) / f"{name}.png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > len(PNG_SIGNATURE)


@pytest.mark.parametrize("name", _params(SCRIPTS))
def test_json_provenance_has_git_versions_and_config(quick_run: QuickRun, name: str) -> None:
    meta = json.loads((script_output(quick_run, name) / f"{name}.json").read_text(encoding="utf-8"))
    assert meta["figure"] == name
    assert meta["git"]["commit"]
    assert "numpy" in meta["versions"]
    assert meta["config"]["quick"] is True


def test_rerun_gives_a_byte_identical_csv(quick_run: QuickRun, tmp_path: Path) -> None:
    first = script_output(quick_run, CHEAP_SCRIPT) / f"{CHEAP_SCRIPT}.csv"
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
def test_smoothing_curves_have_one_point_per_layer(quick_run: QuickRun) -> None:
    """Layers 0..L for every model (L attention blocks); cosines stay in [-1, 1], ratios ≥ 0."""
    from oversmooth.importers.zoo import get_model

    out = script_output(quick_run, "fig2_smoothing")
    for name in ("fig2_smoothing", "fig3_reparam"):
        rows = csv_rows(out / f"{name}.csv")
        for model in {r["model"] for r in rows}:
            layers = {int(r["layer"]) for r in rows if r["model"] == model}
            assert layers == set(range(get_model(model).n_layers + 1)), (name, model)
        means = {
            m: [float(r["mean"]) for r in rows if r["metric"] == m] for m in ("cosine", "hfc_lfc")
        }
        assert all(-1 <= value <= 1 for value in means["cosine"])
        assert all(value >= 0 for value in means["hfc_lfc"])
