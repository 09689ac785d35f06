"""The layout stays readable: no import circles, no private names across packages, small modules."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("oversmooth",)
#: A module longer than this holds more than one concept (docs/architecture.md).
MAX_MODULE_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


MODULES = _modules()


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """``(module, name)`` of every project import in ``path``: top level, in functions and under
    TYPE_CHECKING alike. ``from pkg import sub`` counts as importing the module ``pkg.sub``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((sub, "") if sub in modules else (node.module, alias.name))
    return found


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {
        name: {m for m, _ in _imports(path, modules)} - {name} for name, path in modules.items()
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules, or None (iterative DFS)."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if start in state:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None


def test_no_import_cycles_anywhere() -> None:
    cycle = _cycle(_graph(MODULES))
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    """The check can fail: a TYPE_CHECKING import that closes a loop is a cycle."""
    (tmp_path / "a.py").write_text("from b import f\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a import g\n"
    )
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    assert _cycle(_graph(modules)) == ["a", "b", "a"]


def _package(module: str) -> str:
    """The package a module belongs to (its own name for a package ``__init__``)."""
    path = MODULES[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def test_no_private_name_is_imported_from_another_package() -> None:
    crossings = []
    for module, path in MODULES.items():
        for source, name in _imports(path, MODULES):
            private = name.startswith("_") or source.rpartition(".")[2].startswith("_")
            if private and _package(source) != _package(module):
                crossings.append(f"{module} imports {source}{'.' + name if name else ''}")
    assert not crossings, crossings


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines"


def _private_test_imports(path: Path) -> list[str]:
    """Names starting with ``_`` that ``path`` imports from a test module (``tests.….test_*``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("tests.")
            and (node.module or "").rpartition(".")[2].startswith("test_")
        ):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_test_imports_another_tests_private_helpers() -> None:
    """Shared helpers live in a helpers module or a ``conftest.py``, not in another test file."""
    found = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (names := _private_test_imports(path))
    }
    assert not found, found


def test_the_private_import_check_can_fail(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("from tests.importers.graph.test_defuse import _run, ok\n")
    assert _private_test_imports(module) == ["tests.importers.graph.test_defuse._run"]


def test_every_importer_error_is_an_importer_error() -> None:
    """Control-flow exceptions that never leave their module say so ("Internal: ...")."""
    import importlib

    from oversmooth.importers.errors import ImporterError

    foreign = []
    # training may not import the importer (and needs torch, an optional extra, to import)
    libraries_without_it = ("oversmooth.simulator", "oversmooth.figures", "oversmooth.training")
    for module in (m for m in MODULES if not m.startswith(libraries_without_it)):
        namespace = vars(importlib.import_module(module))
        for name, value in namespace.items():
            if (
                isinstance(value, type)
                and issubclass(value, Exception)
                and value.__module__ == module
                and not issubclass(value, ImporterError)
                and not (value.__doc__ or "").startswith("Internal:")
            ):
                foreign.append(f"{module}.{name}")
    assert not foreign, foreign


def test_tests_write_their_caches_outside_the_home_folder() -> None:
    import os
    import tempfile

    from oversmooth.importers.zoo import cache_dir

    for folder in (
        cache_dir(),
        Path(os.environ["MPLCONFIGDIR"]),
        Path(os.environ["XDG_CACHE_HOME"]),
    ):
        assert folder.is_relative_to(tempfile.gettempdir()), folder
        assert not folder.is_relative_to(Path.home()), folder


THEORY = ROOT / "docs" / "theory.md"
_SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
_CLAIMS = re.compile(r"\b[Cc]laims? (\d+)(?:\s*[-–]\s*(\d+))?")


def _project_texts() -> list[Path]:
    paths = [
        p for pkg in (*PACKAGES, "tests", "benchmarks", "scripts") for p in (ROOT / pkg).rglob("*")
    ]
    paths += [ROOT / "README.md", ROOT / "docs" / "architecture.md"]
    return sorted(p for p in paths if p.suffix in (".py", ".md"))


def test_theory_references_resolve_into_docs_theory() -> None:
    """Every "§N.M" and "claim N" in the code and docs names a heading or claim of docs/theory.md."""
    theory = THEORY.read_text(encoding="utf-8")
    sections = set(re.findall(r"^#+ §(\d+(?:\.\d+)?) ", theory, flags=re.MULTILINE))
    claims = {int(n) for n in re.findall(r"^\*\*Claim (\d+)\.\*\*", theory, flags=re.MULTILINE)}
    assert claims == set(range(1, 36))
    missing = []
    for path in _project_texts():
        text = path.read_text(encoding="utf-8")
        for section in _SECTION.findall(text):
            if section not in sections:
                missing.append(f"{path.relative_to(ROOT)}: §{section}")
        for first, last in _CLAIMS.findall(text):
            for claim in range(int(first), int(last or first) + 1):
                if claim not in claims:
                    missing.append(f"{path.relative_to(ROOT)}: claim {claim}")
    assert not missing, missing


#: Names of the team's background material, which is not part of the project. Spelled in pieces so
#: that this test is not itself a file pointing there.
_OUTSIDE = (
    "-".join(("paper", "spec")),
    "/".join(("..", "shared")),
    "-".join(("real", "models")) + ".md",
    "-".join(("house", "style")) + ".md",
    "anchors" + ".md",
)
_TEXT_SUFFIXES = {".py", ".md", ".json", ".csv", ".toml", ".txt", ".cfg", ".yml", ".yaml", ""}


def _every_text_file() -> list[Path]:
    """Every text file of the project: code, docs, generated gallery files, build files."""
    skip = {".git", ".venv", ".hypothesis", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
    files = []
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        if path.is_file() and not parts & skip and path.suffix in _TEXT_SUFFIXES:
            if not any(part.endswith(".egg-info") or part == "__pycache__" for part in parts):
                files.append(path)
    return sorted(files)


def test_no_project_file_points_outside_the_project() -> None:
    """Code, docs and generated files (the gallery's JSON provenance included) stand on their own."""
    offenders = [
        f"{path.relative_to(ROOT)}: {word}"
        for path in _every_text_file()
        for word in _OUTSIDE
        if word in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert not offenders, offenders
