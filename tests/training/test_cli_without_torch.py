"""``oversmooth train`` without torch: one line naming the extra, exit 2 (runs everywhere)."""

from __future__ import annotations

import sys

import pytest

from oversmooth.cli import main


def test_without_torch_the_command_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # find_spec("torch") is None: as if absent
    out = tmp_path / "out"
    assert main(["train", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'oversmooth[train]'" in err
    assert not out.exists()


def test_a_bad_fraction_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--fraction", "1.5", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "(0, 1]" in capsys.readouterr().err
