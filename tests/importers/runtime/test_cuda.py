"""The CUDA side of onnxruntime (:mod:`oversmooth.importers.runtime.cuda`), on any machine: the
CUDA libraries read from the process maps and preloaded once, quietly; ``nvidia-smi``'s answer
parsed (a fake ``nvidia-smi`` on the PATH), and nothing where it is missing, fails or hangs; why
CuPy can or cannot keep outputs on the GPU (a fake ``cupy`` module); an onnxruntime value on the
host is never viewed as a device array. Where CUDA and CuPy work (marker ``cuda``), a CUDA value's
view is its data, without a copy.

``oversmooth doctor`` itself is ``test_doctor``.
"""

from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers.errors import ProviderError
from oversmooth.importers.runtime import cuda
from oversmooth.importers.runtime.cuda import (
    DEVICE_ARRAYS_VARIABLE,
    GPU_INSTALL_HINT,
    device_arrays,
    device_arrays_status,
    device_view,
    gpu_info,
    loaded_cuda_libraries,
)


def _fake_smi(folder: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """An executable ``nvidia-smi`` running ``script`` (sh), first on the PATH."""
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def _fake_cupy(count: int | Exception) -> types.ModuleType:
    """A ``cupy`` module whose runtime reports ``count`` devices (or raises it)."""

    def get_device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    module = types.ModuleType("cupy")
    module.__version__ = "13.9"
    module.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=get_device_count)
    )
    return module


# Moved from tests/importers/runtime/test_doctor.py.
def test_loaded_libraries_are_read_from_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /venv/nvidia/cublas/lib/libcublasLt.so.13\n"
        "7f01-7f02 r-xp 00000000 08:01 2 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 3 /venv/nvidia/cudnn/lib/libcudnn.so.9\n",
        encoding="utf-8",
    )
    assert loaded_cuda_libraries(maps) == {
        "libcublasLt.so.13": "/venv/nvidia/cublas/lib/libcublasLt.so.13",
        "libcudnn.so.9": "/venv/nvidia/cudnn/lib/libcudnn.so.9",
    }


# Moved from tests/importers/runtime/test_doctor.py.
def test_cuda_libraries_are_preloaded_once_and_quietly(monkeypatch, capfd) -> None:
    calls: list[int] = []

    class FakeOrt:
        def preload_dlls(self) -> None:
            calls.append(1)
            print("loading libcudart.so.13 ...")
            raise OSError("libcublasLt.so.13: cannot open shared object file")

    monkeypatch.setattr(cuda, "_PRELOADED", [])
    cuda.preload_cuda_libraries(FakeOrt())
    cuda.preload_cuda_libraries(FakeOrt())
    assert calls == [1]
    assert capfd.readouterr() == ("", "")
    cuda.preload_cuda_libraries(object())  # an onnxruntime without preload_dlls: nothing to do


def test_only_cuda_libraries_are_kept_the_first_mapping_of_each(tmp_path: Path) -> None:
    """Anonymous mappings (no path), other libraries and names without ``.so`` are skipped; a
    library mapped twice is named at its first path; unreadable maps are no libraries."""
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 rw-p 00000000 00:00 0\n"
        "7f01-7f02 r-xp 00000000 08:01 1 /a/libcudart.so.13\n"
        "7f02-7f03 r--p 00000000 08:01 1 /b/libcudart.so.13\n"
        "7f03-7f04 r-xp 00000000 08:01 2 /a/libcurand_notes.txt\n"
        "7f04-7f05 r-xp 00000000 08:01 3 /a/libcuda.so.1\n",
        encoding="utf-8",
    )
    assert loaded_cuda_libraries(maps) == {"libcudart.so.13": "/a/libcudart.so.13"}
    assert loaded_cuda_libraries(tmp_path / "absent") == {}


def test_gpu_info_parses_each_gpu_line_of_nvidia_smi(tmp_path, monkeypatch) -> None:
    _fake_smi(
        tmp_path,
        monkeypatch,
        "echo 'NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB'\n"
        "echo 'not, a gpu line'\n"
        "echo 'NVIDIA A10, 535.1, 23028 MiB'",
    )
    assert gpu_info() == [
        {"name": "NVIDIA H100 80GB HBM3", "driver": "580.65.06", "memory": "81559 MiB"},
        {"name": "NVIDIA A10", "driver": "535.1", "memory": "23028 MiB"},
    ]


def test_gpu_info_is_empty_without_nvidia_smi_or_when_it_hangs(tmp_path, monkeypatch) -> None:
    path = os.environ.get("PATH", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder
    assert gpu_info() == []
    monkeypatch.setenv("PATH", path)
    _fake_smi(tmp_path, monkeypatch, "exec sleep 5")
    started = time.monotonic()
    assert gpu_info(timeout_s=0.2) == []
    assert time.monotonic() - started < 4  # given up at the timeout, not when it ended


@pytest.mark.parametrize(
    ("cupy", "status", "usable"),
    [
        (None, "CuPy is not installed: on a GPU the audit would copy", False),
        (_fake_cupy(RuntimeError("no driver")), "CuPy 13.9 sees no GPU (RuntimeError)", False),
        (_fake_cupy(0), "CuPy 13.9 sees no GPU", False),
        (_fake_cupy(1), "CuPy 13.9: the audit keeps its attention and Gram matrices", True),
    ],
    ids=["not-installed", "no-driver", "no-device", "one-device"],
)
def test_device_arrays_are_cupy_only_where_it_sees_a_gpu(monkeypatch, cupy, status, usable) -> None:
    """``sys.modules['cupy'] = None`` makes ``import cupy`` fail as where it is not installed."""
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.delenv(DEVICE_ARRAYS_VARIABLE, raising=False)
    monkeypatch.setattr(cuda, "_CUPY", [])
    assert device_arrays_status().startswith(status)
    assert (GPU_INSTALL_HINT in device_arrays_status()) == (cupy is None)
    assert device_arrays() is (cupy if usable else None)
    monkeypatch.setenv(DEVICE_ARRAYS_VARIABLE, "0")
    assert device_arrays_status() == (
        f"off ({DEVICE_ARRAYS_VARIABLE}=0): the audit copies its outputs to the host"
    )


def test_device_arrays_are_probed_once(monkeypatch) -> None:
    """The first answer is kept for the process: a GPU appearing later changes nothing."""
    monkeypatch.setattr(cuda, "_CUPY", [])
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(0))
    assert device_arrays() is None
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    assert device_arrays() is None
    assert device_arrays_status().startswith("CuPy 13.9: the audit keeps")


def test_a_value_on_the_host_or_of_another_type_has_no_device_view(monkeypatch) -> None:
    import onnxruntime as ort

    monkeypatch.setattr(cuda, "_CUPY", [_fake_cupy(1)])
    on_host = ort.OrtValue.ortvalue_from_numpy(np.ones((2, 3), np.float32))
    assert device_view(on_host) is None
    ints = types.SimpleNamespace(data_type=lambda: "tensor(int64)", device_name=lambda: "Cuda")
    assert device_view(ints) is None
    monkeypatch.setattr(cuda, "_CUPY", [None])
    floats = types.SimpleNamespace(data_type=lambda: "tensor(float)", device_name=lambda: "Cuda")
    assert device_view(floats) is None


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(3, 4), (0, 4)])
def test_a_cuda_value_is_viewed_in_place(shape: tuple[int, ...]) -> None:
    """The CuPy view of a CUDA OrtValue holds its numbers and points at its memory."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("no CUDA provider in this onnxruntime")
    cupy = device_arrays()
    if cupy is None:
        pytest.skip("CuPy is not installed or sees no GPU (the `gpu` extra installs it)")
    host = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    try:
        value = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)
    except (RuntimeError, ProviderError) as err:
        pytest.skip(f"no CUDA here: {err}")
    view = device_view(value)
    np.testing.assert_array_equal(cupy.asnumpy(view), host, strict=True)
    if host.size:
        assert view.data.ptr == value.data_ptr()
