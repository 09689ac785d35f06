"""Reject codes are one enumeration: every code a failure carries is a member, and each is
classified once as skipped by design or a failure."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from oversmooth import importers
from oversmooth.importers.match import RejectCode
from oversmooth.importers.match.codes import DISPOSITIONS, Disposition, by_design, projection_code

MATCH = Path(importers.__file__).parent / "match"


def test_projection_codes_are_members_for_every_role() -> None:
    for role in ("Q", "K", "V", "output"):
        for problem in ("projection_missing", "projection_unsupported", "weight_not_constant"):
            assert projection_code(role, problem) in RejectCode  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid RejectCode"):
        projection_code("W", "projection_missing")


def test_no_matcher_module_spells_a_code_as_a_string() -> None:
    """RejectError and MatchFailure get a RejectCode, never a string literal or an f-string."""
    found = []
    for path in sorted(MATCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "func", None)
            called = getattr(name, "id", getattr(name, "attr", None))
            if not isinstance(node, ast.Call) or called not in ("RejectError", "MatchFailure"):
                continue
            position = 0 if called == "RejectError" else 3
            code = node.args[position] if len(node.args) > position else None
            if isinstance(code, ast.Constant | ast.JoinedStr):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def test_every_code_is_classified_by_design_or_failure() -> None:
    """One table classifies every RejectCode; only cross-attention and windowed attention lie
    outside the theory of self-attention (skipped by design), every other decline is a failure."""
    assert set(DISPOSITIONS) == set(RejectCode)
    assert set(DISPOSITIONS.values()) <= set(get_args(Disposition))
    skipped = {code for code in RejectCode if by_design(code)}
    assert skipped == {RejectCode.CROSS_ATTENTION, RejectCode.WINDOWED_ATTENTION}


def test_the_table_cannot_be_changed_at_run_time() -> None:
    with pytest.raises(TypeError):
        DISPOSITIONS[RejectCode.HEAD_LAYOUT] = "by_design"  # type: ignore[index]
