"""The audit: per-layer smoothing, the dominating eigenvalues and the value spectra of a real model.

Modules
-------
pipeline
    :func:`audit` and its steps, ``prepare`` → ``measure`` → ``audit_result``, shared by the local and
    the sharded audit.
options
    :class:`AuditOptions`, every choice of one audit.
session
    One onnxruntime pass per batch and the per-batch work on worker threads.
layers
    Which tensors are layers.
dominance, dominance_inputs, operator_step, operating_step, depth
    The steps run on what a batch returned (docs/theory.md §6).
records, cases, sublayer_summary
    :class:`AuditResult` and its typed parts, each with one ``to_dict()``.
audit_notes
    The notes stated before measuring.
cache
    Input-independent results per model digest in the user cache.
"""

from __future__ import annotations

from oversmooth.importers.audit.options import AuditOptions
from oversmooth.importers.audit.pipeline import audit, layer_tensors
from oversmooth.importers.audit.records import AuditResult, DominanceCase

__all__ = ["AuditOptions", "AuditResult", "DominanceCase", "audit", "layer_tensors"]
