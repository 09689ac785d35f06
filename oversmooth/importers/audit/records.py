"""What an audit measured, as typed records: :class:`AuditResult` and its parts.

Every record has one ``to_dict()``, used by every JSON output (``audit.json``, the report's
provenance block, the figures' caches), so a key is spelled once.

Public API
----------
AuditResult
    Everything one audit measured, with per-layer rows and summaries.
ModelInfo, InputsInfo, ProviderInfo, AuditConfig, Provenance
    What was run, on what, where, how.
DominanceCase
    The dominating eigenvalue of ``I + H_h ⊗ A`` for one (input, block, head).
DominanceSummary, BlockVerdict
    Perron / non-Perron fractions overall and per attention block, with each block's predicted and
    observed direction.
HeadCase, HeadDepth, DepthBlock, DepthSummary
    The depth step (docs/theory.md §6.11): per (input, block, head) attention spectra, per head
    non-normality and |λ₂|, per block predicted against measured growth of HFC/LFC.
LAYER_COLUMNS, DOMINANCE_COLUMNS, DEPTH_COLUMNS, HEAD_COLUMNS
    The columns of ``layers.csv``, ``dominance.csv``, ``depth.csv`` and ``heads.csv``.

The per-case records and their summaries live in :mod:`oversmooth.importers.audit.cases`; every name is
re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oversmooth.importers.audit.cases import (
    DEPTH_COLUMNS,
    DOMINANCE_COLUMNS,
    HEAD_COLUMNS,
    OPERATOR_COLUMNS,
    Agreement,
    BlockVerdict,
    DepthBlock,
    DepthSummary,
    DominanceCase,
    DominanceSummary,
    HeadCase,
    HeadDepth,
    OperatorBlock,
    OperatorCase,
    OperatorSummary,
    Record,
    block_verdict,
    kind_fractions,
    operator_summary,
)
from oversmooth.importers.audit.sublayer_summary import sublayer_json
from oversmooth.importers.match import MatchFailure
from oversmooth.importers.notes import Note
from oversmooth.importers.value_spectra import SpectrumRow, summarize_spectra
from oversmooth.importers.weights import BlockWeights
from oversmooth.simulator.sampling import Stop

__all__ = [
    "DEPTH_COLUMNS",
    "DOMINANCE_COLUMNS",
    "HEAD_COLUMNS",
    "LAYER_COLUMNS",
    "OPERATOR_COLUMNS",
    "Agreement",
    "AuditConfig",
    "AuditResult",
    "BlockVerdict",
    "DepthBlock",
    "DepthSummary",
    "DominanceCase",
    "DominanceSummary",
    "HeadCase",
    "HeadDepth",
    "InputsInfo",
    "ModelInfo",
    "Note",
    "OperatorBlock",
    "OperatorCase",
    "OperatorSummary",
    "Provenance",
    "ProviderInfo",
    "Record",
]

#: Columns of ``layers.csv``.
LAYER_COLUMNS = ("layer", "metric", "mean", "std", "n")
#: What ``audit.json``'s ``h`` record means (docs/theory.md §6.8).
H_DEFINITION = (
    "effective: M_h = C diag(h_scale_in) W_V^h W_O^h diag(h_scale_out), every linear factor between "
    "the residual stream and the attention branch's contribution (C the pre-LayerNorm's centring, "
    "h_scale_in its gamma, h_scale_out LayerScale or a constant branch multiplier); stored: "
    "W_V^h W_O^h as the checkpoint stores it (the paper's protocol)"
)


@dataclass(frozen=True)
class ModelInfo(Record):
    """The audited model: display name, file, its sha256, the number of attention blocks."""

    name: str
    path: str
    sha256: str
    n_blocks: int


@dataclass(frozen=True)
class InputsInfo(Record):
    """The inputs: where they came from, their digest, how many, whether random, their labels."""

    source: str
    digest: str
    n_inputs: int
    random: bool
    labels: tuple[str, ...]


@dataclass(frozen=True)
class ProviderInfo(Record):
    """The onnxruntime provider asked for, the providers the session really runs, and why."""

    requested: str
    used: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class AuditConfig(Record):
    """Every option that changes the numbers."""

    batch_size: int
    exclude_prefix: int
    dominance: str
    operator_inputs: int
    h: str
    tie_rtol: float
    metrics: tuple[str, ...]
    depth_inputs: int = 0
    dominance_inputs: int | str = "auto"


@dataclass(frozen=True)
class Provenance(Record):
    """Python and package versions, the runner's session record, the inputs' digest."""

    python: str
    versions: dict[str, str]
    runner: dict[str, Any]
    inputs_digest: str


def _tidy(per_input: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """``layer,metric,mean,std,n`` rows of (n_inputs, positions) arrays: over inputs, NaN-aware."""
    rows = []
    positions = next(iter(per_input.values())).shape[1] if per_input else 0
    for position in range(positions):
        for name, values in per_input.items():
            column = values[:, position]
            finite = column[np.isfinite(column)]
            rows.append(
                {
                    "layer": position,
                    "metric": name,
                    "mean": float(finite.mean()) if finite.size else float("nan"),
                    "std": float(finite.std()) if finite.size else float("nan"),
                    "n": int(finite.size),
                }
            )
    return rows


@dataclass(frozen=True, eq=False)
class AuditResult:
    """Everything one audit measured.

    Attributes
    ----------
    model : ModelInfo
    inputs : InputsInfo
    provider : ProviderInfo
    blocks : list of BlockWeights
    metrics : dict of str to (n_inputs, n_layers) ndarray
        Every metric of :data:`oversmooth.simulator.metrics.METRICS` per input and layer (NaN where undefined).
    dominance : list of DominanceCase
    spectra : list of SpectrumRow
    config : AuditConfig
    provenance : Provenance
    notes : list of Note
        Observations worth reading (random inputs, a layer-boundary mismatch), typed.
    attention_part : dict of str to (n_inputs, n_blocks) ndarray
        Every metric of the stream right after each block's attention sublayer.
    operator : list of OperatorCase
    heads : list of HeadCase
        The depth step's attention spectra, per (input, block, head) of its first inputs.
    stream : dict of str to (n_inputs, n_layers) ndarray
        ``mean_norm`` (‖x̄‖, the mean token's norm) and ``inverse_scale`` (the mean per-token
        ``1/s_t`` of the norm reading the layer; NaN where none does) per input and layer.
    depth : DepthSummary or None
        The depth step's summary (:func:`oversmooth.importers.audit.depth.depth_summary`), None when not made.
    skipped : tuple of MatchFailure
        The attention skipped by design, outside the theory: each Softmax, code and reason.
    dominance_stop : Stop or None
        How many of the first inputs ``dominance`` covers and the widest share interval there
        (:func:`oversmooth.importers.audit.dominance_inputs.dominance_stop`); None without a dominance step.
    """

    model: ModelInfo
    inputs: InputsInfo
    provider: ProviderInfo
    blocks: list[BlockWeights]
    metrics: dict[str, np.ndarray]
    dominance: list[DominanceCase]
    spectra: list[SpectrumRow]
    config: AuditConfig
    provenance: Provenance
    notes: list[Note] = field(default_factory=list)
    attention_part: dict[str, np.ndarray] = field(default_factory=dict)
    operator: list[OperatorCase] = field(default_factory=list)
    heads: list[HeadCase] = field(default_factory=list)
    stream: dict[str, np.ndarray] = field(default_factory=dict)
    depth: DepthSummary | None = None
    skipped: tuple[MatchFailure, ...] = ()
    operating: list[Any] = field(default_factory=list)
    attribution: list[Any] = field(default_factory=list)
    dominance_stop: Stop | None = None

    @property
    def n_layers(self) -> int:
        """Number of recorded layers (blocks + 1)."""
        return next(iter(self.metrics.values())).shape[1]

    def layer_rows(self) -> list[dict[str, Any]]:
        """Tidy ``layer,metric,mean,std,n`` rows: mean and std over inputs (NaN-aware)."""
        return _tidy(self.metrics)

    def attention_rows(self) -> list[dict[str, Any]]:
        """Tidy ``block,metric,mean,std,n`` rows of the stream right after each block's attention
        sublayer (blocks without one are left out)."""
        return [
            {"block": row.pop("layer"), **row} for row in _tidy(self.attention_part) if row["n"] > 0
        ]

    def final_metrics(self) -> dict[str, float]:
        """Each metric's mean over inputs at the last layer."""
        last = self.n_layers - 1
        return {row["metric"]: row["mean"] for row in self.layer_rows() if row["layer"] == last}

    def dominance_summary(self) -> DominanceSummary:
        """Fractions of perron / non-perron / contracting cases overall and per attention block
        (they sum to 1)."""
        if not self.dominance:
            return DominanceSummary(0, None, None, None, None, ())
        kinds = np.array([case.kind for case in self.dominance])
        blocks = np.array([case.block for case in self.dominance])
        means = {(r["layer"], r["metric"]): r["mean"] for r in self.layer_rows()}
        attention = {(r["block"], r["metric"]): r["mean"] for r in self.attention_rows()}
        per_block = tuple(
            block_verdict(int(block), kinds[blocks == block], means, attention)
            for block in np.unique(blocks)
        )
        stop = self.dominance_stop
        return DominanceSummary(
            int(kinds.size),
            *kind_fractions(kinds),
            per_block,
            agreement=Agreement.of(per_block),
            operator=operator_summary(self.operator, self.dominance),
            inputs=None if stop is None else stop.inputs,
            rule=None if stop is None else str(self.config.dominance_inputs),
            interval_width=None if stop is None or math.isnan(stop.width) else stop.width,
        )

    def spectra_summary(self) -> dict[str, Any]:
        """Per spectrum kind: count, negative fraction, skewness, spectral radius."""
        return {kind: vars(summary) for kind, summary in summarize_spectra(self.spectra).items()}

    def to_dict(self) -> dict[str, Any]:
        """The ``audit.json`` document."""
        return {
            "model": self.model,
            "provider": self.provider,
            "n_inputs": self.inputs.n_inputs,
            "inputs": self.inputs,
            "blocks": self.blocks,
            "skipped": self.skipped,
            "layers": {
                "definition": "layer 0 = stream entering block 0; layer i = output of block i-1",
                "count": self.n_layers,
                "final": self.final_metrics(),
            },
            "dominance": self.dominance_summary(),
            "attention_part": {
                "definition": "the stream right after each block's attention sublayer, before its "
                "MLP: the attention residual sum (pre-LN), its norm (post-LN); none for parallel "
                "blocks",
                "blocks": sorted({int(row["block"]) for row in self.attention_rows()}),
            },
            "h": {
                "used": self.config.h,
                "definition": H_DEFINITION,
                "blocks": [
                    {"block": b.index, "folded": list(b.folded()), "omitted": list(b.omitted())}
                    for b in self.blocks
                ],
            },
            "depth": self.depth,
            **sublayer_json(self.operating, self.attribution),
            "spectra": self.spectra_summary(),
            "config": self.config,
            "provenance": self.provenance,
            "notes": [note.text for note in self.notes],
        }
