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

Importing this package does not import onnxruntime.
"""

from __future__ import annotations

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
from importers.weights import BlockWeights, block_weights, extract

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
    "UnsupportedModelError",
    "block_weights",
    "extract",
    "find_attention_blocks",
    "load_model",
]
