"""ONNX importer: find attention blocks in exported Transformers by graph structure, read their weights.

Public API
----------
load_model
    Parse and check an ``.onnx`` file without reading external data eagerly.
find_attention_blocks
    Match every Softmax as a self-attention block (blocks plus the reasons for rejected candidates).
extract
    Weights of every matched block as float64 :class:`BlockWeights` (row-vector convention).
block_weights
    Weights of one matched block.
model_spectra, summarize_spectra
    Eigenvalues of W_V W_O per head and per layer (and with the pre-LN γ folded in), and a summary.

The names are loaded on first use, so importing this package (or a light submodule such as
``importers.zoo``) imports neither onnx nor onnxruntime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importers.errors import (
        ExternalDataError,
        ExtractionError,
        ImporterError,
        ModelFileError,
        NoAttentionBlocksError,
        UnsupportedModelError,
    )
    from importers.graph import SUPPORTED_OPSETS, GraphIndex, OnnxModel, load_model
    from importers.patterns import (
        AttentionBlock,
        LinearMatch,
        MatchFailure,
        MatchReport,
        NormMatch,
        find_attention_blocks,
    )
    from importers.spectra import SpectrumRow, model_spectra, summarize_spectra
    from importers.weights import BlockWeights, block_weights, extract

_EXPORTS = {
    "importers.errors": (
        "ExternalDataError",
        "ExtractionError",
        "ImporterError",
        "ModelFileError",
        "NoAttentionBlocksError",
        "UnsupportedModelError",
    ),
    "importers.graph": ("SUPPORTED_OPSETS", "GraphIndex", "OnnxModel", "load_model"),
    "importers.patterns": (
        "AttentionBlock",
        "LinearMatch",
        "MatchFailure",
        "MatchReport",
        "NormMatch",
        "find_attention_blocks",
    ),
    "importers.spectra": ("SpectrumRow", "model_spectra", "summarize_spectra"),
    "importers.weights": ("BlockWeights", "block_weights", "extract"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "SUPPORTED_OPSETS",
    "AttentionBlock",
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
        raise AttributeError(f"module 'importers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
