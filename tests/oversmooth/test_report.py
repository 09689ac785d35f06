"""The report folder (oversmooth.report): ``save_audit`` writes every promised file, tidy and
consistent with the result, appears whole or not at all, and replaces an earlier report but no
other folder; ``is_report_folder`` and ``replaceable_folder`` say which. On the audit of a builder
model with padding (tests/importers/audited.py)."""

from __future__ import annotations

import csv
import hashlib
import json
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers.audit.records import DOMINANCE_COLUMNS, LAYER_COLUMNS, AuditResult
from oversmooth.report import REPORT_FILES, is_report_folder, replaceable_folder, save_audit
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.metrics import METRICS
from oversmooth.simulator.theory import KINDS
from tests.importers.audited import assembly_of, audited, saved_model

#: A builder model with a padding mask (its second sequence's last two tokens).
PADDED = "bert_legacy"
_CPU = "CPUExecutionProvider"


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def draw_one_png(result: AuditResult, folder: Path) -> list[tuple[str, str]]:
    """A minimal figures callable: one valid PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot(range(result.n_layers), result.metrics["cosine"].mean(axis=0))
    fig.savefig(folder / "cosine.png")
    plt.close(fig)
    return [("mean cosine per layer", "cosine.png")]


@pytest.fixture(scope="module")
def saved(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[AuditResult, Path]:
    result = audited(model_dir, PADDED)
    folder = save_audit(result, tmp_path_factory.mktemp("saved") / "audit", figures=draw_one_png)
    return result, folder


def test_saved_folder_holds_every_promised_file(saved: tuple[AuditResult, Path]) -> None:
    _, folder = saved
    names = {path.name for path in folder.iterdir()}
    assert {"audit.json", "layers.csv", "spectra.csv", "dominance.csv", "report.md"} <= names
    assert "cosine.png" in names
    assert not [name for name in names if name.startswith(".")], "no temporary file left"


def test_audit_json_identifies_model_inputs_provider_and_dominance(
    model_dir: Path, saved: tuple[AuditResult, Path]
) -> None:
    result, folder = saved
    doc = json.loads((folder / "audit.json").read_text(encoding="utf-8"))
    model_bytes = saved_model(model_dir, PADDED).read_bytes()
    assert doc["model"]["sha256"] == hashlib.sha256(model_bytes).hexdigest()
    assert doc["provider"]["used"] == [_CPU]
    assert doc["n_inputs"] == 2
    assert len(doc["blocks"]) == len(assembly_of(PADDED).built.blocks)
    assert [block["n_heads"] for block in doc["blocks"]] == [
        block.n_heads for block in assembly_of(PADDED).built.blocks
    ]
    dominance = doc["dominance"]
    assert dominance["perron"] + dominance["non_perron"] == pytest.approx(1.0, abs=tol.EPS)
    assert 0.0 <= dominance["perron"] <= 1.0
    assert doc["inputs"]["digest"] == result.inputs.digest
    assert doc["provenance"]["versions"]["numpy"] == np.__version__
    assert doc["provenance"]["versions"]["onnx"] == metadata.version("onnx")


def test_layers_csv_is_tidy_mean_and_std_over_inputs(saved: tuple[AuditResult, Path]) -> None:
    result, folder = saved
    columns, rows = read_csv(folder / "layers.csv")
    assert columns == list(LAYER_COLUMNS)
    assert {"layer", "metric", "mean", "std"} <= set(columns)
    assert len(rows) == result.n_layers * len(METRICS)
    for row in rows:
        values = result.metrics[row["metric"]][:, int(row["layer"])]
        assert float(row["mean"]) == pytest.approx(values.mean(), rel=tol.STEP_RTOL)
        assert float(row["std"]) == pytest.approx(values.std(), rel=tol.STEP_RTOL, abs=tol.EPS)
        assert int(row["n"]) == values.size


def test_spectra_and_dominance_csv_have_one_row_per_value_and_case(
    saved: tuple[AuditResult, Path],
) -> None:
    result, folder = saved
    columns, rows = read_csv(folder / "spectra.csv")
    assert columns == ["block", "head", "kind", "real", "imag"]
    assert len(rows) == len(result.spectra)
    assert {row["kind"] for row in rows} == {"head", "layer", "head-effective", "layer-effective"}
    columns, rows = read_csv(folder / "dominance.csv")
    assert columns == list(DOMINANCE_COLUMNS)
    assert len(rows) == len(result.dominance)
    assert {row["kind"] for row in rows} <= set(KINDS)
    for row, case in zip(rows, result.dominance, strict=True):
        assert float(row["modulus"]) == pytest.approx(abs(case.mu), rel=tol.STEP_RTOL)


def test_report_embeds_the_figures_and_records_provenance(
    saved: tuple[AuditResult, Path],
) -> None:
    result, folder = saved
    report = (folder / "report.md").read_text(encoding="utf-8")
    assert "](cosine.png)" in report
    assert (folder / "cosine.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.model.sha256 in report
    assert result.inputs.digest in report
    assert f'"numpy": "{np.__version__}"' in report
    assert "RANDOM" not in report


def _failing_figures(result: AuditResult, folder: Path) -> list[tuple[str, str]]:
    (folder / "half-drawn.png").write_bytes(b"\x89PNG")
    raise RuntimeError("drawing failed")


def _interrupted_figures(result: AuditResult, folder: Path) -> list[tuple[str, str]]:
    (folder / "half-drawn.png").write_bytes(b"\x89PNG")
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("figures", "error"),
    [(_failing_figures, RuntimeError), (_interrupted_figures, KeyboardInterrupt)],
)
def test_an_error_while_saving_leaves_no_folder_and_no_staging(
    model_dir: Path, tmp_path: Path, figures, error
) -> None:
    result = audited(model_dir, PADDED)
    with pytest.raises(error):
        save_audit(result, tmp_path / "audit", figures=figures)
    assert list(tmp_path.iterdir()) == []


def test_an_error_while_saving_keeps_the_previous_folder(model_dir: Path, tmp_path: Path) -> None:
    result = audited(model_dir, PADDED)
    folder = save_audit(result, tmp_path / "audit")
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(RuntimeError):
        save_audit(result, folder, figures=_failing_figures)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert [path.name for path in tmp_path.iterdir()] == ["audit"]


def test_saving_again_replaces_an_earlier_report_folder(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "audit"
    first = audited(model_dir, PADDED)
    save_audit(first, folder)
    (folder / "stale.txt").write_text("from an earlier run", encoding="utf-8")
    second = audited(model_dir, "bert_dynamo")
    save_audit(second, folder)
    doc = json.loads((folder / "audit.json").read_text(encoding="utf-8"))
    assert doc["model"]["sha256"] == second.model.sha256 != first.model.sha256
    assert not (folder / "stale.txt").exists()
    assert [path.name for path in tmp_path.iterdir()] == ["audit"]


def test_a_folder_that_is_not_a_report_is_never_replaced(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter1.tex").write_text("precious", encoding="utf-8")
    with pytest.raises(InputError, match="not an earlier output"):
        save_audit(audited(model_dir, PADDED), folder)
    assert [path.name for path in folder.iterdir()] == ["chapter1.tex"]
    assert [path.name for path in tmp_path.iterdir()] == ["thesis"]


def test_a_report_folder_holds_audit_json_and_report_md(tmp_path: Path) -> None:
    assert not is_report_folder(tmp_path)
    (tmp_path / "audit.json").write_text("{}", encoding="utf-8")
    assert not is_report_folder(tmp_path)
    (tmp_path / "report.md").write_text("# audit", encoding="utf-8")
    assert is_report_folder(tmp_path)
    assert "audit.json" in REPORT_FILES
    assert "report.md" in REPORT_FILES


def test_force_makes_any_folder_replaceable(tmp_path: Path) -> None:
    other = tmp_path / "thesis"
    other.mkdir()
    assert replaceable_folder(True)(other)
    assert not replaceable_folder(False)(other)


def test_force_replaces_a_folder_that_is_not_a_report(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter1.tex").write_text("precious", encoding="utf-8")
    with pytest.raises(InputError, match="--out"):  # named as the caller names it
        save_audit(audited(model_dir, PADDED), folder, label="--out")
    save_audit(audited(model_dir, PADDED), folder, force=True)
    assert is_report_folder(folder)
    assert not (folder / "chapter1.tex").exists()
