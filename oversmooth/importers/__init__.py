"""ONNX importer: find attention blocks in exported Transformers by graph structure, read their
weights, run the model and audit its smoothing.

Sub-packages and modules
------------------------
graph
    The one ONNX parser: :func:`load_model`, graph index, constant folding, static shapes.
match
    :func:`find_attention_blocks`: blocks by structure, and why other Softmax nodes were rejected.
weights
    :func:`extract`: each matched block's W_Q, W_K, W_V, W_O, biases and norm as float64.
value_spectra
    Eigenvalues of W_V W_O per head and per layer (Fig. 5).
transform
    Random-init and ± reparameterised copies of a model (Table 1's columns).
zoo
    The pinned real models: :func:`~oversmooth.importers.zoo.lookup` turns a path or zoo name into a file.
inputs
    What a model runs on: :class:`~oversmooth.importers.inputs.Inputs` and where they come from.
runtime
    onnxruntime: the :class:`~oversmooth.importers.runtime.Runner`, batching, device bindings, the
    in-graph reductions.
audit
    :func:`~oversmooth.importers.audit.audit` and its steps and records (the ``oversmooth``
    commands and the report folder are the application's).
notes
    :class:`~oversmooth.importers.notes.Note`, one typed line an audit says beside its numbers.
errors
    The one error hierarchy: every error raised here is an :class:`ImporterError`.

The names below are loaded on first use, so importing this package (or a light module such as
``oversmooth.importers.zoo``) imports neither onnx nor onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oversmooth.importers.audit.records import AuditResult
    from oversmooth.importers.errors import (
        ExternalDataError,
        ExtractionError,
        ImporterError,
        ModelFileError,
        UnsupportedModelError,
    )
    from oversmooth.importers.graph import SUPPORTED_OPSETS, GraphIndex, OnnxModel, load_model
    from oversmooth.importers.match import (
        AttentionBlock,
        LinearMatch,
        MatchFailure,
        MatchReport,
        NoAttentionBlocksError,
        NormMatch,
        find_attention_blocks,
    )
    from oversmooth.importers.value_spectra import SpectrumRow, model_spectra, summarize_spectra
    from oversmooth.importers.weights import BlockWeights, block_weights, extract

_EXPORTS = {
    "oversmooth.importers.errors": (
        "ExternalDataError",
        "ExtractionError",
        "ImporterError",
        "ModelFileError",
        "UnsupportedModelError",
    ),
    "oversmooth.importers.graph": ("SUPPORTED_OPSETS", "GraphIndex", "OnnxModel", "load_model"),
    "oversmooth.importers.match": (
        "AttentionBlock",
        "LinearMatch",
        "MatchFailure",
        "MatchReport",
        "NoAttentionBlocksError",
        "NormMatch",
        "find_attention_blocks",
    ),
    # Not `audit` itself: `oversmooth.importers.audit` is the sub-package (the function is
    # `oversmooth.importers.audit.audit`).
    "oversmooth.importers.audit.records": ("AuditResult",),
    "oversmooth.importers.value_spectra": ("SpectrumRow", "model_spectra", "summarize_spectra"),
    "oversmooth.importers.weights": ("BlockWeights", "block_weights", "extract"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "SUPPORTED_OPSETS",
    "AttentionBlock",
    "AuditResult",
    "BlockWeights",
    "ExternalDataError",
    "ExtractionError",
    "GraphIndex",
    "ImporterError",
    "LinearMatch",
    "MatchFailure",
    "MatchReport",
    "ModelFileError",
    "NoAttentionBlocksError",
    "NormMatch",
    "OnnxModel",
    "SpectrumRow",
    "UnsupportedModelError",
    "block_weights",
    "extract",
    "find_attention_blocks",
    "load_model",
    "model_spectra",
    "summarize_spectra",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'oversmooth.importers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
