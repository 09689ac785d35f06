"""``oversmooth doctor``'s library side: what onnxruntime can really run on this machine, and why not.

Public API
----------
Diagnosis
    Providers listed and usable, GPUs, CUDA libraries loaded, the reason CUDA cannot be used and
    the command that fixes it.
diagnose
    Try a one-node session on the CPU and on CUDA and explain the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from oversmooth.importers.errors import RunnerError
from oversmooth.importers.runtime.cuda import (
    GPU_INSTALL_HINT,
    device_arrays_status,
    gpu_info,
    loaded_cuda_libraries,
)
from oversmooth.importers.runtime.runner import open_session
from oversmooth.simulator.errors import one_line

__all__ = ["Diagnosis", "cuda_reason", "diagnose"]


@dataclass(frozen=True)
class Diagnosis:
    """What onnxruntime can run on this machine.

    Attributes
    ----------
    onnxruntime : str
        Its version.
    listed : tuple of str
        ``get_available_providers()``: what the build contains.
    usable : dict of str to str
        Provider -> ``"ok"`` or the reason a session on it could not be created.
    gpus : list of dict
        From ``nvidia-smi`` (empty without a driver).
    libraries : dict of str to str
        CUDA/cuDNN/cuBLAS libraries loaded, and from where.
    cuda_reason : str or None
        Why CUDA cannot be used, in plain words (None when it can).
    fix : str or None
        The command that fixes it, when there is one.
    device_arrays : str
        Whether the audit's attention and Gram matrices can stay on the GPU (CuPy), and why not.
    """

    onnxruntime: str
    listed: tuple[str, ...]
    usable: dict[str, str]
    gpus: list[dict[str, str]] = field(default_factory=list)
    libraries: dict[str, str] = field(default_factory=dict)
    cuda_reason: str | None = None
    fix: str | None = None
    device_arrays: str = ""


def _tiny_model() -> bytes:
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "doctor", [value], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # opset 17's IR version: every onnxruntime that runs opset 17 reads it
    return model.SerializeToString()


def cuda_reason(
    listed: tuple[str, ...], usable: dict[str, str], gpus: list[dict[str, str]]
) -> tuple[str | None, str | None]:
    """Why CUDA cannot be used, in plain words, and the command that fixes it (None, None: usable).

    The decision table: no CUDA provider in the build; no GPU or driver visible; a library the
    provider loads is missing (the ``gpu`` extra fixes it); else onnxruntime's own reason.
    """
    if usable.get("cuda") == "ok":
        return None, None
    if "CUDAExecutionProvider" not in listed:
        return (
            "this onnxruntime build has no CUDA provider (the CPU-only `onnxruntime` package is "
            "installed)",
            "pip install onnxruntime-gpu  (then: " + GPU_INSTALL_HINT + ")",
        )
    if not gpus and not Path("/dev/nvidiactl").exists():
        return "no NVIDIA GPU or driver is visible on this machine", None
    reason = usable.get("cuda", "unknown")
    if "cannot open shared object file" in reason or ".so" in reason:
        return f"a CUDA library onnxruntime needs is not installed ({reason})", GPU_INSTALL_HINT
    return reason, None


def diagnose() -> Diagnosis:
    """Try a one-node session on the CPU and on CUDA and explain the outcome."""
    import onnxruntime as ort

    listed = tuple(ort.get_available_providers())
    model = _tiny_model()
    usable: dict[str, str] = {}
    for provider in ("cpu", "cuda"):
        try:
            open_session(model, provider)
            usable[provider] = "ok"
        except RunnerError as err:
            usable[provider] = one_line(err)
    gpus = gpu_info()
    reason, fix = cuda_reason(listed, usable, gpus)
    return Diagnosis(
        onnxruntime=ort.__version__,
        listed=listed,
        usable=usable,
        gpus=gpus,
        libraries=loaded_cuda_libraries(),
        cuda_reason=reason,
        fix=fix,
        device_arrays=device_arrays_status(),
    )
