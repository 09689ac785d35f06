"""``scripts/compile_cuda_sources.py``: every CUDA source compiles under NVRTC, without a GPU.

NVRTC's library is not a dependency: where it is absent (as in CI) the compiling tests are
skipped and only the script's refusal is checked.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compile_cuda_sources.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_cuda_sources", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_an_nvrtc_library_the_script_says_so_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "libnvrtc.so.12"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--library", str(missing)],
        capture_output=True,
        text=True,
        cwd=SCRIPT.parents[1],
        env={"PYTHONPATH": str(SCRIPT.parents[1])},
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"no NVRTC library found at {missing}; expected libnvrtc.so (pip install "
        "nvidia-cuda-nvrtc-cu12 in a scratch environment, or --library PATH)"
    ]


def test_every_cuda_source_compiles_and_a_broken_one_does_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    if script.find_library(None) is None:
        pytest.skip("no NVRTC library here (nvidia-cuda-nvrtc-cu12 is not a dependency)")
    assert script.main([]) == 0
    assert capsys.readouterr().out.count("compiles for compute_90") == len(script.SOURCES)
    broken = script.SOURCES["householder single launch"].replace("__syncthreads();", "sync();", 1)
    monkeypatch.setitem(script.SOURCES, "householder single launch", broken)
    assert script.main([]) == 1
    assert "householder single launch: does not compile" in capsys.readouterr().out
