"""The shared ``python -m oversmooth.figures --quick`` run of the figure tests (helpers).

One quick run of all scripts serves the whole test session (the real-model scripts cost seconds
each): the ``quick_run`` fixture of ``tests/figures/conftest.py`` makes it, the per-script test
files read its outputs through :func:`script_output`. Without the pinned real models the real-model
scripts are skipped, except in CI (``CI`` set), where the run must include them.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from oversmooth.figures import SCRIPTS

ROOT = Path(__file__).resolve().parents[2]
#: Scripts that audit the zoo models (the rest only need the simulator).
REAL_MODEL_SCRIPTS = frozenset(
    {"fig2_smoothing", "fig3_reparam", "fig5_spectra", "table1_dominance"}
)


@dataclass(frozen=True)
class QuickRun:
    """The shared ``python -m oversmooth.figures --quick`` run: output folder, process, missing models."""

    out: Path
    process: subprocess.CompletedProcess
    missing: str | None


def missing_models() -> str | None:
    """One line naming the real models that are not installed, or None."""
    from oversmooth.importers.zoo import model_status, models

    absent = [
        m.install_hint for m in models() if model_status(m.name) not in {"installed", "cached"}
    ]
    return f"real models not available: {'; '.join(absent)}" if absent else None


def run_quick(out: Path) -> QuickRun:
    """Run every script (the real-model ones only where the models are there) into ``out``."""
    missing = missing_models()
    if missing and os.environ.get("CI"):
        pytest.fail(missing)
    names = [name for name in SCRIPTS if not (missing and name in REAL_MODEL_SCRIPTS)]
    command = [
        sys.executable,
        "-m",
        "oversmooth.figures",
        "--quick",
        "--out",
        str(out),
        "--only",
        *names,
    ]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    return QuickRun(out, process, missing)


def script_output(run: QuickRun, name: str) -> Path:
    """The output folder for ``name``'s checks, after skipping real-model scripts without models."""
    if name in REAL_MODEL_SCRIPTS and run.missing:
        pytest.skip(run.missing)
    assert run.process.returncode == 0, run.process.stderr
    return run.out


def csv_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file as dicts of strings."""
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))
