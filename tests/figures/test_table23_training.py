"""Tables 2–3 from a results folder (no torch: the figure script only reads files)."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from scipy import stats

from oversmooth.figures import ON_DEMAND, SCRIPTS
from oversmooth.figures.__main__ import main as figures_main
from oversmooth.figures.table23_training import COLUMNS, main, table_rows
from oversmooth.simulator.errors import InputError

#: accuracy (fraction) of (variant, seed) at full data, clean; corruptions lower it by severity.
CLEAN = {"standard": (0.90, 0.92, 0.91), "plus": (0.85, 0.88, 0.86), "minus": (0.91, 0.93, 0.90)}


def _write_results(folder, fractions=(1.0, 0.5)):
    folder.mkdir(parents=True, exist_ok=True)
    header = ["variant", "fraction", "seed", "data", "corruption", "severity", "accuracy"]
    with (folder / "results.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for variant, accuracies in CLEAN.items():
            for fraction in fractions:
                for seed, accuracy in enumerate(accuracies):
                    base = accuracy * fraction
                    writer.writerow([variant, fraction, seed, "digits", "clean", 0, base])
                    for name, step in (("gaussian_noise", 0.05), ("gaussian_blur", 0.03)):
                        for severity in range(1, 6):
                            value = base - step * severity * (1 + (variant == "plus"))
                            writer.writerow(
                                [variant, fraction, seed, "digits", name, severity, value]
                            )
    return folder


def _rows(results):
    from oversmooth.figures.table23_training import read_results

    return table_rows(read_results(results))


def test_table2_means_stds_and_paired_tests(tmp_path):
    rows = _rows(_write_results(tmp_path / "r"))
    row = next(
        r
        for r in rows
        if r["source"] == "ours"
        and r["table"] == 2
        and r["variant"] == "plus"
        and r["fraction"] == 1.0
    )
    plus, standard = 100 * np.array(CLEAN["plus"]), 100 * np.array(CLEAN["standard"])
    assert row["n_seeds"] == 3
    assert row["mean"] == pytest.approx(plus.mean())
    assert row["std"] == pytest.approx(plus.std(ddof=1))
    assert row["diff_mean"] == pytest.approx((plus - standard).mean())
    assert row["diff_std"] == pytest.approx((plus - standard).std(ddof=1))
    assert row["p_value"] == pytest.approx(stats.ttest_rel(plus, standard).pvalue)
    own = next(
        r for r in rows if r["table"] == 2 and r["variant"] == "standard" and r["source"] == "ours"
    )
    assert own["diff_mean"] is None


def test_table3_is_at_the_largest_fraction_with_clean_severity_zero_and_a_mean(tmp_path):
    rows = [
        r
        for r in _rows(_write_results(tmp_path / "r"))
        if r["source"] == "ours" and r["table"] == 3
    ]
    assert {r["fraction"] for r in rows} == {1.0}
    assert {r["corruption"] for r in rows} == {"mean", "gaussian_noise", "gaussian_blur"}
    mean5 = next(
        r
        for r in rows
        if r["corruption"] == "mean" and r["severity"] == 5 and r["variant"] == "plus"
    )
    expected = 100 * (np.array(CLEAN["plus"]) - (0.05 + 0.03) / 2 * 5 * 2)
    assert mean5["mean"] == pytest.approx(expected.mean())
    zero = next(
        r
        for r in rows
        if r["corruption"] == "gaussian_blur" and r["severity"] == 0 and r["variant"] == "minus"
    )
    assert zero["mean"] == pytest.approx(100 * np.mean(CLEAN["minus"]))


def test_outputs_with_the_caveat_and_the_paper_beside(tmp_path, capsys):
    results = _write_results(tmp_path / "r")
    out = tmp_path / "out"
    assert main(["--results", str(results), "--out", str(out)]) == 0
    with (out / "table23_training.csv").open(newline="", encoding="utf-8") as handle:
        assert tuple(next(csv.reader(handle))) == COLUMNS
    text = (out / "table23_training.md").read_text(encoding="utf-8")
    assert "not the paper's" in text
    assert "66.78 ± 0.10" in text
    assert "28.67 ± 0.50" in text
    assert "p = " in text
    assert (out / "table23_training.png").read_bytes().startswith(b"\x89PNG")


def test_missing_results_are_one_line(tmp_path):
    with pytest.raises(InputError, match="oversmooth train") as info:
        main(["--results", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert "\n" not in str(info.value)


def test_not_run_by_default_but_by_name(tmp_path, monkeypatch, capsys):
    assert "table23_training" in ON_DEMAND
    assert "table23_training" not in SCRIPTS
    monkeypatch.chdir(tmp_path)
    _write_results(tmp_path / "train-out")
    assert figures_main(["--only", "table23_training", "--out", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "table23_training.md").exists()


def test_a_default_run_says_it_skipped_the_tables(tmp_path, monkeypatch, capsys):
    import oversmooth.figures.__main__ as figures_entry

    monkeypatch.setattr(figures_entry, "SCRIPTS", ())  # none of the other scripts: just the notice
    assert figures_main(["--out", str(tmp_path / "figs")]) == 0
    assert "table23_training: skipped (on demand" in capsys.readouterr().out
    assert not (tmp_path / "figs" / "table23_training.csv").exists()
