"""``oversmooth models`` (:mod:`oversmooth.commands.models`) without the zoo's packages: one row per
zoo entry with its pin, shape and licence, the status each model has (no path unless installed or
cached), and a table whose columns line up.

With the models installed, and ``fetch``: ``tests/importers/test_zoo.py``.
"""

from __future__ import annotations

import json

from oversmooth.cli import main
from oversmooth.importers import zoo


def test_models_json_has_every_zoo_entry_and_no_path_for_a_missing_one(monkeypatch, capsys):
    monkeypatch.setattr(zoo, "model_status", lambda name: "missing")
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == [model.name for model in zoo.models()]
    for row, model in zip(rows, zoo.models(), strict=True):
        assert (row["package"], row["licence"], row["sha256"]) == (
            model.pin,
            model.licence,
            model.sha256,
        )
        assert (row["n_layers"], row["n_heads"], row["d_model"]) == (
            model.n_layers,
            model.n_heads,
            model.d_model,
        )
        assert (row["status"], row["path"]) == ("missing", None)


def test_the_models_table_lines_up_its_columns(monkeypatch, capsys):
    """Each column starts where its header does; the shape reads ``layers x heads x d``."""
    monkeypatch.setattr(zoo, "model_status", lambda name: "missing")
    assert main(["models"]) == 0
    header, *lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert len(lines) == len(zoo.models())
    starts = [header.index(title) for title in ("package", "kind", "layers x heads x d", "status")]
    for line, model in zip(lines, zoo.models(), strict=True):
        assert line.startswith(f"{model.name} ")
        cells = [line[start:].split("  ")[0] for start in starts]
        shape = f"{model.n_layers} x {model.n_heads} x {model.d_model}"
        assert cells == [model.pin, model.kind, shape, "missing"]
        assert line.endswith(f"  {model.licence}")
