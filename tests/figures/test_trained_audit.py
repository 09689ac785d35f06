"""Table 1 and Fig. 3 from trained models: ``train --export-onnx`` writes the audit's inputs, and
``trained_audit`` audits every exported model (the training runs here need torch; the script
itself does not import it)."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest

from oversmooth.figures import ON_DEMAND, SCRIPTS
from oversmooth.figures.trained_audit import (
    COLUMNS,
    INPUTS_FILE,
    LAYER_COLUMNS,
    MODELS_FOLDER,
    NAME,
    QUICK_INPUTS,
    find_models,
    main,
    summary_rows,
)
from oversmooth.simulator.errors import InputError

SEEDS = 2
DEPTH = 2


def _rows(path):
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A tiny results folder: 3 variants × 2 seeds, one epoch on 20 % of the digits, exported."""
    pytest.importorskip("torch", reason="needs the train extra: pip install 'oversmooth[train]'")
    pytest.importorskip("sklearn", reason="needs the train extra: pip install 'oversmooth[train]'")
    from oversmooth.cli import main as cli

    out = tmp_path_factory.mktemp("train") / "out"
    argv = ["train", "--quick", "--epochs", "1", "--seeds", str(SEEDS), "--fraction", "0.2"]
    argv += ["--depth", str(DEPTH), "--out", str(out), "--no-progress", "--export-onnx"]
    assert cli(argv) == 0
    return out


@pytest.fixture(scope="module")
def audited(results, tmp_path_factory):
    out = tmp_path_factory.mktemp("figs")
    assert main(["--quick", "--results", str(results), "--out", str(out)]) == 0
    return out


def test_inputs_npz_is_the_test_split_in_the_export_s_layout(results, tmp_path):
    """``inputs.npz`` holds the first 500 clean test images as the graph's ``images`` input, and
    ``oversmooth audit MODEL --inputs DIR/inputs.npz`` reads it."""
    import json

    from oversmooth.cli import main as cli
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs import sources
    from oversmooth.training.data import load_digits_split

    model = results / "models" / "plus-f0.2-s0.onnx"
    with np.load(results / "inputs.npz", allow_pickle=False) as data:
        images, labels = data["images"], data["labels"]
    test = load_digits_split()
    assert images.dtype == np.float32
    assert images.shape == (500, 1, 8, 8)
    np.testing.assert_array_equal(images, test.x_test[:500].astype(np.float32))
    assert labels[3] == f"test-3-class-{test.y_test[3]}"
    inputs = sources.from_npz(results / "inputs.npz", load_model(model).inputs)
    assert inputs.batch_size == 500
    out = tmp_path / "audit"
    argv = ["audit", str(model), "--inputs", str(results / "inputs.npz"), "--out", str(out)]
    assert cli([*argv, "--dominance-inputs", "4", "--no-progress", "--threads", "1"]) == 0
    dominance = json.loads((out / "audit.json").read_text(encoding="utf-8"))["dominance"]
    assert dominance["perron"] == 1.0


def test_one_row_per_model_whose_shares_add_up(audited):
    rows = _rows(audited / f"{NAME}.csv")
    assert tuple(rows[0]) == COLUMNS
    ours = [r for r in rows if r["source"] == "ours"]
    per_seed = [r for r in ours if r["seed"]]
    assert sorted((r["variant"], r["seed"], r["h"]) for r in per_seed) == sorted(
        (v, str(s), h)
        for v in ("standard", "plus", "minus")
        for s in range(SEEDS)
        for h in ("effective", "stored")
    )
    heads = 2  # the quick model's
    for row in ours:
        total = sum(float(row[f"{share}_pct"]) for share in ("perron", "non_perron", "contracting"))
        assert total == pytest.approx(100.0)
        assert int(row["n_inputs"]) == QUICK_INPUTS
    assert all(int(r["cases"]) == QUICK_INPUTS * DEPTH * heads for r in per_seed)
    means = [r for r in ours if not r["seed"]]
    assert len(means) == 3 * 2
    assert {int(r["n_seeds"]) for r in means} == {SEEDS}
    assert {r["variant"] for r in rows if r["source"] == "paper"} == {"standard", "plus", "minus"}


def test_trained_plus_is_all_perron_and_minus_none_with_the_effective_h(audited):
    """Under the stored H by construction; under the effective H (the norm's centring and γ
    folded in) as measured after training."""
    rows = [r for r in _rows(audited / f"{NAME}.csv") if r["source"] == "ours"]
    assert {r["h"] for r in rows} == {"effective", "stored"}
    for row in rows:
        if row["variant"] == "plus":
            assert float(row["perron_pct"]) == 100.0
        if row["variant"] == "minus":
            assert float(row["perron_pct"]) == 0.0


def test_the_layer_curves_and_the_markdown(audited):
    layers = _rows(audited / f"{NAME}_layers.csv")
    assert tuple(layers[0]) == LAYER_COLUMNS
    hfc = [r for r in layers if r["metric"] == "hfc_lfc"]
    assert len(hfc) == 3 * SEEDS * (DEPTH + 1)  # the embedding and every block's output
    assert all(int(r["n"]) == QUICK_INPUTS for r in hfc)
    text = (audited / f"{NAME}.md").read_text(encoding="utf-8")
    assert "not a post-hoc transform" in text
    assert "98.92" in text
    assert (audited / f"{NAME}.png").read_bytes().startswith(b"\x89PNG")


def test_a_rerun_gives_byte_identical_csvs(results, audited, tmp_path):
    assert main(["--quick", "--results", str(results), "--out", str(tmp_path)]) == 0
    for name in (f"{NAME}.csv", f"{NAME}_layers.csv"):
        assert (tmp_path / name).read_bytes() == (audited / name).read_bytes()


def test_summary_rows_are_mean_and_std_over_seeds():
    seeds = [
        {"variant": "standard", "fraction": 1.0, "h": "stored", "n_inputs": 4, "cases": 8}
        | {"perron_pct": p}
        | {"non_perron_pct": 100.0 - p, "contracting_pct": 0.0, "balanced_pct": 0.0}
        for p in (75.0, 100.0, 50.0)
    ]
    (row,) = summary_rows(seeds)
    assert row["n_seeds"] == 3
    assert row["cases"] == 24
    assert row["seed"] is None
    assert row["perron_pct"] == pytest.approx(75.0)
    assert row["perron_std"] == pytest.approx(25.0)
    assert row["non_perron_pct"] == pytest.approx(25.0)


def test_a_folder_without_models_is_one_line(tmp_path):
    with pytest.raises(InputError, match="oversmooth train --export-onnx") as info:
        main(["--results", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert "\n" not in str(info.value)


def test_the_script_exits_2_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "oversmooth.figures.trained_audit", "--results", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "no exported models" in done.stderr


def test_on_demand_only():
    assert NAME in ON_DEMAND
    assert NAME not in SCRIPTS


def test_find_models_reads_variant_fraction_and_seed_largest_fraction_first(tmp_path):
    models = tmp_path / MODELS_FOLDER
    models.mkdir()
    names = [
        "minus-f1.0-s0.onnx",
        "plus-f0.5-s1.onnx",
        "standard-f1.0-s1.onnx",
        "standard-f1.0-s0.onnx",
        "plus-f1.0-s0.onnx",
        "notes.onnx",  # not an export: left out
        "plus-f1.0-s0.txt",
    ]
    for name in names:
        (models / name).write_bytes(b"")
    (tmp_path / INPUTS_FILE).write_bytes(b"")
    found = find_models(tmp_path)
    assert [(v, f, s, p.name) for v, f, s, p in found] == [
        ("standard", 1.0, 0, "standard-f1.0-s0.onnx"),
        ("standard", 1.0, 1, "standard-f1.0-s1.onnx"),
        ("plus", 1.0, 0, "plus-f1.0-s0.onnx"),
        ("minus", 1.0, 0, "minus-f1.0-s0.onnx"),
        ("plus", 0.5, 1, "plus-f0.5-s1.onnx"),
    ]


def test_find_models_wants_the_inputs_beside_the_models(tmp_path):
    (tmp_path / MODELS_FOLDER).mkdir()
    (tmp_path / MODELS_FOLDER / "plus-f1.0-s0.onnx").write_bytes(b"")
    with pytest.raises(InputError, match=INPUTS_FILE) as info:
        find_models(tmp_path)
    assert "\n" not in str(info.value)
