"""``oversmooth spectra`` (:mod:`oversmooth.commands.spectra`) through the dispatcher: the tidy CSV
of stored and effective kinds, its eigenvalues those NumPy finds in the weights ``oversmooth
weights`` writes, ``--summary``'s numbers recomputed from the CSV; nothing written for a missing
model."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from oversmooth.importers.value_spectra import LAYER_HEAD, SPECTRUM_KINDS
from oversmooth.simulator import tolerances as tol
from tests.oversmooth.commands.running import run_cli


# Moved from tests/oversmooth/test_importer_cli.py.
def read_rows(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# Moved from tests/oversmooth/test_importer_cli.py.
@pytest.mark.parametrize(
    "name", ["vit_prenorm_layerscale", "bert_legacy", "llama_rmsnorm_rope_gqa"]
)
def test_spectra_csv_is_tidy_with_stored_and_effective_kinds(capsys, tmp_path, variant_file, name):
    path, built = variant_file(name)
    out_file = tmp_path / "spectra.csv"
    status, out, err = run_cli(capsys, "spectra", path, "--out", out_file, "--summary")
    assert status == 0, err
    rows = read_rows(out_file)
    assert list(rows[0]) == ["block", "head", "kind", "real", "imag"]
    expected_kinds = set(SPECTRUM_KINDS)
    assert {row["kind"] for row in rows} == expected_kinds
    if built.blocks[0].norm != "pre" and built.blocks[0].layer_scale is None:  # nothing to fold
        stored = [row["real"] for row in rows if row["kind"] == "head"]
        assert stored == [row["real"] for row in rows if row["kind"] == "head-effective"]
    for block in built.blocks:
        mine = [row for row in rows if int(row["block"]) == block.index]
        heads = [row for row in mine if row["kind"] == "head"]
        layers = [row for row in mine if row["kind"] == "layer"]
        assert len(heads) == block.n_heads * block.d_head
        assert {int(row["head"]) for row in heads} == set(range(block.n_heads))
        assert len(layers) == block.d_model
        assert {int(row["head"]) for row in layers} == {LAYER_HEAD}
    values = np.array([complex(float(row["real"]), float(row["imag"])) for row in rows])
    assert np.all(np.isfinite(values))
    for kind in expected_kinds:
        assert any(line.split()[:1] == [kind] for line in out.splitlines()), kind


# Moved from tests/oversmooth/test_importer_cli.py.
def test_spectra_without_summary_prints_only_where_it_wrote(capsys, tmp_path, variant_file):
    path, _ = variant_file("bert_legacy")
    out_file = tmp_path / "spectra.csv"
    status, out, _ = run_cli(capsys, "spectra", path, "--out", out_file)
    assert status == 0
    assert out.strip().splitlines() == [next(iter(out.strip().splitlines()))]
    assert str(out_file) in out


# Moved from tests/oversmooth/test_importer_cli.py.
def test_spectra_of_a_missing_model_writes_nothing(capsys, tmp_path):
    out_file = tmp_path / "spectra.csv"
    status, _, err = run_cli(capsys, "spectra", tmp_path / "absent.onnx", "--out", out_file)
    assert status == 2
    assert "absent.onnx" in err
    assert not out_file.exists()


def _nearest_misses(found: np.ndarray, expected: np.ndarray) -> float:
    """The largest distance from an expected eigenvalue to the nearest found one (same counts)."""
    assert found.size == expected.size
    return float(np.max(np.min(np.abs(expected[:, None] - found[None, :]), axis=1)))


def test_stored_eigenvalues_are_numpys_of_the_weights_the_weights_command_writes(
    capsys, tmp_path, variant_file
):
    """Per head the d_head eigenvalues of W_O^h W_V^h, per layer those of W_V W_O, from the
    arrays of ``oversmooth weights`` (heads as contiguous column / row blocks)."""
    path, built = variant_file("bert_legacy")
    assert run_cli(capsys, "spectra", path, "--out", tmp_path / "s.csv")[0] == 0
    assert run_cli(capsys, "weights", path, "--out", tmp_path / "w.npz")[0] == 0
    rows = read_rows(tmp_path / "s.csv")
    with np.load(tmp_path / "w.npz") as saved:
        for block in built.blocks:
            W_V, W_O = saved[f"blocks.{block.index}.W_V"], saved[f"blocks.{block.index}.W_O"]
            scale = np.linalg.norm(W_V) * np.linalg.norm(W_O)
            expected = {LAYER_HEAD: np.linalg.eigvals(W_V @ W_O)}
            for h in range(block.n_heads):
                cut = slice(h * block.d_head, (h + 1) * block.d_head)
                expected[h] = np.linalg.eigvals(W_O[cut] @ W_V[:, cut])
            for head, values in expected.items():
                kind = "layer" if head == LAYER_HEAD else "head"
                found = np.array(
                    [
                        complex(float(r["real"]), float(r["imag"]))
                        for r in rows
                        if (int(r["block"]), int(r["head"]), r["kind"]) == (block.index, head, kind)
                    ]
                )
                assert _nearest_misses(found, values) <= tol.EIG_TOL * scale, (block.index, head)


def test_the_summary_is_recomputed_from_the_csv(capsys, tmp_path, variant_file):
    """Count, negative share, median real part, share inside |1 + λ| < 1 and spectral radius per
    kind, as printed, from the rows written."""
    path, _ = variant_file("vit_prenorm_layerscale")
    status, out, _ = run_cli(capsys, "spectra", path, "--out", tmp_path / "s.csv", "--summary")
    assert status == 0
    rows = read_rows(tmp_path / "s.csv")
    printed = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert list(printed) == list(SPECTRUM_KINDS)
    for kind, cells in printed.items():
        values = np.array(
            [complex(float(r["real"]), float(r["imag"])) for r in rows if r["kind"] == kind]
        )
        count, negative, median, inside, radius = (float(cell) for cell in cells)
        assert count == values.size
        assert negative == pytest.approx(np.count_nonzero(values.real < 0) / values.size, abs=5e-4)
        assert median == pytest.approx(np.median(values.real), rel=5e-3, abs=1e-12)
        inside_share = sum(abs(1 + v) < 1 for v in values) / values.size
        assert inside == pytest.approx(inside_share, abs=5e-4)
        assert radius == pytest.approx(max(abs(v) for v in values), rel=5e-4)
