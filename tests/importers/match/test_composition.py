"""The matcher is composed, not joined: no class in :mod:`oversmooth.importers.match` has two project bases
or sits on a chain of more than three project classes.

The matcher's roles (scores, projections, rotary, norms, head layout, residual stream) are held as
components over one match attempt's basis and shape context, not merged into one object by
multiple or deep inheritance.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import oversmooth.importers.match as match_package
from oversmooth.importers.graph import model_from_proto
from oversmooth.importers.match.core import Matcher
from oversmooth.importers.match.layout import LayoutProbe
from oversmooth.importers.match.rotary import RotaryMatcher
from oversmooth.importers.match.stream import StreamMatcher
from oversmooth.importers.match.walker import MatchBasis
from tests.importers.builders import VARIANTS, assemble


def _match_classes() -> list[type]:
    found: list[type] = []
    for info in pkgutil.iter_modules(match_package.__path__):
        module = importlib.import_module(f"oversmooth.importers.match.{info.name}")
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
        if len(
            project := [b for b in cls.__bases__ if b.__module__.startswith("oversmooth.importers")]
        )
        > 1
    }
    assert joined == {}


def _project_chain(cls: type) -> list[str]:
    """``cls`` and its project ancestors (importers.*), nearest first."""
    return [
        base.__qualname__
        for base in cls.__mro__
        if base.__module__.startswith("oversmooth.importers")
    ]


def test_no_match_class_sits_on_a_chain_of_more_than_three_project_classes() -> None:
    """A reader (or a call-graph tool) follows a walk through at most two bases; deeper roles are
    components (Matcher holds scores, projections, layout and stream)."""
    deep = {
        cls.__qualname__: chain for cls in _match_classes() if len(chain := _project_chain(cls)) > 3
    }
    assert deep == {}
    assert _project_chain(Matcher) == ["Matcher", "GraphWalker"]


def test_one_attempts_components_share_its_basis_and_shape_context() -> None:
    """The parts of one match attempt read one basis and one shape context (what one part pins,
    the others see); other attempts are tested in test_attempts."""
    model = model_from_proto(assemble(sorted(VARIANTS)[0], 0).built.model)
    matcher = Matcher(MatchBasis(model.index, 2, 7))
    assert isinstance(matcher.layout, LayoutProbe)
    assert isinstance(matcher.stream, StreamMatcher)
    assert isinstance(matcher.rotary, RotaryMatcher)
    for part in (
        matcher.scores,
        matcher.projections,
        matcher.layout,
        matcher.stream,
        matcher.rotary,
    ):
        assert part.index is matcher.index
        assert part.basis is matcher.basis
        assert part.context is matcher.context
