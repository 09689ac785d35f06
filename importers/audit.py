"""The model audit: run a real ONNX Transformer on real inputs and measure smoothing layer by layer.

For every input and layer the audit records the simulator's smoothing metrics of the hidden states;
for every (input, layer, head) it finds the dominating eigenvalue of ``I + H_h ⊗ A`` from the real
attention matrix A and the head's value-projection product (paper-spec §6.2, Table 1); and it reports
the eigenvalues of W_V W_O per head and layer (Fig. 5).

Layers
------
Layer 0 is the residual stream entering the first attention block (after the embeddings and any
embedding norm); layer i is the output of block i-1, i.e. the stream entering block i. For a post-LN
block that is the output of its last norm; for a pre-LN block the residual after its MLP add, before
any final norm. Padding tokens (from the attention mask) never enter a metric; prefix tokens (CLS,
registers) are left out of the metrics when ``exclude_prefix`` is set.

Dominance counting
------------------
One case per (input, layer, head). A is the head's attention matrix restricted to real tokens (rows
renormalised). H_h has the d_head eigenvalues of ``W_O^h W_V^h`` plus the zero eigenvalue of the
rank-deficient d×d product (``granularity="head"``), or the d eigenvalues of the whole-layer
``W_V W_O`` (``"layer"``); with ``fold_gamma`` the pre-LN γ is folded in (``diag(γ) W_V W_O``). The
kind is perron when every dominating ``1 + λ^H λ^A`` uses the Perron root of A, non-perron otherwise
(balanced ties, S4, are non-perron and also counted separately).

Public API
----------
audit
    Run the audit and return an :class:`AuditResult`.
layer_tensors
    The graph tensors the audit records as layers (block 0's input, every block's output).
AuditResult
    Per-input metrics, dominance cases and spectra, with summaries and ``save(folder)``.
"""

from __future__ import annotations

import csv
import json
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from threadpoolctl import threadpool_limits

from importers.graph import load_model
from importers.inputs import Inputs, bundled_inputs, graph_inputs
from importers.patterns import find_attention_blocks
from importers.runner import Runner
from importers.spectra import head_eigenvalues, layer_eigenvalues, model_spectra, summarize_spectra
from importers.weights import BlockWeights, block_weights
from importers.zoo import file_sha256, get_model, models, resolve_model
from simulator.errors import InputError
from simulator.metrics import METRICS, all_metrics
from simulator.output import atomic_directory, atomic_output, package_versions
from simulator.theory import KINDS, TIE_RTOL, dominance_kinds, kron_eigenvalues
from simulator.validation import check_choice, check_positive_int

__all__ = [
    "DOMINANCE_COLUMNS",
    "LAYER_COLUMNS",
    "AuditResult",
    "DominanceCase",
    "audit",
    "layer_tensors",
]

Granularity = Literal["head", "layer", "none"]
#: Columns of ``layers.csv``.
LAYER_COLUMNS = ("layer", "metric", "mean", "std", "n")
#: Columns of ``dominance.csv``.
DOMINANCE_COLUMNS = (
    "input",
    "layer",
    "head",
    "kind",
    "mu_real",
    "mu_imag",
    "modulus",
    "lambda_a_real",
    "lambda_a_imag",
    "lambda_h_real",
    "lambda_h_imag",
    "n_tokens",
)
SPECTRA_COLUMNS = ("layer", "head", "kind", "real", "imag")
_PACKAGES = ("oversmooth", "numpy", "scipy", "onnx", "onnxruntime", "onnxruntime-gpu")


@dataclass(frozen=True)
class DominanceCase:
    """The dominating eigenvalue of ``I + H_h ⊗ A`` for one (input, layer, head)."""

    input: int
    layer: int
    head: int
    kind: str
    mu: complex
    lambda_a: complex
    lambda_h: complex
    n_tokens: int


@dataclass(frozen=True, eq=False)
class AuditResult:
    """Everything one audit measured, with summaries and a ``save`` method.

    Attributes
    ----------
    model : dict
        ``name``, ``path``, ``sha256``, ``n_blocks``.
    inputs : dict
        ``source``, ``digest``, ``n_inputs``, ``random``, ``labels``.
    provider : dict
        ``requested``, ``used``, ``note`` (what onnxruntime actually ran).
    blocks : list of BlockWeights
    metrics : dict of str to (n_inputs, n_layers) ndarray
        Every metric of :data:`simulator.metrics.METRICS` per input and layer.
    dominance : list of DominanceCase
    spectra : list of SpectrumRow
    config : dict
    provenance : dict
    notes : list of str
        Observations worth reading (e.g. random inputs, a layer-boundary mismatch).
    """

    model: dict[str, Any]
    inputs: dict[str, Any]
    provider: dict[str, Any]
    blocks: list[BlockWeights]
    metrics: dict[str, np.ndarray]
    dominance: list[DominanceCase]
    spectra: list[Any]
    config: dict[str, Any]
    provenance: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        """Number of recorded layers (blocks + 1)."""
        return next(iter(self.metrics.values())).shape[1]

    def layer_rows(self) -> list[dict[str, Any]]:
        """Tidy ``layer,metric,mean,std,n`` rows: mean and std over inputs (NaN-aware)."""
        rows = []
        for layer in range(self.n_layers):
            for name, values in self.metrics.items():
                column = values[:, layer]
                finite = column[np.isfinite(column)]
                rows.append(
                    {
                        "layer": layer,
                        "metric": name,
                        "mean": float(finite.mean()) if finite.size else float("nan"),
                        "std": float(finite.std()) if finite.size else float("nan"),
                        "n": int(finite.size),
                    }
                )
        return rows

    def dominance_summary(self) -> dict[str, Any]:
        """Fractions of perron / non-perron cases overall and per layer (they sum to 1)."""
        if not self.dominance:
            return {
                "cases": 0,
                "perron": None,
                "non_perron": None,
                "balanced": None,
                "per_layer": [],
            }
        kinds = np.array([case.kind for case in self.dominance])
        layers = np.array([case.layer for case in self.dominance])
        means = {(r["layer"], r["metric"]): r["mean"] for r in self.layer_rows()}
        per_layer = []
        for layer in np.unique(layers):
            fractions = _fractions(kinds[layers == layer])
            per_layer.append(
                {
                    "layer": int(layer),
                    "cases": int(np.sum(layers == layer)),
                    **fractions,
                    **_block_verdict(fractions["perron"], means, int(layer)),
                }
            )
        return {"cases": int(kinds.size), **_fractions(kinds), "per_layer": per_layer}

    def spectra_summary(self) -> dict[str, Any]:
        """Per spectrum kind: count, negative fraction, skewness, spectral radius."""
        return {kind: vars(summary) for kind, summary in summarize_spectra(self.spectra).items()}

    def to_json(self) -> dict[str, Any]:
        """The ``audit.json`` document."""
        return {
            "model": self.model,
            "provider": self.provider,
            "n_inputs": self.inputs["n_inputs"],
            "inputs": self.inputs,
            "blocks": [_block_summary(block) for block in self.blocks],
            "layers": {
                "definition": "layer 0 = stream entering block 0; layer i = output of block i-1",
                "count": self.n_layers,
                "final": _final_metrics(self.layer_rows()),
            },
            "dominance": self.dominance_summary(),
            "spectra": self.spectra_summary(),
            "config": self.config,
            "provenance": self.provenance,
            "notes": self.notes,
        }

    def write(self, folder: Path, figures: Sequence[tuple[str, str]] = ()) -> list[Path]:
        """Write every output file into an existing ``folder`` (no atomicity; see :meth:`save`)."""
        paths = [
            folder / name
            for name in ("audit.json", "layers.csv", "spectra.csv", "dominance.csv", "report.md")
        ]
        with atomic_output(paths[0]) as handle:
            json.dump(self.to_json(), handle, indent=2, default=_json_default, allow_nan=True)
            handle.write("\n")
        _write_csv(
            paths[1], LAYER_COLUMNS, ([r[c] for c in LAYER_COLUMNS] for r in self.layer_rows())
        )
        _write_csv(
            paths[2],
            SPECTRA_COLUMNS,
            ([r.layer, r.head, r.kind, r.real, r.imag] for r in self.spectra),
        )
        _write_csv(paths[3], DOMINANCE_COLUMNS, (_dominance_row(case) for case in self.dominance))
        with atomic_output(paths[4]) as handle:
            handle.write(render_report(self, figures))
        return paths

    def save(
        self,
        folder: str | Path,
        *,
        figures: Callable[[AuditResult, Path], Sequence[tuple[str, str]]] | None = None,
    ) -> Path:
        """Write the report folder atomically: all files appear together or none do.

        Parameters
        ----------
        folder : path-like
            Destination; replaced as a whole if it exists.
        figures : callable, optional
            ``figures(result, staging_folder) -> [(title, file name), ...]`` draws PNGs into the
            staging folder; the report embeds them (``figures.audit_report.render`` does this).
        """
        target = Path(folder)
        with atomic_directory(target) as staging:
            drawn = figures(self, staging) if figures is not None else ()
            self.write(staging, drawn)
        return target


def _fractions(kinds: np.ndarray) -> dict[str, float]:
    perron = float(np.mean(kinds == "perron"))
    return {
        "perron": perron,
        "non_perron": 1.0 - perron,
        "balanced": float(np.mean(kinds == "balanced")),
    }


def _block_verdict(
    perron: float, means: dict[tuple[int, str], float], block: int
) -> dict[str, Any]:
    """What block ``block`` did to the stream (layer block -> block + 1) against the theory's call.

    Predicted: smoothing when most of the block's cases are perron-type. Observed: smoothing when
    HFC/LFC falls and the mean cosine rises, sharpening when both move the other way, else mixed
    (no verdict). The theory is for repeated linear layers, so this is a heuristic reading.
    """
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero or NaN mean gives no verdict
        ratio = np.float64(means[block + 1, "hfc_lfc"]) / np.float64(means[block, "hfc_lfc"])
    cosine = means[block + 1, "cosine"] - means[block, "cosine"]
    predicted = "smoothing" if perron >= 0.5 else "no smoothing"
    if ratio < 1 and cosine > 0:
        observed = "smoothing"
    elif ratio > 1 and cosine < 0:
        observed = "no smoothing"
    else:
        observed = "mixed"
    return {
        "hfc_lfc_ratio": float(ratio),
        "cosine_change": float(cosine),
        "predicted": predicted,
        "observed": observed,
        "agree": None if observed == "mixed" else predicted == observed,
    }


def _final_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    last = max(row["layer"] for row in rows)
    return {row["metric"]: row["mean"] for row in rows if row["layer"] == last}


def _block_summary(block: BlockWeights) -> dict[str, Any]:
    return {
        "index": block.index,
        "n_heads": block.n_heads,
        "n_kv_heads": block.n_kv_heads,
        "d_model": block.d_model,
        "d_head": block.d_head,
        "norm": block.norm,
        "norm_kind": block.norm_kind,
        "layer_scale": block.layer_scale is not None,
        "input": block.input_name,
        "output": block.output_name,
        "attention": block.attention_name,
    }


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _write_csv(path: Path, columns: Sequence[str], rows: Any) -> None:
    with atomic_output(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([repr(v) if isinstance(v, float) else v for v in row])


def _dominance_row(case: DominanceCase) -> list[Any]:
    return [
        case.input,
        case.layer,
        case.head,
        case.kind,
        case.mu.real,
        case.mu.imag,
        abs(case.mu),
        case.lambda_a.real,
        case.lambda_a.imag,
        case.lambda_h.real,
        case.lambda_h.imag,
        case.n_tokens,
    ]


# ------------------------------------------------------------------------------------------------
# Running the audit
# ------------------------------------------------------------------------------------------------


def _zoo_entry(model: str | Path) -> Any:
    names = {entry.name for entry in models()}
    if isinstance(model, str) and model in names:
        return get_model(model)
    return None


def default_inputs(path: Path, entry: Any) -> Inputs:
    """The bundled photographs or sentences matching the model (from the zoo, else its graph)."""
    graph = graph_inputs(path)
    if entry is not None:
        if entry.kind == "image":
            return bundled_inputs(
                "image", graph=graph, size=entry.image_size, mean=entry.mean, std=entry.std
            )
        return bundled_inputs("text", graph=graph)
    image = [g for g in graph if np.issubdtype(g.dtype, np.floating) and len(g.shape) == 4]
    if image:
        side = image[0].shape[-1]
        return bundled_inputs("image", graph=graph, size=side if isinstance(side, int) else 224)
    return bundled_inputs("text", graph=graph)


def layer_tensors(blocks: Sequence[BlockWeights], notes: list[str] | None = None) -> list[str]:
    """Graph tensors of the recorded layers: block 0's input, then every block's output.

    Layer 0 is the stream entering block 0, layer i the output of block i-1 (see the module
    docstring). Where a block does not read its predecessor's output, a note is appended to
    ``notes`` and the predecessor's output is used.
    """
    names = [blocks[0].input_name] + [block.output_name for block in blocks]
    for i in range(1, len(blocks)):
        if blocks[i].input_name != blocks[i - 1].output_name and notes is not None:
            notes.append(
                f"block {i} reads {blocks[i].input_name!r} but block {i - 1} ends at "
                f"{blocks[i - 1].output_name!r}; layer {i} uses the latter"
            )
    return names


def _hidden(array: np.ndarray, name: str) -> np.ndarray:
    if array.ndim != 3:
        raise InputError(
            f"hidden state {name!r} must have shape (batch, tokens, features); got {array.shape}"
        )
    return array


def _token_masks(
    inputs: Inputs, start: int, batch: int, n_tokens: int, exclude_prefix: int
) -> np.ndarray:
    # Images have no mask (every position is real); a text mask must match the token axis exactly.
    mask = inputs.token_mask_for(n_tokens)[start : start + batch].copy()
    mask[:, :exclude_prefix] = False
    return mask


def _value_spectra(
    blocks: Sequence[BlockWeights], granularity: Granularity, fold_gamma: bool
) -> list[np.ndarray]:
    """Per block a (n_heads, k) array of H eigenvalues used for dominance."""
    spectra = []
    for block in blocks:
        gamma = fold_gamma and block.norm == "pre" and block.gamma is not None
        if granularity == "layer":
            values = np.tile(layer_eigenvalues(block, gamma=gamma), (block.n_heads, 1))
        else:
            values = np.stack(
                [head_eigenvalues(block, h, gamma=gamma) for h in range(block.n_heads)]
            )
            if block.d_model > block.d_head:  # the d×d product also has the eigenvalue 0
                values = np.concatenate([values, np.zeros((block.n_heads, 1))], axis=1)
        spectra.append(values)
    return spectra


def _dominance_cases(
    probs: np.ndarray,
    token_mask: np.ndarray,
    eig_H: np.ndarray,
    item: int,
    layer: int,
    tie_rtol: float,
) -> list[DominanceCase]:
    """Cases for every head of one input: probs (heads, T, T), token_mask (T,), eig_H (heads, k)."""
    keep = np.flatnonzero(token_mask)
    A = probs[:, keep][:, :, keep].astype(np.float64)
    A = A / A.sum(axis=-1, keepdims=True)
    eig_A = np.linalg.eigvals(A)
    kinds = dominance_kinds(eig_A, eig_H, tie_rtol=tie_rtol)
    mu = kron_eigenvalues(eig_A, eig_H)
    cases = []
    for head in range(A.shape[0]):
        i, j = np.unravel_index(np.argmax(np.abs(mu[head])), mu[head].shape)
        cases.append(
            DominanceCase(
                item,
                layer,
                head,
                KINDS[int(kinds[head])],
                complex(mu[head, i, j]),
                complex(eig_A[head, i]),
                complex(eig_H[head, j]),
                int(keep.size),
            )
        )
    return cases


def _attention_probs(array: np.ndarray, name: str, n_heads: int) -> np.ndarray:
    if array.ndim != 4 or array.shape[1] != n_heads or array.shape[2] != array.shape[3]:
        raise InputError(
            f"attention probabilities {name!r} must have shape (batch, {n_heads}, T, T); got {array.shape}"
        )
    return array


def _measure_layers(
    outputs: dict[str, np.ndarray],
    layer_names: Sequence[str],
    inputs: Inputs,
    start: int,
    prefix: int,
    per_input: dict[str, np.ndarray],
) -> None:
    """Fill ``per_input[metric][item, layer]`` for one batch of hidden states (real tokens only)."""
    for layer, name in enumerate(layer_names):
        hidden = _hidden(outputs[name], name)
        masks = _token_masks(inputs, start, hidden.shape[0], hidden.shape[1], prefix)
        for b in range(hidden.shape[0]):
            for metric, value in all_metrics(hidden[b][masks[b]].astype(np.float64)).items():
                per_input[metric][start + b, layer] = float(value)


def _measure_dominance(
    outputs: dict[str, np.ndarray],
    blocks: Sequence[BlockWeights],
    attention: Sequence[str],
    inputs: Inputs,
    start: int,
    eig_H: Sequence[np.ndarray],
    tie_rtol: float,
) -> list[DominanceCase]:
    """Dominance cases of one batch: every (input, layer, head) with its attention matrix."""
    cases: list[DominanceCase] = []
    for layer, (block, name) in enumerate(zip(blocks, attention, strict=False)):
        probs = _attention_probs(outputs[name], name, block.n_heads)
        real = _token_masks(inputs, start, probs.shape[0], probs.shape[-1], 0)
        for b in range(probs.shape[0]):
            cases += _dominance_cases(probs[b], real[b], eig_H[layer], start + b, layer, tie_rtol)
    return cases


def _prefix_count(exclude_prefix: bool | int, entry: Any) -> int:
    if isinstance(exclude_prefix, bool):
        if not exclude_prefix:
            return 0
        return int(entry.prefix_tokens) if entry is not None else 1
    if not isinstance(exclude_prefix, int | np.integer) or exclude_prefix < 0:
        raise InputError(
            f"`exclude_prefix` must be a bool or a non-negative integer; got {exclude_prefix!r}"
        )
    return int(exclude_prefix)


def audit(
    model: str | Path,
    inputs: Inputs | None = None,
    *,
    provider: Literal["auto", "cpu", "cuda"] = "auto",
    batch_size: int = 4,
    exclude_prefix: bool | int = False,
    dominance: Granularity = "head",
    fold_gamma: bool = False,
    tie_rtol: float = TIE_RTOL,
    progress: bool = False,
) -> AuditResult:
    """Audit a model: per-layer smoothing of real inputs, dominating eigenvalues, value spectra.

    Parameters
    ----------
    model : str or path
        An ONNX file or a zoo name (``oversmooth models``); zoo models are fetched on first use.
    inputs : Inputs, optional
        Default: the bundled photographs (image models) or sentences (text models).
    provider : {"auto", "cpu", "cuda"}
        onnxruntime execution provider; ``"cuda"`` fails unless the session really runs on CUDA.
    batch_size : int
        Inputs per onnxruntime call (bounds memory).
    exclude_prefix : bool or int
        Leave prefix tokens out of the metrics: True uses the zoo's count (CLS = 1), an int counts.
    dominance : {"head", "layer", "none"}
        H granularity of the dominance table, or skip it (no attention tensors fetched).
    fold_gamma : bool
        Fold the pre-LN γ into H for the dominance table.
    tie_rtol : float
        Relative tolerance for ties of |μ|.
    progress : bool
        Show a progress bar (stderr).

    Returns
    -------
    AuditResult
    """
    check_choice(dominance, "dominance", ("head", "layer", "none"))
    batch_size = check_positive_int(batch_size, "batch_size")
    path = resolve_model(model)
    entry = _zoo_entry(model)
    prefix = _prefix_count(exclude_prefix, entry)
    graph = load_model(path)
    report = find_attention_blocks(graph)
    blocks = [block_weights(graph, block) for block in report.blocks]
    fed = {spec.name for spec in graph_inputs(graph.proto)}  # e.g. a model that reads embeddings
    del graph
    notes: list[str] = []
    inputs = default_inputs(path, entry) if inputs is None else inputs
    if inputs.random:
        notes.append(
            "inputs are RANDOM, not real data: smoothing of noise says little about the model"
        )
    layer_names = layer_tensors(blocks, notes)
    attention = [b.attention_name for b in blocks] if dominance != "none" else []
    exposed = [name for name in dict.fromkeys(layer_names + attention) if name not in fed]
    runner = Runner(path, expose=exposed, provider=provider)
    eig_H = _value_spectra(blocks, dominance, fold_gamma) if dominance != "none" else []
    per_input = {name: np.full((inputs.batch_size, len(layer_names)), np.nan) for name in METRICS}
    cases: list[DominanceCase] = []
    start = 0
    for outputs in runner.run(inputs, batch_size=batch_size, progress=progress):
        batch = next(iter(outputs.values())).shape[0]
        for name in fed.intersection(layer_names):
            outputs[name] = np.asarray(inputs.feeds[name][start : start + batch])
        # Many small SVD and eigenvalue problems: one BLAS thread each is fastest, and it avoids
        # the collapse of multithreaded BLAS on a busy machine (5-20x measured on 2 cores).
        with threadpool_limits(limits=1, user_api="blas"):
            _measure_layers(outputs, layer_names, inputs, start, prefix, per_input)
            cases += _measure_dominance(outputs, blocks, attention, inputs, start, eig_H, tie_rtol)
        start += batch
    return AuditResult(
        model={
            "name": entry.name if entry else path.stem,
            "path": str(path),
            "sha256": file_sha256(path),
            "n_blocks": len(blocks),
        },
        inputs={
            "source": inputs.source,
            "digest": inputs.digest,
            "n_inputs": inputs.batch_size,
            "random": inputs.random,
            "labels": list(inputs.labels),
        },
        provider={
            "requested": provider,
            "used": runner.provider_used,
            "note": runner.provider_note,
        },
        blocks=blocks,
        metrics=per_input,
        dominance=cases,
        spectra=model_spectra(blocks),
        config={
            "batch_size": batch_size,
            "exclude_prefix": prefix,
            "dominance": dominance,
            "fold_gamma": fold_gamma,
            "tie_rtol": tie_rtol,
            "metrics": list(METRICS),
        },
        provenance={
            "python": platform.python_version(),
            "versions": package_versions(_PACKAGES),
            "runner": runner.provenance(),
            "inputs_digest": inputs.digest,
        },
        notes=notes,
    )


# ------------------------------------------------------------------------------------------------
# The Markdown report
# ------------------------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "—"
    return f"{value:.3g}"


def render_report(result: AuditResult, figures: Sequence[tuple[str, str]] = ()) -> str:
    """The ``report.md`` text: what was run, per-layer smoothing, dominance, spectra, provenance."""
    doc = result.to_json()
    dom = doc["dominance"]
    lines = [
        f"# Oversmoothing audit: {result.model['name']}",
        "",
        f"- model file: `{Path(result.model['path']).name}` (sha256 `{result.model['sha256']}`), "
        f"{result.model['n_blocks']} attention blocks",
        f"- onnxruntime provider: {', '.join(result.provider['used'])} ({result.provider['note']})",
        f"- inputs: {result.inputs['n_inputs']} from `{result.inputs['source']}`"
        + (" — **RANDOM inputs, not real data**" if result.inputs["random"] else ""),
        f"- input digest: `{result.inputs['digest']}`",
    ]
    lines += [f"- note: {note}" for note in result.notes]
    lines += [
        "",
        "## Smoothing per layer (mean ± std over inputs)",
        "",
        "Layer 0 is the residual stream entering the first block; layer i is block i-1's output. "
        "HFC/LFC → 0, cosine → 1 and σ2/σ1 → 0 mean smoothing (Definitions 1–3).",
        "",
    ]
    names = ("hfc_lfc", "cosine", "sigma_ratio", "dong_residual", "effective_rank")
    lines.append("| layer | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    rows = {(r["layer"], r["metric"]): r for r in result.layer_rows()}
    for layer in range(result.n_layers):
        cells = [f"{_fmt(rows[layer, n]['mean'])} ± {_fmt(rows[layer, n]['std'])}" for n in names]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines += ["", "## Dominating eigenvalue of I + H⊗A (Table 1)", ""]
    if dom["cases"]:
        lines += [
            f"Over {dom['cases']} (input, layer, head) cases: **{100 * dom['perron']:.2f}% perron-type** "
            f"(1 + λ^H λ^A_n, smoothing) and **{100 * dom['non_perron']:.2f}% non-perron** "
            f"(of which {100 * dom['balanced']:.2f}% balanced ties).",
            "",
            "Per block: the theory predicts smoothing when most cases are perron-type; the block "
            "smooths when it lowers HFC/LFC and raises the mean cosine (both ways round: no "
            "smoothing; otherwise mixed). The theory is for repeated linear layers, so read the "
            "agreement as a heuristic.",
            "",
            "| attention block | cases | perron | non-perron | HFC/LFC ×| Δ cosine | predicted | observed |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['layer']} | {r['cases']} | {100 * r['perron']:.1f}% | {100 * r['non_perron']:.1f}% "
            f"| {_fmt(r['hfc_lfc_ratio'])} | {r['cosine_change']:+.3f} | {r['predicted']} | {r['observed']} |"
            for r in dom["per_layer"]
        ]
        decided = [r for r in dom["per_layer"] if r["agree"] is not None]
        agreed = sum(bool(r["agree"]) for r in decided)
        lines += [
            "",
            f"Prediction and observation agree in {agreed} of {len(decided)} blocks with a clear "
            f"observed direction ({len(dom['per_layer']) - len(decided)} mixed).",
        ]
    else:
        lines.append("Not computed (dominance disabled).")
    lines += [
        "",
        "## Eigenvalues of W_V W_O (Fig. 5)",
        "",
        "| kind | count | negative real part | skewness | spectral radius |",
        "|---|---|---|---|---|",
    ]
    for kind, s in doc["spectra"].items():
        lines.append(
            f"| {kind} | {s['count']} | {100 * s['negative_fraction']:.1f}% | {_fmt(s['skewness'])} | "
            f"{_fmt(s['spectral_radius'])} |"
        )
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{title}]({name})" for title, name in figures]
    lines += [
        "",
        "## Files",
        "",
        "- `audit.json`: everything below in one document (model, provider, blocks, dominance, spectra summary, provenance)",
        "- `layers.csv`: `layer,metric,mean,std,n` per layer and metric",
        "- `dominance.csv`: one row per (input, layer, head): kind, dominating μ, its λ^A and λ^H",
        "- `spectra.csv`: `layer,head,kind,real,imag` eigenvalues (head −1 = whole layer)",
        "",
        "## Provenance",
        "",
        "```json",
        json.dumps(result.provenance, indent=2, default=_json_default),
        "```",
        "",
    ]
    return "\n".join(lines)
