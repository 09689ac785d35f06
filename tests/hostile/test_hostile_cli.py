"""Every hostile case through the real command in a subprocess, bounded in time and memory.

The contract checked per case: the expected exit status (2 for bad input, 1 only for "no attention
blocks found"), exactly one stderr line starting ``oversmooth``, no traceback, and nothing left
behind in the case's folder (no output, no ``.part`` file). Each run has an address-space limit
and a timeout, so a memory blow-up or a hang fails its case instead of the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.cases import Case, all_cases

pytestmark = pytest.mark.hostile

#: Address space of one CLI run: onnxruntime and NumPy fit easily; a 2^40-element array does not.
ADDRESS_SPACE_BYTES = 6 * 2**30
#: Seconds one hostile run may take (a hang fails the case).
TIMEOUT_S = 60
CASES = all_cases()


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def _snapshot(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def run_case(case: Case, folder: Path) -> tuple[int, str, set[str]]:
    """Build the case's files in ``folder``, run the CLI there; (status, stderr, new paths)."""
    argv = case.build(folder)
    before = _snapshot(folder)
    env = {**os.environ, **case.env}
    result = subprocess.run(
        [sys.executable, "-m", "oversmooth.cli", *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=_limit_memory if sys.platform.startswith("linux") else None,
        check=False,
    )
    return result.returncode, result.stderr, _snapshot(folder) - before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="the cases use named pipes")
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_input_keeps_the_cli_contract(case: Case, tmp_path: Path) -> None:
    status, err, created = run_case(case, tmp_path)
    lines = err.strip().splitlines()
    assert status in case.exits, err
    assert len(lines) == 1, err
    assert lines[0].startswith("oversmooth"), err
    assert "Traceback" not in err
    assert not created, f"left behind: {sorted(created)}"


def test_the_suite_is_broad() -> None:
    """Hundreds of cases across every subcommand, as the hardening asks for."""
    commands = {case.id.split("-")[0] for case in CASES}
    assert commands >= {"inspect", "weights", "spectra", "transform", "audit", "simulate", "verify"}
    assert len(CASES) >= 140
