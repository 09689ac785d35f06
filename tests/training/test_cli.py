"""``oversmooth train``: the results folder, paired seeds, exported models, bad data in one line."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'oversmooth[train]'")
pytest.importorskip("sklearn", reason="needs the train extra: pip install 'oversmooth[train]'")

from oversmooth.cli import main
from oversmooth.commands.train import RESULT_COLUMNS


def _rows(path):
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "out"
    argv = ["train", "--quick", "--epochs", "1", "--seeds", "2", "--variant", "all"]
    argv += ["--fraction", "0.5", "--depth", "1", "--out", str(out), "--no-progress"]
    assert main([*argv, "--export-onnx"]) == 0
    return out


def test_the_folder_holds_one_row_per_run_corruption_and_severity(results):
    rows = _rows(results / "results.csv")
    assert tuple(rows[0]) == RESULT_COLUMNS
    assert len(rows) == 3 * 2 * (1 + 2 * 5)
    assert {r["variant"] for r in rows} == {"standard", "plus", "minus"}
    assert {r["fraction"] for r in rows} == {"0.5"}
    assert {r["n_train"] for r in rows} == {str(round(0.5 * 1297))}
    record = json.loads((results / "results.json").read_text(encoding="utf-8"))
    assert len(record["runs"]) == 6
    assert all(run["model"]["depth"] == 1 for run in record["runs"])
    plus = [run for run in record["runs"] if run["variant"] == "plus"]
    assert all(run["spectra"]["stored"]["positive"] == 1.0 for run in plus)
    assert sorted(p.name for p in (results / "models").iterdir()) == sorted(
        f"{v}-f0.5-s{s}.onnx" for v in ("standard", "plus", "minus") for s in (0, 1)
    )


def test_a_second_run_into_the_folder_replaces_it_and_gives_the_same_table(results, tmp_path):
    again = tmp_path / "again"
    argv = ["train", "--quick", "--epochs", "1", "--seeds", "2", "--fraction", "0.5"]
    assert main([*argv, "--depth", "1", "--out", str(again), "--no-progress"]) == 0
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in _rows(again / "results.csv")]
    first = [{k: v for k, v in r.items() if k != "seconds"} for r in _rows(results / "results.csv")]
    assert strip == first
    assert main([*argv, "--depth", "1", "--out", str(again), "--no-progress"]) == 0


def test_a_folder_of_something_else_is_refused(tmp_path, capsys):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    assert main(["train", "--quick", "--out", str(tmp_path / "theirs")]) == 2
    assert "not an earlier output" in capsys.readouterr().err


def test_a_bad_npz_is_refused_in_one_line(tmp_path, capsys):
    data = tmp_path / "bad.npz"
    np.savez(data, x_train=np.zeros((4, 8, 8)), y_train=np.zeros(4, dtype=int))
    assert main(["train", "--quick", "--data", str(data), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "lacks x_test, y_test" in err
    assert not (tmp_path / "out").exists()


def test_a_user_npz_trains(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(
        data,
        x_train=rng.integers(0, 256, (24, 4, 4, 3), dtype=np.uint8),
        y_train=np.arange(24) % 3,
        x_test=rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8),
        y_test=np.arange(6) % 3,
    )
    out = tmp_path / "out"
    argv = ["train", "--quick", "--epochs", "1", "--seeds", "1", "--variant", "minus"]
    assert main([*argv, "--data", str(data), "--out", str(out), "--no-progress"]) == 0
    record = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert record["runs"][0]["model"]["channels"] == 3
    assert record["runs"][0]["model"]["classes"] == 3
