"""The ``inspect``, ``weights`` and ``spectra`` commands, driven through ``oversmooth.cli.main``."""

from __future__ import annotations

import csv
import json

import numpy as np
import onnx
import pytest
from numpy.testing import assert_array_equal

from oversmooth.cli import main
from oversmooth.importers.value_spectra import LAYER_HEAD, SPECTRUM_KINDS
from tests.importers.builders import NEAR_MISSES, VARIANTS
from tests.importers.test_real_models import REAL_MODELS
from tests.realmodels import require_real_model

BLOCK_KEYS = {"index", "n_heads", "n_kv_heads", "d_model", "d_head", "norm", "norm_kind", "sources"}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def variant_file(tmp_path):
    """Save a builder variant to disk; returns (path, Built)."""

    def save(name: str):
        built = VARIANTS[name](0)
        path = tmp_path / f"{name}.onnx"
        onnx.save(built.model, path)
        return path, built

    return save


# -- inspect ----------------------------------------------------------------------------------


@pytest.mark.realmodel
def test_inspect_zoo_name_prints_one_row_per_block(capsys):
    require_real_model("minilm-l3")
    status, out, err = run_cli(capsys, "inspect", "minilm-l3")
    assert status == 0, err
    lines = out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("block"))
    rows = [
        line.split() for line in lines[header + 1 : header + 1 + REAL_MODELS["minilm-l3"]["blocks"]]
    ]
    assert [row[0] for row in rows] == ["0", "1", "2"]
    assert all(row[1:7] == ["12", "12", "384", "32", "post", "layernorm"] for row in rows)


@pytest.mark.parametrize("name", ["vit_prenorm_layerscale", "llama_rmsnorm_rope_gqa"])
def test_inspect_json_describes_blocks_and_failures(capsys, variant_file, name):
    path, built = variant_file(name)
    status, out, _ = run_cli(capsys, "inspect", path, "--json")
    assert status == 0
    report = json.loads(out)
    assert set(report) >= {"model", "blocks", "failures"}
    assert report["failures"] == []
    assert len(report["blocks"]) == len(built.blocks)
    for block, want in zip(report["blocks"], built.blocks, strict=True):
        assert BLOCK_KEYS <= set(block)
        for key in BLOCK_KEYS - {"sources"}:
            assert block[key] == getattr(want, key), key
        assert {"W_Q", "W_K", "W_V", "W_O"} <= set(block["sources"])
        assert block["has_layer_scale"] == (want.layer_scale is not None)


def test_inspect_explain_shows_matches_and_rejections(capsys, tmp_path):
    near_miss = NEAR_MISSES["not_qk_product"](0)
    path = tmp_path / "classifier.onnx"
    onnx.save(near_miss.model, path)
    status, out, _ = run_cli(capsys, "inspect", path, "--explain")
    assert status == 0
    assert "2 attention block(s) matched, 1 rejected (1 not attention)" in out
    assert "rejected [no_qk_matmul]" in out
    assert "not a query-key product" in out
    assert ": not attention: its scores are a product with a constant matrix" in out
    status, out, _ = run_cli(capsys, "inspect", path)
    (line,) = [line for line in out.splitlines() if line.startswith("Softmax ")]
    assert ": not attention: its scores are a product with a constant matrix" in line
    assert "rejected" not in out
    status, out, _ = run_cli(capsys, "inspect", path, "--json")
    (failure,) = json.loads(out)["failures"]
    assert failure["code"] == "no_qk_matmul"
    assert failure["attention"] is False
    assert failure["not_attention"].startswith("its scores are a product with a constant")


def test_inspect_explain_without_any_block_still_explains_and_exits_1(capsys, tmp_path):
    model = VARIANTS["bert_legacy"](0).model
    for node in model.graph.node:  # every Softmax normalises the heads axis instead of the keys
        if node.op_type == "Softmax":
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("axis", 1))
    path = tmp_path / "broken.onnx"
    onnx.save(model, path)
    status, out, err = run_cli(capsys, "inspect", path, "--explain")
    assert status == 1
    assert "rejected" in out
    assert "no attention block found" in err


def test_inspect_unknown_zoo_name_is_a_usage_error(capsys):
    status, _, err = run_cli(capsys, "inspect", "no-such-model")
    assert status == 2
    assert len(err.strip().splitlines()) == 1


# -- weights ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["gpt2_fused_qkv", "vit_prenorm_layerscale", "llama_rmsnorm_rope_gqa"]
)
def test_weights_npz_holds_every_block_in_the_documented_layout(
    capsys, tmp_path, variant_file, name
):
    path, built = variant_file(name)
    out_file = tmp_path / "W.npz"
    status, out, err = run_cli(capsys, "weights", path, "--out", out_file)
    assert status == 0, err
    assert str(out_file) in out
    with np.load(out_file) as saved:
        for want in built.blocks:
            for key in (
                "W_Q",
                "W_K",
                "W_V",
                "W_O",
                "b_Q",
                "b_K",
                "b_V",
                "b_O",
                "gamma",
                "beta",
                "layer_scale",
            ):
                expected = getattr(want, key)
                name_in_file = f"blocks.{want.index}.{key}"
                assert (name_in_file in saved.files) == (expected is not None), name_in_file
                if expected is not None:
                    assert saved[name_in_file].dtype == np.float64
                    assert_array_equal(saved[name_in_file], expected, err_msg=name_in_file)
        assert not any(key.startswith(f"blocks.{len(built.blocks)}.") for key in saved.files)


def test_weights_failure_leaves_no_output_file(capsys, tmp_path):
    near_miss = NEAR_MISSES["q_weight_not_constant"](0)  # a failure: refused without --partial
    path = tmp_path / "unread.onnx"
    onnx.save(near_miss.model, path)
    out_file = tmp_path / "W.npz"
    status, _, _ = run_cli(capsys, "weights", path, "--out", out_file)
    assert status == 1
    assert list(tmp_path.iterdir()) == [path]


# -- spectra ----------------------------------------------------------------------------------


def read_rows(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


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


def test_spectra_without_summary_prints_only_where_it_wrote(capsys, tmp_path, variant_file):
    path, _ = variant_file("bert_legacy")
    out_file = tmp_path / "spectra.csv"
    status, out, _ = run_cli(capsys, "spectra", path, "--out", out_file)
    assert status == 0
    assert out.strip().splitlines() == [next(iter(out.strip().splitlines()))]
    assert str(out_file) in out


def test_spectra_of_a_missing_model_writes_nothing(capsys, tmp_path):
    out_file = tmp_path / "spectra.csv"
    status, _, err = run_cli(capsys, "spectra", tmp_path / "absent.onnx", "--out", out_file)
    assert status == 2
    assert "absent.onnx" in err
    assert not out_file.exists()


def test_outputs_replace_earlier_outputs_but_not_other_files_unless_forced(
    capsys, tmp_path, variant_file
):
    path, _ = variant_file("bert_legacy")
    out = tmp_path / "w.npz"
    assert run_cli(capsys, "weights", path, "--out", out)[0] == 0
    first = out.read_bytes()
    assert run_cli(capsys, "weights", path, "--out", out)[0] == 0  # an earlier output: replaced
    assert out.read_bytes() == first
    other = tmp_path / "thesis.tex"
    other.write_text("precious", encoding="utf-8")
    status, _, err = run_cli(capsys, "weights", path, "--out", other)
    assert status == 2
    assert "not an earlier output" in err
    assert other.read_text(encoding="utf-8") == "precious"
    assert run_cli(capsys, "weights", path, "--out", other, "--force")[0] == 0
    assert other.read_bytes() == first


def test_a_transformed_model_may_be_replaced_by_another_transform(capsys, tmp_path, variant_file):
    path, _ = variant_file("bert_legacy")
    out = tmp_path / "new.onnx"
    for seed in ("1", "2"):
        status, _, err = run_cli(
            capsys, "transform", path, "--random-init", "--seed", seed, "--out", out
        )
        assert status == 0, err
    assert any(entry.key == "oversmooth.transform" for entry in onnx.load(out).metadata_props)
    status, _, err = run_cli(capsys, "transform", out, "--random-init", "--out", out)
    assert status == 2
    assert "must differ from the model" in err
