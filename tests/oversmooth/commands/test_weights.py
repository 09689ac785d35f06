"""``oversmooth weights`` (:mod:`oversmooth.commands.weights`) through the dispatcher: every block in
the documented layout, float64, equal to the builder's weights; nothing written on a failure;
``--partial`` writes the blocks it matched and says what is missing; an earlier archive is
replaced, another file only with ``--force``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from numpy.testing import assert_array_equal

from tests.importers.builders import NEAR_MISSES
from tests.oversmooth.commands.running import run_cli


# Moved from tests/oversmooth/test_importer_cli.py.
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


# Moved from tests/oversmooth/test_importer_cli.py.
def test_weights_failure_leaves_no_output_file(capsys, tmp_path):
    near_miss = NEAR_MISSES["q_weight_not_constant"](0)  # a failure: refused without --partial
    path = tmp_path / "unread.onnx"
    onnx.save(near_miss.model, path)
    out_file = tmp_path / "W.npz"
    status, _, _ = run_cli(capsys, "weights", path, "--out", out_file)
    assert status == 1
    assert list(tmp_path.iterdir()) == [path]


# Moved from tests/oversmooth/test_importer_cli.py.
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


def test_partial_writes_the_matched_blocks_and_says_what_is_missing(capsys, tmp_path):
    """A model whose one block cannot be read: refused (exit 1, nothing written) without
    ``--partial``; with it the archive holds the other blocks and the output names the gap."""
    near_miss = NEAR_MISSES["q_weight_not_constant"](0)
    path = tmp_path / "unread.onnx"
    onnx.save(near_miss.model, path)
    out_file = tmp_path / "W.npz"
    status, out, err = run_cli(capsys, "weights", path, "--out", out_file, "--partial")
    assert status == 0, err
    with np.load(out_file) as saved:
        written = {key.split(".")[1] for key in saved.files}
        assert all(saved[key].dtype == np.float64 for key in saved.files)
    lines = out.strip().splitlines()
    assert lines[-1] == f"wrote {out_file}: {len(written)} block(s), {len(saved.files)} arrays"
    assert lines[0].startswith("PARTIAL: 1 of 2 attention blocks not matched")
    assert "Q projection weight is not a constant" in lines[0]
    assert len(written) == 1
