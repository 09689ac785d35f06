"""Layering: the simulator depends on NumPy, SciPy and the standard library only; the libraries
import one way (simulator ← importers ← figures), and the application package ``oversmooth``
imports all three and is imported by none."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import simulator

SIMULATOR_DIR = Path(simulator.__file__).parent
ROOT = SIMULATOR_DIR.parent
#: Which project packages each package may import (besides itself).
MAY_IMPORT = {
    "simulator": set(),
    "importers": {"simulator"},
    "figures": {"simulator", "importers"},
    "oversmooth": {"simulator", "importers", "figures"},
}
ALLOWED_TOP_LEVEL = {"numpy", "scipy", "simulator", "__future__"} | set(sys.stdlib_module_names)
FORBIDDEN_AT_IMPORT = ("onnx", "onnxruntime", "matplotlib", "importers", "figures", "torch")


def _imported_modules(path: Path) -> set[str]:
    """Top-level names of every absolute import in a module (including ones inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _simulator_modules() -> list[Path]:
    return sorted(SIMULATOR_DIR.rglob("*.py"))


def _project_modules() -> list[tuple[str, Path]]:
    return [(pkg, path) for pkg in MAY_IMPORT for path in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize(
    ("package", "path"), _project_modules(), ids=lambda p: p if isinstance(p, str) else p.name
)
def test_packages_import_one_way(package, path):
    """No library imports the application, and no library imports a library above it."""
    project = _imported_modules(path) & set(MAY_IMPORT)
    upward = project - MAY_IMPORT[package] - {package}
    assert not upward, f"{package}/{path.relative_to(ROOT / package)} imports {sorted(upward)}"


def test_layering_check_sees_an_upward_import(tmp_path):
    """The checker itself can fail: a library module importing the application is caught."""
    module = tmp_path / "up.py"
    module.write_text("def f():\n    from oversmooth.report import save_audit\n")
    assert _imported_modules(module) & set(MAY_IMPORT) - MAY_IMPORT["importers"] == {"oversmooth"}


@pytest.mark.parametrize("path", _simulator_modules(), ids=lambda p: p.name)
def test_simulator_imports_only_numpy_scipy_and_stdlib(path):
    foreign = _imported_modules(path) - ALLOWED_TOP_LEVEL
    assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_static_check_sees_a_forbidden_import(tmp_path):
    """The checker itself can fail: a module importing matplotlib lazily is caught."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    import matplotlib.pyplot as plt\n    return plt\n")
    assert _imported_modules(module) - ALLOWED_TOP_LEVEL == {"matplotlib"}


def _modules_after_import(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return {name.split(".")[0] for name in json.loads(result.stdout)}


@pytest.mark.parametrize(
    "statement",
    [
        "import simulator, oversmooth.cli",
        "import simulator.updates, simulator.dynamics, simulator.theory, simulator.spectra",
    ],
)
def test_importing_the_simulator_pulls_no_heavy_dependency(statement):
    loaded = _modules_after_import(statement)
    assert "simulator" in loaded
    assert not loaded & set(FORBIDDEN_AT_IMPORT), sorted(loaded & set(FORBIDDEN_AT_IMPORT))


def test_subprocess_check_sees_a_heavy_import():
    """The runtime check itself can fail: importing onnx shows up."""
    assert "onnx" in _modules_after_import("import onnx")


def test_starting_the_command_pulls_no_heavy_dependency():
    """Building the parser (every ``oversmooth`` call) loads neither onnx nor matplotlib."""
    loaded = _modules_after_import("from oversmooth.cli import build_parser; build_parser()")
    heavy = {"onnx", "onnxruntime", "matplotlib", "torch"}
    assert not loaded & heavy, sorted(loaded & heavy)
