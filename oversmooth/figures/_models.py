"""The real models behind Figs. 2, 3, 5 and Table 1: zoo models, their transforms, cached audits.

A *variant* is a zoo model as trained or after one of the transforms of :mod:`oversmooth.importers.transform`
(random init, ± reparameterisation). One ``python -m oversmooth.figures`` run audits each variant once: the
first script that asks runs :func:`oversmooth.importers.audit.pipeline` on the bundled inputs and keeps a slim
summary (:class:`Audited`) in memory; later scripts reuse it. Transformed models are written once
into ``cache_dir()/transformed`` (see :func:`oversmooth.importers.zoo.cache_dir`), named by the source model's
sha256, the transform, its parameters and a digest of the transform code, and reused by later runs
(a new copy replaces the older copies of the same variant).

Every audit runs on the CPU provider (reproducible numbers), leaves the zoo's prefix tokens (the
ViT's CLS) out of the metrics and counts dominance per head. Quick mode uses the first
:data:`QUICK_INPUTS` bundled images or sentences.

Public API
----------
Variant, VARIANTS
    The audited (model, transform) pairs.
Audited
    Per-layer rows, dominance summary and spectra of one audit, with its provenance.
audited
    The (cached) audit of one variant.
spectra
    The W_V W_O eigenvalues of one variant (from a cached audit, else from the weights alone).
variant_file
    The ONNX file of a variant (transformed copies are created on first use).
smoothing_rows, SMOOTHING_COLUMNS
    Tidy per-layer smoothing rows of several variants (Figs. 2 and 3).
provenance
    The configuration record of a figure built from audits.
rows_of
    Select tidy rows by column values.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from oversmooth.importers.audit import audit
from oversmooth.importers.audit.pipeline import HChoice
from oversmooth.importers.audit.records import DominanceSummary
from oversmooth.importers.graph import OnnxModel, load_model
from oversmooth.importers.inputs import Inputs, default_inputs
from oversmooth.importers.value_spectra import SpectrumRow
from oversmooth.importers.zoo import cache_dir, file_sha256, get_model, lookup
from oversmooth.simulator.sampling import share_intervals
from oversmooth.simulator.theory import KINDS

__all__ = [
    "AUDIT_SETTINGS",
    "QUICK_INPUTS",
    "RANDOM_INIT",
    "SMOOTHING_COLUMNS",
    "VARIANTS",
    "Audited",
    "Variant",
    "audited",
    "perron_intervals",
    "provenance",
    "rows_of",
    "smoothing_rows",
    "spectra",
    "variant_file",
]

Transform = Literal["trained", "random-init", "plus", "minus"]
#: Bundled inputs per model kind in quick mode (full mode uses all: 6 images, 12 sentences).
QUICK_INPUTS = {"image": 2, "text": 3}
#: Parameters of :func:`oversmooth.importers.transform.random_init`.
RANDOM_INIT: dict[str, Any] = {"std": 0.02, "seed": 0}
#: Fixed keyword arguments of every :func:`oversmooth.importers.audit.pipeline` call.
AUDIT_SETTINGS: dict[str, Any] = {"provider": "cpu", "batch_size": 4, "dominance": "head"}


@dataclass(frozen=True)
class Variant:
    """One audited model: a zoo model, as trained or transformed.

    Attributes
    ----------
    key : str
        ``MODEL`` or ``MODEL:TRANSFORM``.
    model : str
        Zoo name (:func:`oversmooth.importers.zoo.models`).
    transform : {"trained", "random-init", "plus", "minus"}
    label : str
        Legend label.
    """

    key: str
    model: str
    transform: Transform
    label: str

    @property
    def modality(self) -> str:
        """``"vision"`` or ``"language"``."""
        return "vision" if get_model(self.model).kind == "image" else "language"


def _variant(model: str, transform: Transform, label: str) -> Variant:
    key = model if transform == "trained" else f"{model}:{transform}"
    return Variant(key, model, transform, label)


#: Every variant the figures use, by key. minilm-l6-int8 stores int8 weights, which
#: importers.transform refuses to rewrite, so it appears only as trained.
VARIANTS: dict[str, Variant] = {
    v.key: v
    for v in (
        _variant("dinov2-vits14", "trained", "DINOv2 ViT-S/14"),
        _variant("dinov2-vits14", "random-init", "DINOv2 ViT-S/14, random init"),
        _variant("dinov2-vits14", "plus", "DINOv2 ViT-S/14⁺"),
        _variant("dinov2-vits14", "minus", "DINOv2 ViT-S/14⁻"),
        _variant("minilm-l6-int8", "trained", "MiniLM-L6 (int8)"),
        _variant("minilm-l3", "trained", "MiniLM-L3"),
        _variant("minilm-l3", "random-init", "MiniLM-L3, random init"),
        _variant("minilm-l3", "plus", "MiniLM-L3⁺"),
        _variant("minilm-l3", "minus", "MiniLM-L3⁻"),
    )
}


@dataclass(frozen=True)
class Audited:
    """What the figures need from one audit (the weights and per-input arrays are dropped).

    Attributes
    ----------
    variant : Variant
    layer_rows : list of dict
        :meth:`oversmooth.importers.audit.records.AuditResult.layer_rows`: ``layer, metric, mean, std, n``.
    dominance : DominanceSummary
        :meth:`oversmooth.importers.audit.records.AuditResult.dominance_summary`.
    spectra : list of SpectrumRow
    provenance : dict
        Model file sha256, inputs (source, digest, count), provider used, audit configuration.
    cases : (n_cases, 3) int ndarray
        One row per dominance case: input, block, 1 when perron type (else 0).
    frozen : (n_cases, 4) int ndarray
        One row per (input, block) of the frozen block operator (``frozen`` of :func:`audited`):
        input, block, the kind's index in :data:`~oversmooth.simulator.theory.KINDS`, and whether
        repeating it smooths (1), does not (0) or neither is decided (−1: a balanced operator, a
        split direction at the operating point); empty when none ran.
    """

    variant: Variant
    layer_rows: list[dict[str, Any]]
    dominance: DominanceSummary
    spectra: list[SpectrumRow]
    provenance: dict[str, Any]
    cases: np.ndarray
    frozen: np.ndarray


#: The frozen block operators an audit can count per (input, block): the whole operator at the
#: effective H (``dominance="operator"``) or at each input's own normalisation (``"operating"``).
Frozen = Literal["operator", "operating"]
#: Audits made in this process, by (key, quick, h, operator inputs, frozen operator).
_AUDITS: dict[tuple[str, bool, HChoice, int, Frozen], Audited] = {}


def _transform_digest() -> str:
    from oversmooth.importers import transform

    return hashlib.sha256(Path(transform.__file__).read_bytes()).hexdigest()[:12]


def _transformed_stem(variant: Variant) -> str:
    """``MODEL-TRANSFORM-PARAMS``: what every cached copy of this variant's file starts with."""
    params = (
        f"std{RANDOM_INIT['std']}-seed{RANDOM_INIT['seed']}"
        if variant.transform == "random-init"
        else "nearest"
    )
    return f"{variant.model}-{variant.transform}-{params}"


def _prune_stale(target: Path, stem: str) -> None:
    """Delete older copies of the same variant (another source model or transform code)."""
    for stale in target.parent.glob(f"{stem}-*.onnx"):
        if stale != target:
            stale.unlink(missing_ok=True)


def variant_file(key: str) -> Path:
    """The ONNX file of variant ``key``: the zoo file, or a transformed copy made on first use.

    A new copy replaces older copies of the same variant in the cache folder.

    Parameters
    ----------
    key : str
        A key of :data:`VARIANTS`.

    Returns
    -------
    Path
    """
    from oversmooth.importers.transform import random_init, reparameterize

    variant = VARIANTS[key]
    source = lookup(variant.model).path
    if variant.transform == "trained":
        return source
    stem = _transformed_stem(variant)
    target = (
        cache_dir()
        / "transformed"
        / f"{stem}-{file_sha256(source)[:12]}-{_transform_digest()}.onnx"
    )
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        if variant.transform == "random-init":
            random_init(source, target, **RANDOM_INIT)
        else:
            reparameterize(source, variant.transform, target)
        _prune_stale(target, stem)
    return target


def _inputs(variant: Variant, model: OnnxModel, quick: bool) -> Inputs:
    entry = get_model(variant.model)
    inputs = default_inputs(model.inputs, entry)
    return inputs.subset(slice(0, QUICK_INPUTS[entry.kind])) if quick else inputs


def audited(
    key: str,
    quick: bool,
    h: HChoice = "effective",
    operator_inputs: int = 0,
    frozen: Frozen = "operator",
) -> Audited:
    """Audit variant ``key`` on the bundled inputs (once per process and arguments).

    Parameters
    ----------
    key : str
        A key of :data:`VARIANTS`.
    quick : bool
        Use the first :data:`QUICK_INPUTS` inputs only.
    h : {"effective", "stored"}
        The H of the dominance count (:class:`oversmooth.importers.audit.pipeline.AuditOptions`).
    operator_inputs : int
        When positive, also the frozen block operator ``frozen`` on that many first inputs.
    frozen : {"operator", "operating"}
        ``"operator"``: the exact whole operator at the effective H (``dominance="operator"``; its
        summary is ``dominance.operator``); ``"operating"``: the operator frozen at each input's own
        normalisation (``dominance="operating"``, docs/theory.md §6.12). Its cases are
        :attr:`Audited.frozen`.

    Returns
    -------
    Audited
    """
    arguments = (key, quick, h, operator_inputs, frozen)
    if arguments not in _AUDITS:
        _AUDITS[arguments] = _audit(VARIANTS[key], quick, h, operator_inputs, frozen)
    return _AUDITS[arguments]


def _audit(
    variant: Variant, quick: bool, h: HChoice, operator_inputs: int, frozen: Frozen
) -> Audited:
    model = load_model(variant_file(variant.key))
    inputs = _inputs(variant, model, quick)
    prefix = get_model(variant.model).prefix_tokens
    settings = dict(AUDIT_SETTINGS)
    if operator_inputs > 0:
        settings.update(dominance=frozen, operator_inputs=operator_inputs)
    result = audit(model, inputs, exclude_prefix=prefix, h=h, **settings)
    return Audited(
        variant=variant,
        layer_rows=result.layer_rows(),
        dominance=result.dominance_summary(),
        spectra=result.spectra,
        provenance={
            "model": variant.model,
            "transform": variant.transform,
            "file_sha256": result.model.sha256,
            "n_blocks": result.model.n_blocks,
            "inputs": {
                "source": result.inputs.source,
                "digest": inputs.digest,
                "n_inputs": result.inputs.n_inputs,
            },
            "provider_used": list(result.provider.used),
            "config": result.config.to_dict(),
        },
        cases=np.array(
            [(c.input, c.block, c.kind == "perron") for c in result.dominance], dtype=np.int64
        ).reshape(-1, 3),
        frozen=np.array(
            [
                (c.input, c.block, KINDS.index(c.kind), _smooths(c, frozen))
                for c in (result.operator if frozen == "operator" else result.operating)
            ],
            dtype=np.int64,
        ).reshape(-1, 4),
    )


def _smooths(case: Any, frozen: Frozen) -> int:
    """1 when repeating the frozen operator of ``case`` lowers HFC/LFC, 0 when not, −1 undecided:
    an operator case by its kind (perron smooths), an operating case by its direction (its kind is
    generically non-perron, docs/theory.md §6.12)."""
    if frozen == "operating":
        return {"smoothing": 1, "no smoothing": 0}.get(case.direction, -1)
    return {"perron": 1, "non-perron": 0}.get(case.kind, -1)


def perron_intervals(
    result: Audited, resamples: int, seed: int, level: float = 0.95
) -> dict[str, tuple[float, float]]:
    """Bootstrap intervals over inputs of the perron share, overall (``"all"``) and per block.

    The cases of one input share its hidden states, so they are not independent: the inputs are
    resampled with replacement ``resamples`` times and the share recomputed from the resampled
    inputs' cases (:func:`oversmooth.simulator.sampling.share_intervals`, the audit's own intervals; the
    same seed gives every block the same resamples).
    """
    inputs, blocks, perron = result.cases.T
    n_inputs = int(result.provenance["inputs"]["n_inputs"])
    found = {}
    for label in ["all", *map(str, np.unique(blocks))]:
        chosen = np.ones_like(blocks, bool) if label == "all" else blocks == int(label)
        totals = np.bincount(inputs[chosen], minlength=n_inputs)
        hits = np.bincount(inputs[chosen], weights=perron[chosen], minlength=n_inputs)
        counts = np.stack([hits, totals - hits], axis=1)
        low, high = share_intervals(counts, resamples=resamples, seed=seed, level=level)[0]
        found[label] = (float(low), float(high))
    return found


@functools.cache
def spectra(key: str) -> list[SpectrumRow]:
    """The W_V W_O eigenvalue rows of variant ``key`` (:func:`oversmooth.importers.value_spectra.model_spectra`).

    Taken from an audit already made in this process, else computed from the weights alone.
    """
    for (cached_key, *_), result in _AUDITS.items():
        if cached_key == key:
            return result.spectra
    from oversmooth.importers.value_spectra import model_spectra
    from oversmooth.importers.weights import extract

    return model_spectra(extract(load_model(variant_file(key))))


#: Columns of the per-layer smoothing CSVs (Figs. 2 and 3).
SMOOTHING_COLUMNS = ("model", "transform", "modality", "layer", "metric", "mean", "std", "n")


def smoothing_rows(keys: Sequence[str], quick: bool) -> list[dict[str, Any]]:
    """Tidy per-layer smoothing rows (mean ± std over inputs) of every variant in ``keys``.

    Returns
    -------
    list of dict
        One row per (variant, layer, metric) with the :data:`SMOOTHING_COLUMNS` keys.
    """
    rows: list[dict[str, Any]] = []
    for key in keys:
        result = audited(key, quick)
        variant = result.variant
        rows.extend(
            {
                "model": variant.model,
                "transform": variant.transform,
                "modality": variant.modality,
                **row,
            }
            for row in result.layer_rows
        )
    return rows


def provenance(keys: Sequence[str], quick: bool, h: HChoice = "effective") -> dict[str, Any]:
    """The ``config`` entry of a figure's provenance: audit settings and every variant's record."""
    return {
        "audit": {**AUDIT_SETTINGS, "exclude_prefix": "the zoo's prefix tokens (CLS)"},
        "random_init": RANDOM_INIT,
        "inputs_per_model": QUICK_INPUTS if quick else "all bundled",
        "variants": {key: audited(key, quick, h).provenance for key in keys},
    }


def rows_of(rows: Sequence[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    """The rows whose values equal every ``column=value`` given."""
    return [row for row in rows if all(row[c] == v for c, v in match.items())]
