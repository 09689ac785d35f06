"""``oversmooth train`` (:mod:`oversmooth.commands.train`) where torch is not needed: without torch
one line naming the extra, exit 2; bad numbers refused at parse time; the audit's inputs written
beside exported models. (Training itself, with torch: tests/training/test_cli.py.)"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from oversmooth.cli import main
from oversmooth.commands.train import AUDIT_IMAGES, write_audit_inputs


# Moved from tests/training/test_cli_without_torch.py.
def test_without_torch_the_command_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # find_spec("torch") is None: as if absent
    out = tmp_path / "out"
    assert main(["train", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'oversmooth[train]'" in err
    assert not out.exists()


# Moved from tests/training/test_cli_without_torch.py.
def test_a_bad_fraction_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--fraction", "1.5", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "(0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "half"])
def test_a_psi_init_that_is_not_a_finite_number_is_a_usage_error(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", f"--psi-init={value}", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "argument --psi-init: expected a" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_audit_inputs_are_the_first_test_images_clean_with_their_labels(tmp_path):
    """At most AUDIT_IMAGES test images, float32 in the graph's (N, C, H, W) layout, each
    labelled by its index and class; training images never."""
    rng = np.random.default_rng(0)
    n_test = AUDIT_IMAGES + 7
    data = types.SimpleNamespace(
        x_train=np.full((3, 1, 8, 8), 9.0),
        x_test=rng.random((n_test, 1, 8, 8)),
        y_test=rng.integers(0, 10, n_test),
    )
    path = write_audit_inputs(tmp_path / "inputs.npz", data)
    with np.load(path) as saved:
        assert sorted(saved.files) == ["images", "labels"]
        np.testing.assert_array_equal(
            saved["images"], data.x_test[:AUDIT_IMAGES].astype(np.float32), strict=True
        )
        labels = saved["labels"].tolist()
    assert len(labels) == AUDIT_IMAGES
    assert labels[:2] == [f"test-0-class-{data.y_test[0]}", f"test-1-class-{data.y_test[1]}"]
