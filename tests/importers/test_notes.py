"""Notes (importers.notes): one typed line, printed as its text; every kind the importer makes a
note of is a declared NoteKind, and every NoteKind is documented."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import get_args

import pytest

from oversmooth.importers.notes import Note, NoteKind

PACKAGE = Path(__file__).resolve().parents[2] / "oversmooth"


def kinds_made() -> dict[str, list[str]]:
    """Every literal kind that ``oversmooth/`` passes to ``Note(...)``, with where."""
    made: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Note"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                made.setdefault(node.args[0].value, []).append(path.name)
    return made


def test_a_note_prints_as_its_text() -> None:
    note = Note("batching", "inputs ran in 3 batches of at most 8")
    assert str(note) == "inputs ran in 3 batches of at most 8"
    assert f"{note}" == note.text


def test_notes_are_frozen_values() -> None:
    note = Note("random", "the inputs are noise")
    assert note == Note("random", "the inputs are noise")
    assert len({note, Note("random", "the inputs are noise")}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        note.text = "other"  # type: ignore[misc]


def test_every_kind_the_importer_makes_is_declared() -> None:
    made = kinds_made()
    assert len(made) >= 10  # the scan finds the notes
    assert not set(made) - set(get_args(NoteKind)), made


def test_every_declared_kind_is_made_and_documented() -> None:
    declared = get_args(NoteKind)
    assert set(declared) == set(kinds_made())
    documented = Note.__doc__ or ""
    assert all(f"``{kind}``" in documented for kind in declared)
