"""What an audit says beside its numbers: :class:`Note`, one typed line.

A note is made wherever the observation is (the runtime's batching, the audit's reading of the
model and its inputs) and assembled into :class:`~oversmooth.importers.audit.records.AuditResult`,
so it lives below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Note", "NoteKind"]

NoteKind = Literal[
    "partial",
    "skipped",
    "departure",
    "kv-cache",
    "encoder-states",
    "quantized",
    "not-attention",
    "random",
    "not-computed",
    "layers",
    "batching",
    "providers",
]


@dataclass(frozen=True)
class Note:
    """One observation of an audit worth reading, typed by what it is about.

    Attributes
    ----------
    kind : {"partial", "skipped", "departure", "kv-cache", "encoder-states", "quantized", \
"not-attention", "random", "not-computed", "layers", "batching", "providers"}
        ``partial``: blocks left unmatched (``--partial``), shown first; ``skipped``: attention
        skipped by design (outside the theory), shown next; ``departure``: blocks
        outside the linear update; ``kv-cache``: the model's key/value cache inputs were fed
        empty (audited at past length 0); ``encoder-states``: what a decoder's encoder-state
        inputs were fed; ``quantized``: activation quantise/dequantise pairs read through
        (:mod:`oversmooth.importers.graph.quantized`); ``not-attention``: Softmaxes that are not token
        attention (a pooling, a router), neither audited nor declined; ``random``: the inputs are noise; ``not-computed``: metrics
        skipped; ``layers``: how a layer was chosen; ``batching``: how inputs were batched;
        ``providers``: shards that ran on different onnxruntime providers.
    text : str
        One line (what ``audit.json`` and the report print).
    """

    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text
