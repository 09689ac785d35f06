"""``oversmooth transform`` (:mod:`oversmooth.commands.transform`): its command line (one transform
and an output), the reparameterised and randomly initialised models it writes, refusals of a
quantised or missing model, and an earlier transform's output replaced but never the model read.

The transforms themselves are ``tests/importers/test_transform.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import pytest

from oversmooth.cli import main
from oversmooth.commands import transform as cmd_transform
from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.transform import random_init
from oversmooth.importers.value_spectra import head_eigenvalues
from oversmooth.importers.weights import BlockWeights, extract
from tests.importers.audited import SEED, builder_inputs
from tests.importers.audited import saved_model as saved
from tests.importers.builders import assemble
from tests.oversmooth.commands.running import run_cli


def weights_of(path: Path) -> list[BlockWeights]:
    return extract(model_from_proto(onnx.load(path)))


def _only_inputs_left(folder: Path, inputs: set[str]) -> bool:
    return {path.name for path in folder.iterdir()} == inputs


# Moved from tests/oversmooth/test_importer_cli.py.
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


# Moved from tests/importers/test_transform.py.
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="oversmooth")
    cmd_transform.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


# Moved from tests/importers/test_transform.py.
def test_command_writes_the_reparameterized_model(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plus.onnx"
    source = str(saved(model_dir, "bert_legacy"))
    args = _parse(["transform", source, "--reparam", "plus", "--out", str(out)])
    assert args.func(args) == 0
    assert str(out) in capsys.readouterr().out
    blocks = weights_of(out)
    assert all(np.all(head_eigenvalues(b, h).real > 0) for b in blocks for h in range(b.n_heads))


# Moved from tests/importers/test_transform.py.
def test_command_random_init_uses_seed_and_std(model_dir: Path, tmp_path: Path) -> None:
    source = str(saved(model_dir, "bert_legacy"))
    for name in ("a", "b"):
        out = str(tmp_path / f"{name}.onnx")
        args = _parse(
            ["transform", source, "--random-init", "--seed", "9", "--std", "0.1", "--out", out]
        )
        assert args.func(args) == 0
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    expected = random_init(source, tmp_path / "c.onnx", std=0.1, seed=9)
    assert expected.read_bytes() == (tmp_path / "a.onnx").read_bytes()


# Moved from tests/importers/test_transform.py.
@pytest.mark.parametrize(
    "argv",
    [
        ["transform", "m.onnx", "--out", "x.onnx"],
        ["transform", "m.onnx", "--random-init", "--reparam", "plus", "--out", "x.onnx"],
        ["transform", "m.onnx", "--reparam", "zero", "--out", "x.onnx"],
        ["transform", "m.onnx", "--random-init"],
    ],
)
def test_command_line_needs_one_transform_and_an_output(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parse(argv)
    assert exit_info.value.code == 2


# Moved from tests/importers/test_transform.py.
def test_oversmooth_transform_end_to_end(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "minus.onnx"
    code = main(
        ["transform", str(saved(model_dir, "bert_legacy")), "--reparam", "minus", "--out", str(out)]
    )
    assert code == 0
    assert str(out) in capsys.readouterr().out
    result = audit(out, builder_inputs(assemble("bert_legacy", SEED)), provider="cpu")
    assert result.dominance_summary().perron == 0.0


# Moved from tests/importers/test_transform.py.
@pytest.mark.parametrize("how", [["--reparam", "plus"], ["--random-init"]])
def test_oversmooth_transform_refuses_a_quantised_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: list[str]
) -> None:
    source = saved(tmp_path, "dynamic_quant")
    out = tmp_path / "out.onnx"
    assert main(["transform", str(source), *how, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "quantised" in err
    assert _only_inputs_left(tmp_path, {source.name})


# Moved from tests/importers/test_transform.py.
def test_oversmooth_transform_names_a_missing_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.onnx"
    code = main(["transform", str(missing), "--random-init", "--out", str(tmp_path / "x.onnx")])
    assert code == 2
    assert "missing.onnx" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
