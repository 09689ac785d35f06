"""Layering: the simulator depends on NumPy, SciPy and the standard library only; the libraries
import one way (simulator ← importers ← figures; simulator ← training, the only place torch is
imported, and no other library imports training), and the application (the rest of the package
``oversmooth``: the command, its commands, the executor, the report) imports all three and is imported
by none. Everything installs under the one import name ``oversmooth``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import oversmooth

PACKAGE_DIR = Path(oversmooth.__file__).parent
LIBRARIES = ("simulator", "importers", "figures", "training")
#: Which layers each layer may import (besides itself); "application" is the rest of ``oversmooth``.
MAY_IMPORT = {
    "simulator": set(),
    "importers": {"simulator"},
    "figures": {"simulator", "importers"},
    "training": {"simulator"},
    "application": {"simulator", "importers", "figures", "training"},
}
ALLOWED_TOP_LEVEL = {"numpy", "scipy", "__future__"} | set(sys.stdlib_module_names)
HEAVY = ("onnx", "onnxruntime", "matplotlib", "torch")


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to, or None outside the project.

    >>> layer_of("oversmooth.importers.audit.pipeline"), layer_of("oversmooth.cli"), layer_of("numpy")
    ('importers', 'application', None)
    """
    parts = module.split(".")
    if parts[0] != "oversmooth":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LIBRARIES else "application"


def _imported_modules(path: Path) -> set[str]:
    """Dotted names of every absolute import in a module (including ones inside functions);
    ``from oversmooth import simulator`` counts as ``oversmooth.simulator``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "oversmooth":
                names.update(f"oversmooth.{alias.name}" for alias in node.names)
            else:
                names.add(node.module)
    return names


def _imported_layers(path: Path) -> set[str]:
    return {layer for name in _imported_modules(path) if (layer := layer_of(name)) is not None}


def _simulator_modules() -> list[Path]:
    return sorted((PACKAGE_DIR / "simulator").rglob("*.py"))


def _project_modules() -> list[tuple[str, Path]]:
    return [
        (layer, path)
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if (layer := layer_of(".".join(("oversmooth", *path.relative_to(PACKAGE_DIR).parts))))
    ]


@pytest.mark.parametrize(
    ("layer", "path"), _project_modules(), ids=lambda p: p if isinstance(p, str) else p.name
)
def test_packages_import_one_way(layer, path):
    """No library imports the application, and no library imports a library above it."""
    upward = _imported_layers(path) - MAY_IMPORT[layer] - {layer}
    assert not upward, f"{path.relative_to(PACKAGE_DIR)} ({layer}) imports {sorted(upward)}"


#: Inside the importer, the runtime part reads inputs and the audit reads both; never the reverse.
RUNTIME_MAY_IMPORT = {
    "inputs": set(),
    "runtime": {"inputs"},
    "audit": {"inputs", "runtime"},
}


def _runtime_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["oversmooth", "importers"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in RUNTIME_MAY_IMPORT else None


@pytest.mark.parametrize(
    "path",
    [
        p
        for part in RUNTIME_MAY_IMPORT
        for p in sorted((PACKAGE_DIR / "importers" / part).rglob("*.py"))
    ],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_inputs_runtime_and_audit_import_one_way(path):
    """``oversmooth.importers.inputs`` ← ``runtime`` ← ``audit``."""
    part = path.parent.name
    imported = {_runtime_part(name) for name in _imported_modules(path)} - {None, part}
    assert not imported - RUNTIME_MAY_IMPORT[part], f"{part}/{path.name} imports {sorted(imported)}"


def test_layering_check_sees_an_upward_import(tmp_path):
    """The checker itself can fail: a library module importing the application is caught."""
    module = tmp_path / "up.py"
    module.write_text("def f():\n    from oversmooth.report import save_audit\n")
    assert _imported_layers(module) - MAY_IMPORT["importers"] == {"application"}
    module.write_text("from oversmooth import figures\n")
    assert _imported_layers(module) - MAY_IMPORT["importers"] == {"figures"}


def _imports_torch(path: Path) -> bool:
    return any(name.split(".")[0] == "torch" for name in _imported_modules(path))


def test_only_the_training_library_imports_torch():
    """torch (the ``train`` extra) is imported by ``oversmooth.training`` and nothing else."""
    outside = [
        str(path.relative_to(PACKAGE_DIR))
        for layer, path in _project_modules()
        if layer != "training" and _imports_torch(path)
    ]
    assert not outside, outside


def test_torch_check_sees_a_lazy_torch_import(tmp_path):
    """The checker itself can fail: a torch import inside a function is caught."""
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from torch import nn\n    return nn\n")
    assert _imports_torch(module)


def test_no_library_imports_training(tmp_path):
    """``oversmooth.training`` sits beside the other libraries, reachable from the application only."""
    assert {layer for layer, allowed in MAY_IMPORT.items() if "training" in allowed} == {
        "application"
    }
    module = tmp_path / "fig.py"
    module.write_text("from oversmooth.training.train import train_run\n")
    assert _imported_layers(module) - MAY_IMPORT["figures"] == {"training"}


def test_the_package_root_imports_nothing():
    """``oversmooth/__init__.py`` runs before every library module: it must stay import-free, or
    importing the simulator would load the application."""
    assert _imported_modules(PACKAGE_DIR / "__init__.py") == set()


@pytest.mark.parametrize("path", _simulator_modules(), ids=lambda p: p.name)
def test_simulator_imports_only_numpy_scipy_and_stdlib(path):
    names = _imported_modules(path)
    foreign = {n.split(".")[0] for n in names if layer_of(n) is None} - ALLOWED_TOP_LEVEL
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
    assert {layer_of(n) for n in names} <= {None, "simulator"}


def test_static_check_sees_a_forbidden_import(tmp_path):
    """The checker itself can fail: a module importing matplotlib lazily is caught."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    import matplotlib.pyplot as plt\n    return plt\n")
    assert {n.split(".")[0] for n in _imported_modules(module)} - ALLOWED_TOP_LEVEL == {
        "matplotlib"
    }


def _modules_after_import(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(result.stdout))


def _forbidden_for_the_simulator(loaded: set[str]) -> set[str]:
    heavy = {name for name in loaded if name.split(".")[0] in HEAVY}
    above = {name for name in loaded if layer_of(name) not in (None, "simulator")}
    return heavy | (above - {"oversmooth"})


@pytest.mark.parametrize(
    "statement",
    [
        "import oversmooth.simulator",
        "from oversmooth.simulator import updates, dynamics, theory, spectra",
    ],
)
def test_importing_the_simulator_pulls_no_heavy_dependency(statement):
    loaded = _modules_after_import(statement)
    assert "oversmooth.simulator" in loaded
    assert not _forbidden_for_the_simulator(loaded), sorted(_forbidden_for_the_simulator(loaded))


def test_subprocess_check_sees_a_heavy_import():
    """The runtime check itself can fail: importing onnx, or the application, shows up."""
    assert _forbidden_for_the_simulator(_modules_after_import("import onnx, oversmooth.cli")) >= {
        "onnx",
        "oversmooth.cli",
    }


def test_starting_the_command_pulls_no_heavy_dependency():
    """Building the parser (every ``oversmooth`` call) loads neither onnx nor matplotlib."""
    loaded = _modules_after_import("from oversmooth.cli import build_parser; build_parser()")
    heavy = {name for name in loaded if name.split(".")[0] in HEAVY}
    assert not heavy, sorted(heavy)


def test_the_distribution_installs_one_import_name():
    """``pip install`` puts one top-level package on the path: ``oversmooth`` (the libraries are
    its sub-packages, so no other distribution's ``simulator``/``importers``/``figures`` meets ours)."""
    from importlib.metadata import distribution

    top_level = distribution("oversmooth").read_text("top_level.txt")
    assert top_level is not None
    assert top_level.split() == ["oversmooth"]


def test_every_package_folder_is_a_regular_package():
    """A folder of modules without ``__init__.py`` would import as a namespace package: its
    re-exports silently missing, and left out of the wheel."""
    folders = {path.parent for path in PACKAGE_DIR.rglob("*.py")}
    missing = sorted(
        str(f.relative_to(PACKAGE_DIR)) for f in folders if not (f / "__init__.py").exists()
    )
    assert not missing, missing
