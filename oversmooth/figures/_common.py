"""Shared machinery of the figure scripts: style, figure sizes, deterministic outputs, provenance.

Every script has ``compute(quick) -> rows``, ``plot(rows) -> Figure`` and ``main(argv) -> int``; it
writes ``NAME.png``, ``NAME.csv`` (tidy, fixed column order, round-trip floats) and ``NAME.json``
(provenance: argv, git commit, package versions, configuration, seeds). Reruns give byte-identical CSVs.
"""

from __future__ import annotations

import argparse
import csv
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from oversmooth.simulator.output import atomic_output, package_versions, write_json, write_tidy_csv

STYLE = Path(__file__).with_name("paper.mplstyle")
#: Figure widths in inches: one paper column, or the full text width.
WIDTHS = {"column": 3.4, "full": 7.0}
PACKAGES = ("numpy", "scipy", "matplotlib", "onnx", "onnxruntime", "onnxruntime-gpu", "oversmooth")


def new_figure(width: str = "full", aspect: float = 0.35, **subplots: Any) -> tuple[Figure, Any]:
    """A figure of the paper's column or full width with the shared style and constrained layout."""
    plt.style.use(STYLE)
    w = WIDTHS[width]
    fig, axes = plt.subplots(figsize=(w, w * aspect), layout="constrained", **subplots)
    return fig, axes


def _git() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}
    return {"commit": commit, "dirty": bool(dirty)}


def provenance(name: str, argv: Sequence[str], config: Mapping[str, Any]) -> dict[str, Any]:
    """Everything needed to reproduce a figure: script, argv, commit, versions, configuration."""
    return {
        "figure": name,
        "script": f"figures/{name}.py",
        "argv": list(argv),
        "git": _git(),
        "python": platform.python_version(),
        "versions": package_versions(PACKAGES),
        "config": dict(config),
    }


def _sorted_keys(value: Any) -> Any:
    """``value`` with every mapping's keys sorted (stable provenance files across runs)."""
    if isinstance(value, Mapping):
        return {key: _sorted_keys(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_sorted_keys(item) for item in value]
    return value


def save_outputs(
    fig: Figure,
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str],
    name: str,
    meta: Mapping[str, Any],
    out: Path,
) -> list[Path]:
    """Write ``NAME.csv``, ``NAME.json`` and ``NAME.png`` into ``out``, each atomically."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.csv", out / f"{name}.json", out / f"{name}.png"]
    write_tidy_csv(paths[0], columns, rows, replace_any=True)  # the gallery folder is ours
    write_json(paths[1], _sorted_keys(meta))
    save_png(fig, paths[2])
    return paths


def save_png(fig: Figure, path: Path) -> Path:
    """Save ``fig`` as PNG atomically, without the version-dependent Software tag, and close it."""
    with atomic_output(path, "wb") as handle:
        fig.savefig(handle, format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV written by :func:`save_outputs` (values as strings)."""
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The common command line of every script: ``--quick``, ``--out DIR``."""
    p = argparse.ArgumentParser(
        prog=f"python -m oversmooth.figures.{name}", description=(doc or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="small sizes (for tests)")
    p.add_argument("--out", type=Path, default=Path("figures-out"), help="output folder")
    return p


def run_script(
    name: str,
    doc: str | None,
    compute: Callable[[bool], tuple[list[dict[str, Any]], dict[str, Any]]],
    plot: Callable[[list[dict[str, Any]]], Figure],
    columns: Sequence[str],
    argv: Sequence[str] | None,
) -> int:
    """Parse the common arguments, compute, plot and save; the body of every script's ``main``."""
    args = parser(name, doc).parse_args(argv)
    rows, config = compute(args.quick)
    config = {**config, "quick": args.quick}
    fig = plot(rows)
    paths = save_outputs(
        fig,
        rows,
        columns,
        name,
        provenance(name, sys.argv[1:] if argv is None else argv, config),
        args.out,
    )
    print(f"{name}: wrote {', '.join(str(p) for p in paths)}")
    return 0
