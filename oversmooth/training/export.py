"""A trained ViT to ONNX, for ``oversmooth inspect``/``spectra``/``audit``.

The ⁺/⁻ variants compute W_V, W_O from a QR, which ONNX has no operator for: the export goes
through :meth:`~oversmooth.training.model.ViT.materialised`, a standard-variant copy holding the
computed matrices, so every variant exports as the same plain graph (patch convolution, explicit
``x @ W_V``, ``softmax(QKᵀ/√d_head) V``, ``@ W_O``). The graph takes ``images`` (batch, C, H, W)
float32 with a dynamic batch axis and returns ``logits`` (batch, classes).

torch's TorchScript exporter is used (``dynamo=False``): the dynamo exporter needs onnxscript,
which the ``train`` extra does not install.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from oversmooth.simulator.output import atomic_output
from oversmooth.training.model import ViT

__all__ = ["OPSET", "export_onnx"]

#: The ONNX opset of the export (LayerNormalization needs 17).
OPSET = 17


def export_onnx(model: ViT, path: str | Path, *, label: str = "--export-onnx") -> Path:
    """Write ``model`` (any variant) to ``path`` as ONNX, atomically; returns the path."""
    plain = model.materialised().cpu().eval()
    config = model.config
    example = torch.zeros(1, config.channels, *config.image_size)
    with (
        tempfile.TemporaryDirectory(prefix="oversmooth-export-") as folder,
        warnings.catch_warnings(),
    ):
        staged = Path(folder) / "model.onnx"
        # The TorchScript exporter announces its own deprecation; the export itself is complete.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(
            plain,
            (example,),
            staged,
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
        data = staged.read_bytes()
    with atomic_output(path, "wb", label=label) as handle:
        handle.write(data)
    return Path(path)
