"""The matcher's bounds (:mod:`oversmooth.importers.match.limits`): one table of positive whole
numbers, the probe sizes chosen so that a layout mixing batch and tokens shows, and no other
module of the matcher keeping a bound of its own (what a walk gives up at is read in one place).

That a walk gives up at its bound is tested where the walk is (``test_walker``: MAX_ANCESTRY).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import oversmooth.importers.match as match_package
from oversmooth.importers.match import limits

BOUNDS = {name: value for name, value in vars(limits).items() if name.isupper()}
#: Names that spell a bound of a walk or a probe.
_BOUND_NAME = re.compile(r"^(MAX_|PROBE_|LONG_PROBE_)|_(STEPS|DEPTH|TENSORS|NODES)$")


def test_every_bound_is_a_positive_whole_number() -> None:
    assert len(BOUNDS) >= 20
    bad = {name: value for name, value in BOUNDS.items() if type(value) is not int or value <= 0}
    assert bad == {}


def test_the_probe_sizes_tell_batch_from_tokens() -> None:
    """Batch and sequence differ and exceed one (a layout that swaps or merges them changes the
    decoded positions); the second probe is long enough for one HuBERT frame (400 samples)."""
    assert limits.PROBE_BATCH > 1
    assert limits.PROBE_SEQUENCE > 1
    assert limits.PROBE_BATCH != limits.PROBE_SEQUENCE
    assert limits.LONG_PROBE_SEQUENCE >= 400
    # A ViT-B/16 at 224 pixels exported with static shapes: (1, 197) tokens are probed.
    assert limits.PROBE_BATCH * limits.LONG_PROBE_SEQUENCE <= limits.MAX_PROBE_TOKENS
    assert 197 <= limits.MAX_PROBE_TOKENS < 2**20 * 2**20


def test_walk_bounds_sit_above_what_the_corpus_needs() -> None:
    """The sizes the docstrings give for the deepest exporter chains fit under each bound."""
    assert limits.MAX_WALK >= 20
    assert limits.POSITION_TERM_DEPTH >= 15
    assert limits.NORM_SEARCH_DEPTH >= 9
    assert limits.MAX_ANCESTRY >= 3000
    assert limits.MAX_TERM_ELEMENTS >= 12 * 577 * 577


def _module_bounds(path: Path) -> list[str]:
    """Module-level integer constants of ``path`` whose names spell a bound."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = (
            [node.target]
            if isinstance(node, ast.AnnAssign)
            else node.targets
            if isinstance(node, ast.Assign)
            else []
        )
        value = getattr(node, "value", None)
        for target in targets:
            if (
                isinstance(target, ast.Name)
                and _BOUND_NAME.search(target.id)
                and isinstance(value, ast.Constant | ast.BinOp)
            ):
                found.append(f"{path.name}: {target.id}")
    return found


def test_no_other_matcher_module_keeps_a_bound_of_its_own() -> None:
    folder = Path(match_package.__file__).parent
    own = [
        name
        for path in sorted(folder.glob("*.py"))
        if path.name != "limits.py"
        for name in _module_bounds(path)
    ]
    assert own == []
    assert sorted(n.split(": ")[1] for n in _module_bounds(folder / "limits.py")) == sorted(BOUNDS)


def test_the_bound_finder_finds_a_bound(tmp_path: Path) -> None:
    """The check above can fail: a module-level ``MAX_HOPS = 1 << 4`` is a bound."""
    module = tmp_path / "walk.py"
    module.write_text("MAX_HOPS = 1 << 4\nNAME = 'x'\nSEARCH_DEPTH: int = 3\n")
    assert _module_bounds(module) == ["walk.py: MAX_HOPS", "walk.py: SEARCH_DEPTH"]


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_bound_is_read_somewhere(name: str) -> None:
    """A bound no module reads is a table entry that bounds nothing."""
    folder = Path(match_package.__file__).parent.parent
    readers = [
        path
        for path in folder.rglob("*.py")
        if path.name != "limits.py" and re.search(rf"\b{name}\b", path.read_text("utf-8"))
    ]
    assert readers, name
