"""Why CUDA cannot be used (:mod:`oversmooth.importers.runtime.doctor`), on machines we do not have
(the command itself: tests/oversmooth/commands/test_doctor.py)."""

from __future__ import annotations

from oversmooth.cli import main
from oversmooth.importers.runtime.cuda import GPU_INSTALL_HINT
from oversmooth.importers.runtime.doctor import cuda_reason

LISTED = ("CUDAExecutionProvider", "CPUExecutionProvider")
GPU = [{"name": "NVIDIA H100", "driver": "580.0", "memory": "81559 MiB"}]


def test_a_cpu_only_build_is_told_to_install_the_gpu_wheel() -> None:
    reason, fix = cuda_reason(("CPUExecutionProvider",), {"cpu": "ok", "cuda": "x"}, GPU)
    assert reason is not None
    assert "no CUDA provider" in reason
    assert fix is not None
    assert "onnxruntime-gpu" in fix


def test_a_missing_cuda_library_on_a_gpu_machine_names_the_install_command() -> None:
    missing = "libcublasLt.so.13: cannot open shared object file: No such file or directory"
    reason, fix = cuda_reason(LISTED, {"cpu": "ok", "cuda": missing}, GPU)
    assert reason is not None
    assert "libcublasLt.so.13" in reason
    assert fix == GPU_INSTALL_HINT


def test_a_working_cuda_needs_no_fix() -> None:
    assert cuda_reason(LISTED, {"cpu": "ok", "cuda": "ok"}, GPU) == (None, None)


def test_doctor_says_whether_the_audit_outputs_can_stay_on_the_gpu(monkeypatch, capsys) -> None:
    import importlib.util

    from oversmooth.importers.runtime.cuda import DEVICE_ARRAYS_VARIABLE, device_arrays_status

    assert main(["doctor"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("device arrays"))
    if importlib.util.find_spec("cupy") is None:
        assert "CuPy is not installed" in line
        assert GPU_INSTALL_HINT in line
    monkeypatch.setenv(DEVICE_ARRAYS_VARIABLE, "0")
    assert device_arrays_status().startswith(f"off ({DEVICE_ARRAYS_VARIABLE}=0)")
