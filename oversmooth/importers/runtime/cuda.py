"""The CUDA side of onnxruntime: loading the CUDA libraries, and diagnosing a machine.

onnxruntime-gpu is built against CUDA 13 and cuDNN 9 but does not install them; its ``cuda`` and
``cudnn`` extras bring the runtime and cuDNN as package-index wheels, and cuBLAS comes separately
(``pip install 'oversmooth[gpu]'`` or ``make venv GPU=1`` installs all three).
:func:`preload_cuda_libraries` loads them from those wheels (``onnxruntime.preload_dlls``) before a
CUDA session is created; :func:`oversmooth.importers.runtime.doctor.diagnose` says which providers really work
and why CUDA does not.

Public API
----------
preload_cuda_libraries
    Load the CUDA, cuDNN and cuBLAS libraries of the installed wheels (quietly; once).
loaded_cuda_libraries
    Which CUDA/cuDNN/cuBLAS shared objects this process has loaded, and from where.
gpu_info
    GPU name, driver and memory from ``nvidia-smi``, when there is one.
device_arrays, device_arrays_status
    CuPy, when it is installed and sees a GPU (the ``gpu`` extra): outputs can then stay there;
    and why not, in one line.
device_free_memory
    The free memory of the GPU CuPy uses, in bytes.
device_view
    An onnxruntime output on the GPU as a CuPy array over the same memory (no copy).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICE_ARRAYS_VARIABLE",
    "GPU_INSTALL_HINT",
    "device_arrays",
    "device_arrays_status",
    "device_free_memory",
    "device_view",
    "gpu_info",
    "loaded_cuda_libraries",
    "preload_cuda_libraries",
]

#: The command that installs the CUDA libraries onnxruntime-gpu loads.
GPU_INSTALL_HINT = "pip install 'oversmooth[gpu]'  (in a checkout: make venv GPU=1)"
_LIBRARY_PREFIXES = ("libcudart", "libcublas", "libcublasLt", "libcudnn", "libcufft", "libcurand")
_PRELOADED: list[bool] = []
_CUPY: list[Any] = []
#: Set to 0 to copy every output to the host even where CuPy could keep it on the GPU.
DEVICE_ARRAYS_VARIABLE = "OVERSMOOTH_DEVICE_ARRAYS"
#: onnxruntime's element type names of the outputs that can stay on the GPU.
_DEVICE_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
}


def preload_cuda_libraries(ort: Any) -> None:
    """Load the CUDA libraries from the nvidia wheels, if this onnxruntime can (once per process).

    ``onnxruntime.preload_dlls`` looks in the ``nvidia-*`` packages of the environment; where they
    are missing it changes nothing, and the CUDA provider then reports the missing library itself.
    Its output is discarded: library code never prints.
    """
    if _PRELOADED or not hasattr(ort, "preload_dlls"):
        return
    _PRELOADED.append(True)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(Exception):  # a partial CUDA install is reported by the session
            ort.preload_dlls()


def loaded_cuda_libraries(maps: Path = Path("/proc/self/maps")) -> dict[str, str]:
    """``{library file name: path}`` of the CUDA/cuDNN/cuBLAS libraries mapped into this process."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        name = os.path.basename(path)
        if name.startswith(_LIBRARY_PREFIXES) and ".so" in name:
            found.setdefault(name, path)
    return found


def gpu_info(timeout_s: float = 10.0) -> list[dict[str, str]]:
    """One dict per GPU (``name``, ``driver``, ``memory``) from ``nvidia-smi``; empty without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        result = subprocess.run(
            [smi, *query], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in result.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    return gpus


def device_arrays() -> Any:
    """The ``cupy`` module when it imports and sees a CUDA device, else None (checked once).

    With it the audit keeps its large outputs (attention probabilities, Gram matrices) on the GPU
    and computes on them there (:mod:`oversmooth.simulator.backend`); without it they are copied to the host
    as before, and the runner's provenance says so (``kept_on_device``). The environment variable
    ``OVERSMOOTH_DEVICE_ARRAYS=0`` turns it off (the host path on a GPU, for comparison).
    :func:`device_arrays_status` says why it is off.
    """
    if not _CUPY:
        _CUPY.append(_probe_cupy()[0])
    return _CUPY[0]


def device_free_memory() -> int | None:
    """The free memory of the GPU that CuPy uses, in bytes (what other processes and this one's
    allocations leave); None without :func:`device_arrays`."""
    cupy = device_arrays()
    return None if cupy is None else int(cupy.cuda.Device().mem_info[0])


def device_arrays_status() -> str:
    """One line for ``oversmooth doctor``: whether the audit's large outputs can stay on the GPU,
    and if not, why and what fixes it."""
    return _probe_cupy()[1]


def _probe_cupy() -> tuple[Any, str]:
    """``(cupy or None, the reason in words)``."""
    if os.environ.get(DEVICE_ARRAYS_VARIABLE, "1") == "0":
        return None, f"off ({DEVICE_ARRAYS_VARIABLE}=0): the audit copies its outputs to the host"
    try:
        import cupy
    except ImportError:
        return None, (
            "CuPy is not installed: on a GPU the audit would copy its attention and Gram "
            f"matrices to the host (fix: {GPU_INSTALL_HINT})"
        )
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # no driver, no device: the host path
        return None, f"CuPy {cupy.__version__} sees no GPU ({type(err).__name__})"
    if count == 0:
        return None, f"CuPy {cupy.__version__} sees no GPU"
    return cupy, (
        f"CuPy {cupy.__version__}: the audit keeps its attention and Gram matrices on the GPU"
    )


def device_view(value: Any) -> Any:
    """A CuPy array over an onnxruntime ``OrtValue``'s GPU memory; None where it cannot be one.

    The array holds a reference to ``value``, so onnxruntime's buffer lives as long as the array.
    None (the caller copies to the host instead) without CuPy, for a value not on CUDA, or for an
    element type other than float32, float64 and float16.
    """
    cupy = device_arrays()
    dtype = _DEVICE_DTYPES.get(value.data_type())
    if cupy is None or dtype is None or value.device_name().lower() != "cuda":
        return None
    shape = tuple(int(size) for size in value.shape())
    count = 1
    for size in shape:
        count *= size
    if count == 0:
        return cupy.empty(shape, dtype=dtype)
    memory = cupy.cuda.UnownedMemory(value.data_ptr(), count * cupy.dtype(dtype).itemsize, value)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))
