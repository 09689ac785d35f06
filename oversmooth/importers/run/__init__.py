"""Running a model: inputs, the onnxruntime runner, the audit, its records and its report.

Modules
-------
feeds
    :class:`Inputs` (feeds plus provenance) and checking feeds against a model's graph inputs.
sources
    Where inputs come from: bundled photographs and sentences, ``.npz``, images, text, noise.
decoder_feeds
    Feeds of a decoder exported for generation: key/value caches fed empty, position ids.
npz
    ``.npz`` feeds (one file or a folder of shards), read batch by batch.
batching
    Items per onnxruntime call: fixed batch sizes filled, batch-mixing graphs run one input at a time.
runner
    :class:`Runner`: an onnxruntime session that returns chosen intermediate tensors.
audit
    :func:`audit`: per-layer smoothing, dominating eigenvalues and value spectra of a real model.
records
    :class:`AuditResult` and its typed parts, each with one ``to_dict()``.
"""

from __future__ import annotations

from oversmooth.importers.run.audit import audit, layer_tensors
from oversmooth.importers.run.feeds import Inputs, check_feeds, for_graph
from oversmooth.importers.run.records import AuditResult, DominanceCase
from oversmooth.importers.run.runner import Runner, plain_session
from oversmooth.importers.run.sources import (
    bundled_inputs,
    default_inputs,
    from_images,
    from_npz,
    from_text,
    random_inputs,
)

__all__ = [
    "AuditResult",
    "DominanceCase",
    "Inputs",
    "Runner",
    "audit",
    "bundled_inputs",
    "check_feeds",
    "default_inputs",
    "for_graph",
    "from_images",
    "from_npz",
    "from_text",
    "layer_tensors",
    "plain_session",
    "random_inputs",
]
