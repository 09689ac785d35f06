"""The matcher is composed, not joined: no class in :mod:`importers.match` has two project bases.

Issue 24 step 3: the matcher's roles (scores, projections, rotary, norms, head layout, residual
stream) are held as components over one shared walker state, not merged into one object by
multiple inheritance.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import importers.match
from importers.graph import model_from_proto
from importers.match.core import Matcher
from importers.match.layout import LayoutProbe
from importers.match.rotary import RotaryMatcher
from importers.match.stream import StreamMatcher
from importers.match.walker import MatchBasis
from tests.importers.builders import VARIANTS, assemble


def _match_classes() -> list[type]:
    found: list[type] = []
    for info in pkgutil.iter_modules(importers.match.__path__):
        module = importlib.import_module(f"importers.match.{info.name}")
        found.extend(
            value
            for value in vars(module).values()
            if inspect.isclass(value) and value.__module__ == module.__name__
        )
    return found


def test_no_match_class_inherits_from_two_project_classes() -> None:
    classes = _match_classes()
    assert Matcher in classes
    joined = {
        cls.__qualname__: [base.__qualname__ for base in project]
        for cls in classes
        if len(project := [b for b in cls.__bases__ if b.__module__.startswith("importers")]) > 1
    }
    assert joined == {}


def test_one_attempts_components_share_its_basis_and_shape_context() -> None:
    """The parts of one match attempt read one basis and one shape context (what one part pins,
    the others see); other attempts are tested in test_attempts."""
    model = model_from_proto(assemble(sorted(VARIANTS)[0], 0).built.model)
    matcher = Matcher(MatchBasis(model.index, 2, 7))
    assert isinstance(matcher.layout, LayoutProbe)
    assert isinstance(matcher.stream, StreamMatcher)
    assert isinstance(matcher.rotary, RotaryMatcher)
    for part in (matcher.layout, matcher.stream, matcher.rotary):
        assert part.index is matcher.index
        assert part.basis is matcher.basis
        assert part.context is matcher.context
