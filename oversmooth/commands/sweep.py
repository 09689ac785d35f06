"""``oversmooth sweep SPEC --out DIR``: a grid of simulator runs, one table row per cell, a regime map.

The grid and what one cell measures are the simulator's (:mod:`oversmooth.simulator.sweep`); the cells run in
this process, or on a Dask cluster with ``--scheduler`` (:mod:`oversmooth.executor`), in chunks, and
the rows are put back in cell order, so the table is the same wherever it ran; the regime map is
drawn by :mod:`oversmooth.figures.sweep_map`.

The folder (written whole or not at all; Ctrl-C leaves nothing):

``sweep.csv``
    One row per cell (:data:`oversmooth.simulator.sweep.SWEEP_COLUMNS`): its settings, the final metrics of
    its run with the stop reason, and the theory's prediction.
``sweep.json``
    The checked specification, the number of cells, where they ran, versions.
``regime_map.png``
    Rows: the rules with their options; columns: the H spectra (with γ when it varies); colour:
    the median over the other axes of log10 of the final HFC/LFC (low: smoothing); text: the share
    of cells the theory predicts to smooth (Perron-dominated).
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.commands.common import add_scheduler_options
from oversmooth.simulator.errors import InputError

__all__ = ["SWEEP_FILES", "register", "run", "run_cells", "save_sweep"]

#: The files of a sweep folder.
SWEEP_FILES = ("sweep.csv", "sweep.json", "regime_map.png")
#: Tasks per executor slot: enough for load balance and a moving progress bar, few enough to
#: keep the per-task overhead of a cluster small.
TASKS_PER_SLOT = 16
_PACKAGES = ("oversmooth", "numpy", "scipy", "matplotlib", "dask", "distributed")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``sweep`` subcommand."""
    p = subparsers.add_parser(
        "sweep",
        help="run a grid of simulator settings: final metrics and theory per cell, a regime map",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("spec", type=Path, metavar="SPEC", help="the grid, a .json or .toml file")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the output folder")
    p.add_argument(
        "--force", action="store_true", help="replace a non-empty --out folder that is not a sweep"
    )
    add_scheduler_options(p, "the cells are split into chunks")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _chunks(cells: Sequence[Any], slots: int) -> list[list[Any]]:
    size = max(1, -(-len(cells) // (TASKS_PER_SLOT * slots)))
    return [list(cells[start : start + size]) for start in range(0, len(cells), size)]


def run_cells(
    cells: Sequence[Any], executor: Any, *, progress: bool = False
) -> list[dict[str, Any]]:
    """Evaluate every cell with ``executor``; the rows in cell order.

    Parameters
    ----------
    cells : sequence of simulator.sweep.Cell
    executor : oversmooth.executor.Executor
    progress : bool
        A progress bar of cells done (stderr).
    """
    from oversmooth.executor import progress_bar
    from oversmooth.simulator.sweep import evaluate_cells

    chunks = _chunks(cells, executor.slots)
    done: dict[int, list[dict[str, Any]]] = {}
    with progress_bar(len(cells), "cell", enabled=progress) as advance:
        for index, rows in executor.map(evaluate_cells, chunks):
            done[index] = rows
            advance(len(rows))
    return [row for index in range(len(chunks)) for row in done[index]]


def _is_sweep_folder(folder: Path) -> bool:
    return all((folder / name).is_file() for name in SWEEP_FILES[:2])


def save_sweep(
    rows: Sequence[dict[str, Any]],
    record: dict[str, Any],
    out: Path,
    *,
    force: bool = False,
) -> Path:
    """Write the sweep folder (:data:`SWEEP_FILES`) atomically: all files appear or none does."""
    from oversmooth.figures.sweep_map import save_regime_map
    from oversmooth.simulator.output import atomic_directory, write_json, write_tidy_csv
    from oversmooth.simulator.sweep import SWEEP_COLUMNS

    ours = (lambda _folder: True) if force else _is_sweep_folder
    with atomic_directory(out, ours=ours, label="--out") as staging:
        write_tidy_csv(staging / SWEEP_FILES[0], SWEEP_COLUMNS, rows)
        write_json(staging / SWEEP_FILES[1], record)
        save_regime_map(rows, staging / SWEEP_FILES[2])
    return out


def _summary(rows: Sequence[dict[str, Any]], where: dict[str, Any], out: Path) -> str:
    perron = np.mean([row["predicted_kind"] == "perron" for row in rows])
    stops: dict[str, int] = {}
    for row in rows:
        stops[row["stop_reason"]] = stops.get(row["stop_reason"], 0) + 1
    place = "this process" if where["kind"] == "local" else f"{where['workers']} Dask workers"
    return "\n".join(
        [
            f"sweep: {len(rows)} cells on {place}",
            f"predicted perron (smoothing) in {100 * perron:.1f}% of cells; stop reasons "
            + ", ".join(f"{reason} {count}" for reason, count in sorted(stops.items())),
            f"wrote {out / SWEEP_FILES[0]}, {out / SWEEP_FILES[1]}, {out / SWEEP_FILES[2]}",
        ]
    )


def run(args: argparse.Namespace) -> int:
    """Check the spec and the output folder, run the cells, write the folder, print a summary."""
    from oversmooth.executor import open_executor
    from oversmooth.simulator.output import check_output_folder, package_versions
    from oversmooth.simulator.sweep import load_spec

    spec = load_spec(args.spec, label="SPEC")
    ours = (lambda _folder: True) if args.force else _is_sweep_folder
    check_output_folder(args.out, ours=ours, label="--out")
    with open_executor(args.scheduler, workers=args.workers) as executor:
        where = executor.describe()
        rows = run_cells(
            spec.cells(), executor, progress=not args.no_progress and sys.stderr.isatty()
        )
    if not rows:  # pragma: no cover - a checked spec has at least one cell
        raise InputError("SPEC must give at least one cell; got none")
    record = {
        "spec": spec.to_dict(),
        "cells": len(rows),
        "executor": where,
        "provenance": {
            "python": platform.python_version(),
            "versions": package_versions(_PACKAGES),
        },
    }
    save_sweep(rows, record, args.out, force=args.force)
    print(_summary(rows, where, args.out))
    return 0
