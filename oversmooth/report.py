"""Writing an audit: the report folder (``audit.json``, tidy CSVs, ``report.md``) and its Markdown.

Public API
----------
save_audit
    Write the report folder atomically: every file appears together, or none does.
write_audit_files
    Write every output file into an existing folder.
render_report
    The ``report.md`` text.
REPORT_FILES
    The files every report folder holds (besides the figures).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from oversmooth.importers.audit.records import (
    DEPTH_COLUMNS,
    DOMINANCE_COLUMNS,
    HEAD_COLUMNS,
    LAYER_COLUMNS,
    OPERATOR_COLUMNS,
    Agreement,
    AuditResult,
    DepthSummary,
    DominanceSummary,
    OperatorSummary,
)
from oversmooth.importers.defaults import AUTO_EVERY, AUTO_FIRST, AUTO_WIDTH
from oversmooth.importers.value_spectra import SPECTRA_COLUMNS
from oversmooth.simulator.output import (
    atomic_directory,
    atomic_output,
    to_json,
    write_json,
    write_tidy_csv,
)
from oversmooth.sublayer_report import sublayer_sections, write_sublayer_files

__all__ = [
    "REPORT_FILES",
    "is_report_folder",
    "render_report",
    "replaceable_folder",
    "save_audit",
    "write_audit_files",
]

#: The files of a report folder, besides the PNG figures.
REPORT_FILES = (
    "audit.json",
    "layers.csv",
    "spectra.csv",
    "dominance.csv",
    "report.md",
    "attention.csv",
)
#: The operator dominance's file, written with ``dominance="operator"`` only.
OPERATOR_FILE = "operator.csv"
#: The depth step's files (docs/theory.md §6.11): one row per block, one per (block, head);
#: written whenever the result has a depth summary.
DEPTH_FILES = ("depth.csv", "heads.csv")
#: Columns of ``attention.csv``: the stream right after each block's attention sublayer.
ATTENTION_COLUMNS = ("block", "metric", "mean", "std", "n")

#: Draws the report's figures: ``(result, folder) -> [(title, file name), ...]``.
FigureMaker = Callable[[AuditResult, Path], Sequence[tuple[str, str]]]


def write_audit_files(
    result: AuditResult, folder: Path, figures: Sequence[tuple[str, str]] = ()
) -> list[Path]:
    """Write every output file into an existing ``folder`` (no atomicity; see :func:`save_audit`)."""
    paths = [folder / name for name in REPORT_FILES]
    write_json(paths[0], result)
    write_tidy_csv(paths[1], LAYER_COLUMNS, result.layer_rows())
    write_tidy_csv(
        paths[2],
        SPECTRA_COLUMNS,
        ((r.block, r.head, r.kind, r.real, r.imag) for r in result.spectra),
    )
    write_tidy_csv(paths[3], DOMINANCE_COLUMNS, (case.row() for case in result.dominance))
    write_tidy_csv(paths[5], ATTENTION_COLUMNS, result.attention_rows())
    if result.operator:  # --dominance operator only
        paths.append(folder / OPERATOR_FILE)
        write_tidy_csv(paths[-1], OPERATOR_COLUMNS, (case.row() for case in result.operator))
    if result.depth is not None:
        paths += [folder / name for name in DEPTH_FILES]
        write_tidy_csv(paths[-2], DEPTH_COLUMNS, (row.row() for row in result.depth.per_block))
        write_tidy_csv(paths[-1], HEAD_COLUMNS, (row.row() for row in result.depth.heads))
    paths += write_sublayer_files(result, folder)
    with atomic_output(paths[4]) as handle:
        handle.write(render_report(result, figures))
    return paths


def is_report_folder(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier audit report (so ``save_audit`` may replace it)."""
    return all((folder / name).is_file() for name in ("audit.json", "report.md"))


def replaceable_folder(force: bool) -> Callable[[Path], bool]:
    """Which existing non-empty folders ``save_audit`` may replace: earlier reports, or any
    folder with ``force``."""
    return (lambda _folder: True) if force else is_report_folder


def save_audit(
    result: AuditResult,
    folder: str | os.PathLike[str],
    *,
    figures: FigureMaker | None = None,
    label: str = "folder",
    force: bool = False,
) -> Path:
    """Write the report folder atomically: all files appear together or none do.

    Parameters
    ----------
    result : AuditResult
    folder : path-like
        Destination; replaced as a whole if it exists.
    figures : callable, optional
        ``figures(result, staging_folder) -> [(title, file name), ...]`` draws PNGs into the
        staging folder; the report embeds them (``oversmooth.figures.audit_report.render`` does this).
    label : str
        How error messages name the destination (the CLI passes ``"--out"``).
    force : bool
        Replace an existing non-empty folder even when it is not an earlier report.
    """
    target = Path(folder)
    with atomic_directory(target, ours=replaceable_folder(force), label=label) as staging:
        drawn = figures(result, staging) if figures is not None else ()
        write_audit_files(result, staging, drawn)
    return target


def _fmt(value: float | None, *, signed: bool = False, digits: int = 3) -> str:
    if value is None or not np.isfinite(value):
        return "—"
    return f"{value:+.3f}" if signed else f"{value:.{digits}g}"


def _causal_paragraph(result: AuditResult) -> list[str]:
    """How the dominance of causal blocks is classified (nothing when no block is causal)."""
    causal = [str(block.index) for block in result.blocks if block.causal]
    if not causal:
        return []
    return [
        "",
        f"Causal blocks ({', '.join(causal)}): A is lower-triangular, so its eigenvalues are its "
        "diagonal entries a_ii, and a_00 = 1 (the first token sees only itself). λ^A = 1 is "
        "still an eigenvalue (the rows sum to 1), but A is not positive, so the Perron–Frobenius "
        "guarantees behind the smoothing argument (a simple dominant root with a positive "
        "eigenvector) do not hold. The cases are classified by the same rule: perron-type when "
        "every dominating 1 + λ^H λ^A pairs with the λ^A = 1 of a_00; a token that attends only to "
        "itself adds another λ^A = 1, and such ties count as non-perron.",
    ]


def _agreement_sentence(dom: DominanceSummary) -> str:
    """How often predicted and observed directions agree, with the chance level beside it."""
    ties = sum(r.predicted == "tie" for r in dom.per_block)
    mixed = sum(r.observed == "mixed" and r.predicted != "tie" for r in dom.per_block)
    undecided = (
        f"{ties} predicted tie{'' if ties == 1 else 's'} and {mixed} mixed "
        f"observation{'' if mixed == 1 else 's'} left out"
    )
    found = dom.agreement
    if found is None:
        return f"No block has both a predicted and an observed direction ({undecided})."
    return (
        f"Prediction and observation agree in {found.agree} of {found.decided} blocks with both "
        f"directions ({undecided}). " + _chance_level(found, "as many smoothing as measured")
    )


def _chance_level(found: Agreement, margins: str, units: str = "blocks") -> str:
    """The chance level of an agreement count: the shuffle's mean and the exact p-value."""
    return (
        "Chance level: shuffling the observed directions among those "
        f"{units} ({margins}) gives {found.expected:.2f} agreements on average, "
        f"and {found.agree} or more with probability p = {found.p_value:.3f} (exact permutation "
        "test)" + (": no better than chance." if found.p_value > 0.05 else ".")
    )


def _growth_agreement(found: Agreement | None, what: str) -> str:
    """How often ``what`` predicts the direction of the measured HFC/LFC change per block."""
    if found is None:
        return f"No block has both a decided {what} and a measured change."
    return (
        f"The {what} predicts whether HFC/LFC grows (ratio > 1) in {found.agree} of "
        f"{found.decided} blocks. " + _chance_level(found, "as many growing as measured")
    )


def _depth_paragraph(result: AuditResult, depth: DepthSummary) -> list[str]:
    """The depth step: predicted against measured growth, the heads, the omitted terms."""
    operator = result.operator != []
    lines = [
        "",
        "## Depth: predicted against measured HFC/LFC (docs/theory.md §6.11)",
        "",
        "Per block, the theory's growth of HFC/LFC per layer is ρ_q/ρ_lfc, the spectral radius of "
        "I + H⊗A off the low-frequency subspace over the one on it; **predicted** is its "
        f"geometric mean over the block's heads on the first {depth.inputs} input(s) (each head "
        "alone, Lemma 1)"
        + (
            ", **operator** the same of the whole multi-head operator (`operator.csv`)"
            if operator
            else ""
        )
        + ", and the HFC/LFC columns are the measured layer-0 value "
        f"({_fmt(depth.start)}) times their product over depth, against the measured mean at the "
        "block's output (`layers.csv`; measured growth = HFC/LFC after the block / before it). "
        "|λ₂| is the attention's second eigenvalue modulus (mean over inputs and heads); σ/ρ is "
        "σ_max(M_h)/ρ(M_h) of the heads' H (median and largest over the block's heads; 1 for a "
        "normal M_h), asym ‖M_h − M_hᵀ‖_F/‖M_h‖_F (median; 0 symmetric, 2 skew). The effective H "
        "leaves out the pre-norm's per-token scale (mean 1/σ, multiplying every M_h token by "
        "token) and the bias row c the branch adds to every token (‖c‖/‖x̄‖ against the mean "
        "token of the block's input). Per block in `depth.csv`, per head in `heads.csv`.",
        "",
        "| block | predicted growth"
        + (" | operator growth" if operator else "")
        + " | measured growth | predicted HFC/LFC"
        + (" | operator HFC/LFC" if operator else "")
        + " | measured HFC/LFC | mean abs(λ₂) | σ/ρ median (max) | asym median "
        "| per-token scale | mean 1/σ | ‖c‖ | ‖c‖/‖x̄‖ |",
        "|---" * (12 + 2 * operator) + "|",
    ]
    heads: dict[int, list[tuple[float, float]]] = {}
    for head in depth.heads:
        heads.setdefault(head.block, []).append((head.sigma_max_over_rho, head.asymmetry))
    for row in depth.per_block:
        ratio = np.array([value for value, _ in heads.get(row.block, [])])
        asym = np.array([value for _, value in heads.get(row.block, [])])
        spread = (
            f"{_fmt(float(np.median(ratio)))} ({_fmt(float(ratio.max()))})" if ratio.size else "—"
        )
        cells = [
            str(row.block),
            _fmt(row.predicted_growth, digits=4),
            *([_fmt(row.operator_growth, digits=4)] if operator else []),
            _fmt(row.measured_growth, digits=4),
            _fmt(row.predicted_hfc_lfc),
            *([_fmt(row.operator_hfc_lfc)] if operator else []),
            _fmt(row.measured_hfc_lfc),
            _fmt(row.lambda2_mean),
            spread,
            _fmt(float(np.median(asym))) if asym.size else "—",
            row.norm_scale,
            _fmt(row.inverse_scale_mean),
            _fmt(row.bias_norm),
            _fmt(row.bias_ratio),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _growth_agreement(depth.agreement, "per-head prediction")]
    if operator:
        lines += ["", _growth_agreement(depth.operator_agreement, "operator prediction")]
    return lines


def _operator_paragraph(summary: OperatorSummary | None) -> list[str]:
    """The exact operator dominance against the per-head rule (``--dominance operator``)."""
    if summary is None:
        return []
    lines = [
        "",
        "### The whole operator of each block",
        "",
        f"On the first {summary.inputs} input(s), {summary.cases} (input, block) cases of the "
        "block's whole multi-head operator I + Σ_h M_hᵀ ⊗ A_h (`operator.csv`): "
        f"**{100 * summary.perron:.1f}% perron-type** (the low-frequency eigenvalues 1 + eig(Σ_h M_h) "
        f"dominate), {100 * summary.non_perron:.1f}% not. The per-head rule (a block is perron-type "
        f"when at least half its heads are) agrees in {100 * summary.agreement:.1f}% of them."
        + (
            " "
            + _chance_level(
                summary.agreement_test, "as many perron-type as measured on each side", "cases"
            )
            if summary.agreement_test is not None
            else ""
        ),
        "",
        "| attention block | cases | operator: perron | per-head rule: perron | agreement |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {b.block} | {b.cases} | {100 * b.perron:.0f}% | {100 * b.per_head_perron:.0f}% "
        f"| {100 * b.agreement:.0f}% |"
        for b in summary.per_block
    ]
    return lines


def _h_paragraph(result: AuditResult) -> str:
    """Which H the dominance step used, and what it folded (or could not fold) per block."""
    if result.config.h == "stored":
        return (
            "H is **W_V W_O as the checkpoint stores it** (`--h stored`, the paper's protocol); "
            "LayerScale, the pre-norm's γ and its centring are left out."
        )
    folded = sorted({name for block in result.blocks for name in block.folded()})
    omitted = sorted({name for block in result.blocks for name in block.omitted()})
    return (
        "H is the **effective** per-head product of every linear factor between the residual "
        f"stream and the attention branch's contribution (folded: {', '.join(folded) or 'none'}; "
        f"left out, not linear right factors: {', '.join(omitted) or 'none'}; per block in "
        "`audit.json` → `h`)."
    )


def render_report(result: AuditResult, figures: Sequence[tuple[str, str]] = ()) -> str:
    """The ``report.md`` text: what was run, per-layer smoothing, dominance, spectra, provenance."""
    dom = result.dominance_summary()
    model, inputs, provider = result.model, result.inputs, result.provider
    partial = [note for note in result.notes if note.kind in ("partial", "skipped")]
    lines = [
        f"# Oversmoothing audit: {model.name}",
        "",
        *[f"**{note.text}**\n" for note in partial],
        f"- model file: `{Path(model.path).name}` (sha256 `{model.sha256}`), "
        f"{model.n_blocks} attention blocks",
        f"- onnxruntime provider: {', '.join(provider.used)} ({provider.note})",
        f"- inputs: {inputs.n_inputs} from `{inputs.source}`"
        + (" — **RANDOM inputs, not real data**" if inputs.random else ""),
        f"- input digest: `{inputs.digest}`",
    ]
    lines += [f"- note: {note.text}" for note in result.notes if note not in partial]
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
    if dom.cases:
        lines += [
            f"Over {dom.cases} (input, block, head) cases: **{100 * (dom.perron or 0):.2f}% perron-type** "
            f"(1 + λ^H λ^A_n, smoothing), **{100 * (dom.non_perron or 0):.2f}% non-perron** "
            f"(of which {100 * (dom.balanced or 0):.2f}% balanced ties) and "
            f"**{100 * (dom.contracting or 0):.2f}% contracting**: heads whose H alone rules out "
            "perron kind (an exact null-space eigenvalue 0 ties every row of A at |μ| = 1, and no "
            "other |1 + λ^H| exceeds 1), decided without A's spectrum and with no mode "
            "(docs/theory.md §6.10).",
            "",
            _dominance_inputs_sentence(result),
            "",
            _h_paragraph(result),
            "",
            "Per block: the theory predicts smoothing when more than half the cases are perron-type "
            "(no smoothing when fewer, a tie at exactly half); the block "
            "smooths when it lowers HFC/LFC and raises the mean cosine (both ways round: no "
            "smoothing; otherwise mixed). The theory covers only the attention sublayer, so the "
            "observed change is that of the attention part (the stream entering the block against "
            "the stream right after its attention sublayer, `attention.csv`) where it was measured "
            "(part `attention`), else of the whole block (part `block`: parallel blocks); the MLP "
            "columns are the rest of the block. The theory is for repeated linear layers, so read "
            "the agreement as a heuristic.",
            "",
            "| attention block | part | cases | perron | non-perron | contracting | HFC/LFC ×"
            "| Δ cosine | predicted | observed | MLP: HFC/LFC × | MLP: Δ cosine |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.block} | {r.part} | {r.cases} | {100 * r.perron:.1f}% "
            f"| {100 * r.non_perron:.1f}% | {100 * r.contracting:.1f}% "
            f"| {_fmt(r.hfc_lfc_ratio)} | {r.cosine_change:+.3f} "
            f"| {r.predicted} | {r.observed} | {_fmt(r.mlp_hfc_lfc_ratio)} "
            f"| {_fmt(r.mlp_cosine_change, signed=True)} |"
            for r in dom.per_block
        ]
        lines += _causal_paragraph(result)
        lines += ["", _agreement_sentence(dom)]
        lines += _operator_paragraph(dom.operator)
        lines += sublayer_sections(result, dom.per_block)
    else:
        lines.append("Not computed (dominance disabled).")
    if result.depth is not None:
        lines += _depth_paragraph(result, result.depth)
    lines += [
        "",
        "## Eigenvalues of the value products (Fig. 5)",
        "",
        "`head`/`layer`: W_V W_O as stored; `head-effective`/`layer-effective`: the effective H "
        "(every linear factor of the attention branch folded in; `audit.json` → `h`).",
        "",
        "| kind | count | negative real part | median real part | inside abs(1+λ) < 1 "
        "| skewness | spectral radius |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, s in result.spectra_summary().items():
        lines.append(
            f"| {kind} | {s['count']} | {100 * s['negative_fraction']:.1f}% "
            f"| {_fmt(s['median_real'])} | {100 * s['inside_unit_disk']:.1f}% "
            f"| {_fmt(s['skewness'])} | {_fmt(s['spectral_radius'])} |"
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
        "- `dominance.csv`: one row per (input, block, head): kind, dominating μ, its λ^A and λ^H "
        "(`block` is the attention block; `layer` names stream positions only, as in `layers.csv`)",
        "- `attention.csv`: `block,metric,mean,std,n` of the stream right after each block's "
        "attention sublayer (before its MLP)",
        "- `operator.csv` (with `--dominance operator`): one row per (input, block): the kind of "
        "the block's whole operator, `rho_lfc`, `rho_quotient`, the dominating eigenvalue, the "
        "iterations",
        "- `spectra.csv`: `block,head,kind,real,imag` eigenvalues (head −1 = whole layer; kinds "
        "`head`/`layer` stored, `head-effective`/`layer-effective` the effective H)",
        "- `depth.csv`: one row per block: predicted (per head; operator) and measured growth of "
        "HFC/LFC and their products over depth, mean abs(λ₂), the pre-norm's mean 1/σ, ‖c‖ and "
        "‖c‖/‖x̄‖ (docs/theory.md §6.11)",
        "- `heads.csv`: one row per (block, head): σ_max/ρ and ‖M − Mᵀ‖_F/‖M‖_F of its H, "
        "mean and std of abs(λ₂(A_h)) and its growth over the depth step's inputs",
        "- `attribution.csv`: one row per (block, input, part) of the first `--operator-inputs` "
        "inputs: the change of HFC/LFC and cosine due to the linear effective-H operator, the "
        "per-token scale, the bias row, a post-LN norm, the reconstruction residual and the MLP "
        "(Shapley and sequential), and the rebuilt sublayer's relative residual",
        "- `operating.csv` (with `--dominance operating`): one row per (input, block): the "
        "operating-point operator's kind, dominating eigenvalue, HFC share and limit HFC/LFC, "
        "the input's HFC/LFC and the direction",
        "",
        "## Provenance",
        "",
        "```json",
        to_json(result.provenance),
        "```",
        "",
    ]
    return "\n".join(lines)


def _dominance_inputs_sentence(result: AuditResult) -> str:
    """How many inputs the dominance step used, why, and how precise its shares are."""
    dom = result.dominance_summary()
    n_inputs = result.inputs.n_inputs
    used = n_inputs if dom.inputs is None else dom.inputs
    rule = {
        "auto": "`--dominance-inputs auto`: the first inputs whose four shares' 95 % intervals "
        f"over inputs are all at most {100 * AUTO_WIDTH:g} points wide, looked at after "
        f"{AUTO_FIRST} inputs and every {AUTO_EVERY} after (fewer than {AUTO_FIRST}: all)",
        "all": "`--dominance-inputs all`",
    }.get(str(dom.rule), f"`--dominance-inputs {dom.rule}`")
    width = (
        "not computed"
        if dom.interval_width is None
        else f"{100 * dom.interval_width:.1f} percentage points"
    )
    return (
        f"The dominance step used the first {used} of the {n_inputs} inputs ({rule}); the widest "
        f"95 % bootstrap interval over inputs of the four shares there is {width}. The layer "
        "metrics cover every input."
    )
