"""The model audit: run a real ONNX Transformer on real inputs and measure smoothing layer by layer.

For every input and layer the audit records the simulator's smoothing metrics of the hidden states,
reduced inside the graph to a few statistics per layer (:mod:`oversmooth.importers.runtime.reductions`: the hidden
states themselves never leave the device);
for every (input, block, head) it finds the dominating eigenvalue of ``I + H_h ⊗ A`` from the real
attention matrix A and the head's effective value product (docs/theory.md §6.2, §6.8, Table 1); and
it reports the eigenvalues of the value products per head and layer, stored and effective (Fig. 5).

Layers
------
Layer 0 is the residual stream entering the first block (after the embeddings and any
embedding norm); layer i is the output of block i-1, i.e. the stream entering block i. For a post-LN
block that is the output of its last norm; for a pre-LN block the residual after its MLP add, before
any final norm. A decoder layer's cross-attention, skipped by design, is inside its layer: layer i
is the output of the whole decoder layer i-1, as Hugging Face's ``hidden_states`` count them; so
are the sub-layers a layer holds before its attention (a Conformer's first half-step FFN: layer i
is then the output of layer i-1 after its final norm, :mod:`oversmooth.importers.match.boundaries`). Padding
tokens (from the attention mask) never enter a metric; prefix tokens (CLS, registers) are left out
of the metrics when ``exclude_prefix`` is set.

Dominance counting
------------------
One case per (input, block, head). A is the head's attention matrix restricted to real tokens (rows
renormalised). H_h is the effective ``M_h = C diag(γ) W_V^h W_O^h diag(s)`` (``h="effective"``, the
default: every linear factor between the residual stream and the branch's contribution,
:meth:`~oversmooth.importers.weights.BlockWeights.h_factors`) or ``W_V^h W_O^h`` as stored (``h="stored"``, the
paper's protocol); per head its d_head eigenvalues plus the zero eigenvalue of the rank-deficient
d×d product (``granularity="head"``), or the d eigenvalues of the whole-layer sum (``"layer"``).
The kind is perron when every dominating ``1 + λ^H λ^A`` uses the Perron root of A, non-perron
otherwise (balanced ties, S4, are non-perron and also counted separately).

Pipeline
--------
One audit is three steps, shared by the audit in one process and the sharded audit
(:mod:`oversmooth.sharding`), which differ only in where :func:`measure` runs:

:func:`prepare` (load, match, extract, value spectra, notes; once, in the calling process)
    → a :class:`PreparedAudit` value, small enough to send to workers (:meth:`PreparedAudit.structure`
    drops the weights: the block structure, tensor names and column indices stay);
:func:`measure` (the session and the batches: metrics and dominance cases of some inputs)
    → a :class:`Measurement`;
:func:`audit_result` (model, inputs, configuration, provenance, notes)
    → an :class:`~oversmooth.importers.audit.records.AuditResult`.

Public API
----------
AuditOptions
    Every option of an audit, checked once when made.
audit, run_audit
    Run the whole audit and return an :class:`~oversmooth.importers.audit.records.AuditResult` (the report
    folder is the application's: :func:`oversmooth.report.save_audit`). :func:`audit` takes the
    options as keywords, :func:`run_audit` as one :class:`AuditOptions`.
open_model, prepare, PreparedAudit, measure, Measurement, audit_result
    The three steps and their values.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oversmooth.importers.audit.audit_notes import input_notes, model_notes
from oversmooth.importers.audit.cache import cached_value_spectra
from oversmooth.importers.audit.depth import depth_summary
from oversmooth.importers.audit.dominance import (
    dominance_spectra,
)
from oversmooth.importers.audit.dominance_inputs import DominanceBudget, dominance_stop
from oversmooth.importers.audit.host_work import (
    OperatorPlan,
    batch_work,
    held_attention_limit,
    pipelined,
)
from oversmooth.importers.audit.operating_step import (
    AttributionCase,
    BlockTerms,
    OperatingCase,
    block_terms,
    sublayer_plan,
)
from oversmooth.importers.audit.operator_step import OperatorCase, operator_factors
from oversmooth.importers.audit.options import AuditOptions
from oversmooth.importers.audit.pre_norm_sums import pre_norm_notes
from oversmooth.importers.audit.records import (
    AuditConfig,
    AuditResult,
    DominanceCase,
    HeadCase,
    InputsInfo,
    ModelInfo,
    Note,
    Provenance,
    ProviderInfo,
)
from oversmooth.importers.audit.session import (
    STREAM_TERMS,
    AuditSession,
    audit_session,
    layer_tensors,
)
from oversmooth.importers.defaults import (
    DOMINANCE_MODES,
    OPERATOR_INPUTS,
)
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import OnnxModel, load_model
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import default_inputs
from oversmooth.importers.match import (
    AttentionBlock,
    MatchFailure,
    check_complete,
    find_attention_blocks,
)
from oversmooth.importers.runtime.batching import items_per_call, run_notes
from oversmooth.importers.runtime.runner import default_threads
from oversmooth.importers.value_spectra import BlockSpectra, HChoice, spectrum_rows
from oversmooth.importers.weights import BlockWeights, block_weights
from oversmooth.importers.zoo import ModelRef, ZooModel, file_sha256, lookup
from oversmooth.simulator.metrics import METRICS
from oversmooth.simulator.operator import HeadFactors
from oversmooth.simulator.output import package_versions
from oversmooth.simulator.statistics import SPECTRAL_METRICS, SPECTRAL_NORM_METRIC

__all__ = [
    "DOMINANCE_MODES",
    "OPERATOR_INPUTS",
    "AuditOptions",
    "HChoice",
    "Measurement",
    "PreparedAudit",
    "audit",
    "audit_result",
    "measure",
    "measure_session",
    "open_model",
    "prepare",
    "run_audit",
]

_PACKAGES = ("oversmooth", "numpy", "scipy", "onnx", "onnxruntime", "onnxruntime-gpu")


@dataclass(frozen=True)
class PreparedAudit:
    """What an audit knows before it runs an input: the input-independent part, computed once.

    Attributes
    ----------
    model : ModelInfo
    options : AuditOptions
    blocks : tuple of AttentionBlock
        The matched blocks in depth order: :class:`~oversmooth.importers.weights.BlockWeights` where they were
        prepared, their structure only after :meth:`structure` (what workers receive).
    matched_part_only : bool
        The blocks are only the matched part of the model (``partial`` with unmatched blocks).
    skipped : tuple of MatchFailure
        The attention skipped by design (outside the theory): named in the result, not audited.
    spectra : tuple of BlockSpectra
        The value spectra per block (Fig. 5, the dominance step's H).
    eig_H : tuple of ndarray
        Per block, the (n_heads, k) H eigenvalues of the dominance step (empty without one).
    operator : tuple of HeadFactors
        Per block, every head's factored ``M_h`` for the operator dominance (empty unless
        ``dominance="operator"``).
    terms : tuple of BlockTerms
        Per block what the rebuilt attention sublayer needs (operating point, attribution;
        empty without a dominance step).
    prefix : int
        Prefix tokens left out of the metrics.
    items : int
        Inputs per onnxruntime call (:func:`~oversmooth.importers.runtime.batching.items_per_call`).
    notes : tuple of Note
        The report's notes, in order (missing blocks, departures, random inputs, metrics not
        computed, the layer choice, batching).
    """

    model: ModelInfo
    options: AuditOptions
    blocks: tuple[AttentionBlock, ...]
    matched_part_only: bool
    spectra: tuple[BlockSpectra, ...]
    eig_H: tuple[np.ndarray, ...]
    operator: tuple[HeadFactors, ...]
    prefix: int
    items: int
    notes: tuple[Note, ...]
    skipped: tuple[MatchFailure, ...] = ()
    terms: tuple[BlockTerms, ...] = ()

    def structure(self) -> PreparedAudit:
        """This value with every block's weights dropped: what a worker needs to measure (with
        ``dominance="operator"`` it keeps :attr:`operator`, the heads' factored products)."""
        kept = [item.name for item in dataclasses.fields(AttentionBlock)]
        blocks = tuple(
            AttentionBlock(**{name: getattr(block, name) for name in kept}) for block in self.blocks
        )
        return dataclasses.replace(self, blocks=blocks)


@dataclass(frozen=True)
class Measurement:
    """What running the session on some inputs measured (a shard's part, or all of it).

    Attributes
    ----------
    metrics : dict of str to (n_inputs, n_layers) ndarray
    dominance : list of DominanceCase
        In input order; ``input`` counts from the first input measured.
    provider : ProviderInfo
    runner : dict
        The runner's session record (:meth:`~oversmooth.importers.runtime.runner.Runner.provenance`).
    attention_part : dict of str to (n_inputs, n_blocks) ndarray
        Every metric of the stream right after each block's attention sublayer
        (:func:`~oversmooth.importers.audit.session.attention_sublayer_tensor`); NaN for blocks without one.
    operator : list of OperatorCase
        The exact dominance of each block's operator, per (input, block), for the inputs it ran on.
    attention_to_host : dict of str to int
        What the dominance step handed to the host's dense eigensolver: ``bytes`` and ``arrays``
        (the undecided heads' matrices), and ``device_bytes``, the part copied from a GPU
        (:class:`~oversmooth.simulator.backend.HostCopies`).
    heads : list of HeadCase
        The depth step's attention spectra per (input, block, head), for the inputs it ran on.
    stream : dict of str to (n_inputs, n_layers) ndarray
        The depth step's stream terms (:data:`~oversmooth.importers.audit.session.STREAM_TERMS`).
    """

    metrics: dict[str, np.ndarray]
    dominance: list[DominanceCase]
    provider: ProviderInfo
    runner: dict[str, Any]
    attention_part: dict[str, np.ndarray]
    operator: list[OperatorCase] = dataclasses.field(default_factory=list)
    attention_to_host: dict[str, int] = dataclasses.field(default_factory=dict)
    heads: list[HeadCase] = dataclasses.field(default_factory=list)
    stream: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    operating: list[OperatingCase] = dataclasses.field(default_factory=list)
    attribution: list[AttributionCase] = dataclasses.field(default_factory=list)

    def shifted(self, start: int) -> Measurement:
        """The same measurement with its cases' inputs counted from ``start``."""
        names = ("dominance", "operator", "heads", "operating", "attribution")
        moved: dict[str, Any] = {
            name: [dataclasses.replace(c, input=c.input + start) for c in getattr(self, name)]
            for name in names
        }
        return dataclasses.replace(self, **moved)


def open_model(
    model: str | os.PathLike[str] | OnnxModel, entry: ZooModel | None = None
) -> tuple[ModelRef, OnnxModel]:
    """The model as (file, zoo entry) and its parsed graph: parsed once, here or by the caller.

    A zoo name or path is looked up (``entry`` is then the zoo's); an already loaded
    :class:`~oversmooth.importers.graph.OnnxModel` is used as it is, with ``entry``.
    """
    if isinstance(model, OnnxModel):
        if model.path is None:
            raise ImporterInputError(
                "`model` must have been loaded from a file; got an in-memory model"
            )
        return ModelRef(model.path, entry), model
    ref = lookup(model)
    return ref, load_model(ref.path)


def prepare(
    ref: ModelRef,
    graph: OnnxModel,
    inputs: Inputs | None = None,
    options: AuditOptions | None = None,
) -> tuple[PreparedAudit, Inputs]:
    """The input-independent part of an audit: match, extract, value spectra, notes.

    Parameters
    ----------
    ref, graph : ModelRef, OnnxModel
        The model (:func:`open_model`).
    inputs : Inputs, optional
        Default: the bundled photographs (image models) or sentences (text models).
    options : AuditOptions, optional

    Returns
    -------
    PreparedAudit, Inputs
        The prepared audit and the inputs it will measure.
    """
    options = AuditOptions() if options is None else options
    prefix = options.prefix_count(ref.entry)
    report = find_attention_blocks(graph)
    check_complete(report, partial=options.partial)
    blocks = [block_weights(graph, block) for block in report.blocks]
    inputs = default_inputs(graph.inputs, ref.entry) if inputs is None else inputs
    if inputs.batch_size == 0:
        raise ImporterInputError("`inputs` must hold at least one item; got none")
    notes = model_notes(report, graph) + input_notes(graph, inputs, spectral=options.spectral)
    layer_notes: list[str] = []
    skipped = [failure.softmax for failure in report.skipped]
    layer_tensors(
        blocks, layer_notes, partial=bool(report.unmatched), skipped=skipped, index=graph.index
    )
    notes += [Note("layers", text) for text in layer_notes]
    items, batch_notes = items_per_call(graph, options.batch_size)
    notes += [Note("batching", text) for text in batch_notes]
    sha256 = file_sha256(ref.path)
    spectra = cached_value_spectra(blocks, sha256, use_cache=options.cache)
    dominance = options.dominance
    granularity = "head" if dominance in ("operator", "operating") else dominance
    eig_H = (
        dominance_spectra(blocks, spectra, granularity, options.h) if dominance != "none" else []
    )
    operator = operator_factors(blocks, options.h) if dominance == "operator" else ()
    prepared = PreparedAudit(
        model=ModelInfo(ref.name, str(ref.path), sha256, len(blocks)),
        options=options,
        blocks=tuple(blocks),
        matched_part_only=bool(report.unmatched),
        spectra=tuple(spectra),
        eig_H=tuple(eig_H),
        operator=operator,
        terms=block_terms(blocks) if dominance != "none" else (),
        prefix=prefix,
        items=items,
        notes=tuple(notes),
        skipped=tuple(report.skipped),
    )
    return prepared, inputs


def measure_session(
    prepared: PreparedAudit, graph: OnnxModel, inputs: Inputs, *, threads: int | None = None
) -> AuditSession:
    """The onnxruntime session :func:`measure` runs for ``prepared`` on ``inputs`` (built once;
    a benchmark may run it again through ``measure(..., session=)``)."""
    options = prepared.options
    return audit_session(
        graph,
        prepared.blocks,
        inputs,
        prefix=prepared.prefix,
        attention=options.dominance != "none",
        spectral=options.spectral,
        provider=options.provider,
        threads=options.threads or threads or default_threads(),
        partial=prepared.matched_part_only,
        spectral_norm=options.spectral_norm,
        skipped=[failure.softmax for failure in prepared.skipped],
        token_rows=bool(prepared.terms),
    )


def measure(
    prepared: PreparedAudit,
    graph: OnnxModel,
    inputs: Inputs,
    *,
    threads: int | None = None,
    first_input: int = 0,
    session: AuditSession | None = None,
    stop_early: bool = True,
) -> Measurement:
    """Run the audit's session on ``inputs``: every metric per (input, layer), every dominance case.

    The cores of onnxruntime and of the host work are ``prepared.options.threads`` when set, else
    ``threads`` (a cluster worker's share of its host), else every core this process may use.
    ``first_input`` is the number of the first of ``inputs`` among all the audit's inputs (a
    shard's start): the operator dominance runs on the audit's first ``operator_inputs`` only.
    ``session``: one already built by :func:`measure_session` for these inputs. ``stop_early``:
    let ``--dominance-inputs auto`` stop the dominance step once its shares are precise enough
    (a shard, which sees only its inputs, computes them all and the merge decides).
    """
    options = prepared.options
    threads = options.threads or threads or default_threads()
    if session is None:
        session = measure_session(prepared, graph, inputs, threads=threads)
    session.copies.reset()
    shape = (inputs.batch_size, len(session.plan.layers))  # the layers, then the sublayers
    names = [*METRICS, *([SPECTRAL_NORM_METRIC] if options.spectral_norm else [])]
    per_input = {name: np.full(shape, np.nan) for name in names}
    remaining = options.operator_inputs - first_input
    rows = max(remaining, 0) if prepared.terms else 0
    batches = session.batches(prepared.items, progress=options.progress, rows=rows)
    plan = (
        OperatorPlan(prepared.operator, remaining) if prepared.operator and remaining > 0 else None
    )
    stream = {name: np.full(shape, np.nan) for name in STREAM_TERMS}
    budget = DominanceBudget(options.dominance_inputs, first_input, stop_early)
    measure_batch = functools.partial(
        batch_work,
        session,
        prepared.blocks,
        prepared.eig_H,
        options.tie_rtol,
        per_input,
        plan,
        stream=stream,
        depth_inputs=max(options.depth_inputs - first_input, 0),
        sublayer=sublayer_plan(
            prepared.terms,
            rows,
            options.dominance == "operating",
            session.plan,
            session.sublayers,
            options.tie_rtol,
            session.reads,
        ),
        budget=budget,
    )
    cases, exact, heads, (operating, parts) = pipelined(
        batches, measure_batch, threads, held_attention_limit(session)
    )
    runner = session.runner
    provider = ProviderInfo(options.provider, tuple(runner.provider_used), runner.provider_note)
    n_layers, n_blocks = len(session.layers), len(prepared.blocks)
    attention_part = {name: np.full((inputs.batch_size, n_blocks), np.nan) for name in names}
    late = slice(session.late_start, session.late_start + len(session.pre_norm_sums))
    for name, values in per_input.items():
        sublayers = values[:, n_layers : n_layers + len(session.sublayers)]
        attention_part[name][:, session.sublayers] = sublayers
        # a post-LN block's attention sublayer is its sum before the norm, where it was read
        attention_part[name][:, session.pre_norm_sums] = values[:, late]
    layers = {name: values[:, :n_layers] for name, values in per_input.items()}
    copies = session.copies
    to_host = {"bytes": copies.bytes, "arrays": copies.arrays, "device_bytes": copies.device_bytes}
    return Measurement(
        layers,
        cases,
        provider,
        runner.provenance(),
        attention_part,
        exact,
        to_host,
        heads,
        {name: _read_streams(values, n_layers, session.reads) for name, values in stream.items()},
        operating,
        parts,
    )


def _read_streams(values: np.ndarray, n_layers: int, reads: list[int]) -> np.ndarray:
    """The depth step's stream terms per layer, column i (i < blocks) taken from the stream block
    i's attention reads (its layer, or its attention input's plan entry, :attr:`AuditSession.
    reads`)."""
    out = values[:, :n_layers].copy()
    out[:, : len(reads)] = values[:, reads]
    return out


def audit_result(
    prepared: PreparedAudit,
    inputs: Inputs,
    measurement: Measurement,
    *,
    notes: Sequence[Note] = (),
) -> AuditResult:
    """The :class:`~oversmooth.importers.audit.records.AuditResult` of a prepared audit and its measurement.

    ``prepared.blocks`` must hold the weights (the preparing process's value); ``notes`` are added
    after the prepared ones. The depth step's summary (:func:`~oversmooth.importers.audit.depth.depth_summary`)
    is made here, where the weights are.
    """
    options = prepared.options
    blocks = [block for block in prepared.blocks if isinstance(block, BlockWeights)]
    if len(blocks) != len(prepared.blocks):
        raise TypeError("audit_result needs the prepared blocks with their weights")
    stop = None
    if options.dominance != "none":
        stop = dominance_stop(measurement.dominance, options.dominance_inputs, inputs.batch_size)
    result = AuditResult(
        model=prepared.model,
        inputs=InputsInfo(
            inputs.source, inputs.digest, inputs.batch_size, inputs.random, tuple(inputs.labels)
        ),
        provider=measurement.provider,
        blocks=blocks,
        metrics=measurement.metrics,
        attention_part=measurement.attention_part,
        operator=measurement.operator,
        operating=measurement.operating,
        attribution=measurement.attribution,
        heads=measurement.heads,
        stream=measurement.stream,
        dominance=[c for c in measurement.dominance if stop is None or c.input < stop.inputs],
        spectra=spectrum_rows(prepared.spectra),
        config=AuditConfig(
            batch_size=options.batch_size,
            exclude_prefix=prepared.prefix,
            dominance=options.dominance,
            operator_inputs=options.operator_inputs if options.dominance != "none" else 0,
            h=options.h,
            tie_rtol=options.tie_rtol,
            metrics=tuple(m for m in METRICS if options.spectral or m not in SPECTRAL_METRICS)
            + ((SPECTRAL_NORM_METRIC,) if options.spectral_norm else ()),
            depth_inputs=options.depth_inputs if options.dominance != "none" else 0,
            dominance_inputs=options.dominance_inputs,
        ),
        provenance=Provenance(
            python=platform.python_version(),
            versions=package_versions(_PACKAGES),
            runner=measurement.runner,
            inputs_digest=inputs.digest,
        ),
        notes=[
            *prepared.notes,
            *run_notes(measurement.runner),
            *pre_norm_notes(prepared.blocks, measurement.runner),
            *notes,
        ],
        skipped=prepared.skipped,
        dominance_stop=stop,
    )
    return dataclasses.replace(result, depth=depth_summary(result))


def run_audit(
    model: str | os.PathLike[str] | OnnxModel,
    inputs: Inputs | None = None,
    options: AuditOptions | None = None,
    *,
    entry: ZooModel | None = None,
) -> AuditResult:
    """The whole audit in this process: :func:`prepare`, :func:`measure`, :func:`audit_result`.

    ``model`` and ``entry`` as for :func:`open_model`; ``inputs`` as for :func:`prepare`.
    """
    options = AuditOptions() if options is None else options
    ref, graph = open_model(model, entry)
    prepared, inputs = prepare(ref, graph, inputs, options)
    return audit_result(prepared, inputs, measure(prepared, graph, inputs))


def audit(
    model: str | os.PathLike[str] | OnnxModel,
    inputs: Inputs | None = None,
    options: AuditOptions | None = None,
    *,
    entry: ZooModel | None = None,
    **fields: Any,
) -> AuditResult:
    """Audit a model: per-layer smoothing of real inputs, dominating eigenvalues, value spectra.

    :func:`run_audit` with ``options`` (default :class:`AuditOptions`'s defaults) and any of its
    fields given as keywords on top, e.g. ``audit("dinov2-vits14", provider="cpu", h="stored")``.

    Parameters
    ----------
    model : str, path or OnnxModel
        An ONNX file or a zoo name (``oversmooth models``; fetched on first use), or a model already
        loaded with :func:`oversmooth.importers.graph.load_model` (it is not parsed again).
    inputs : Inputs, optional
        Default: the bundled photographs (image models) or sentences (text models).
    options : AuditOptions, optional
        Every option of the audit; each field is described there.
    entry : ZooModel, optional
        The zoo entry of an already loaded ``model`` (preprocessing, prefix tokens, display name);
        looked up automatically when ``model`` is a zoo name.
    **fields
        :class:`AuditOptions` fields replacing those of ``options``.

    Raises
    ------
    ImporterInputError
        A keyword that is no :class:`AuditOptions` field, or a field value it refuses.
    """
    known = {field.name for field in dataclasses.fields(AuditOptions)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ImporterInputError(
            f"`{unknown[0]}` is not an audit option; expected one of {', '.join(sorted(known))}"
        )
    options = dataclasses.replace(options or AuditOptions(), **fields)
    return run_audit(model, inputs, options, entry=entry)
