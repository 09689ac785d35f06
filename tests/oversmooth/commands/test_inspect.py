"""``oversmooth inspect`` (:mod:`oversmooth.commands.inspect`) through the dispatcher: the table of
blocks for a zoo name, the JSON report against the builder's own blocks, ``--explain``'s matches
and rejections (exit 1 when nothing matched), an unknown name as a usage error."""

from __future__ import annotations

import json

import onnx
import pytest

from tests.importers.builders import NEAR_MISSES, VARIANTS
from tests.importers.test_real_models import REAL_MODELS
from tests.oversmooth.commands.running import run_cli
from tests.realmodels import require_real_model

BLOCK_KEYS = {"index", "n_heads", "n_kv_heads", "d_model", "d_head", "norm", "norm_kind", "sources"}


# Moved from tests/oversmooth/test_importer_cli.py.
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


# Moved from tests/oversmooth/test_importer_cli.py.
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


# Moved from tests/oversmooth/test_importer_cli.py.
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


# Moved from tests/oversmooth/test_importer_cli.py.
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


# Moved from tests/oversmooth/test_importer_cli.py.
def test_inspect_unknown_zoo_name_is_a_usage_error(capsys):
    status, _, err = run_cli(capsys, "inspect", "no-such-model")
    assert status == 2
    assert len(err.strip().splitlines()) == 1
