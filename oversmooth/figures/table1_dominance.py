"""Table 1: which eigenvalue of I + H⊗A dominates in real models, Perron type or not (% of cases).

Claim (docs/theory.md §6.2, poster Table 1; S5, S6): counting, over (input, block, head), whether the
dominating |1 + λ^H λ^A| uses the Perron root of the real attention matrix A (1 + λ^H_j λ^A_n,
smoothing) or another eigenvalue (1 + λ^H_j λ^A_1, non-Perron), random init gives 100% Perron type,
trained vision models a mix (ViT-B/16 70.27%, DeiT-B/16 57.82%, ViT-Ti 98.92%), ViT-Ti⁺ 100% and
ViT-Ti⁻ 0%. Here: the zoo models (DINOv2 ViT-S/14, MiniLM-L6, MiniLM-L3) as trained, after random
init, and after the post-hoc ± reparameterisation (no retraining), on the bundled inputs, H per head
(oversmooth.importers.audit.pipeline, ``dominance="head"``), with two H protocols side by side: ``effective`` (every
linear factor between the stream and the branch's contribution: pre-LayerNorm centring and γ,
W_V^h W_O^h, LayerScale; the operator the model applies, docs/theory.md §6.8) and ``stored`` (W_V^h W_O^h
as the checkpoint stores it, the paper's protocol). Post-LN MiniLM folds nothing, so its two protocols
are one row. The ± transforms set the spectrum of the effective product (importers.transform), so the
± rows under ``effective`` and ``both`` hold by construction: a plumbing check, not evidence; under
``stored`` they show what the stored product of the same weights says. The paper's numbers stand beside ours for
reference only: its models, data and training differ from ours.
Also writes ``table1_dominance.md`` (a Markdown table).

Run: ``python -m oversmooth.figures.table1_dominance [--quick] --out DIR``.

CSV columns: ``source,model,transform,h,unit,block,n_inputs,cases,perron_pct,perron_lo,perron_hi,
non_perron_pct,balanced_pct,contracting_pct,smoothing_pct,agreement_pct,agreement_expected_pct,
agreement_p,counterpart``: ``source`` is ``ours`` or ``paper``; ``h`` the H protocol (``effective``,
``stored``, or ``both`` where they coincide); ``block`` is ``all`` or an attention block (ours
only); ``unit`` is ``head`` (cases per (input, block, head)), ``operator`` (per (input, block), the
block's whole operator, on the first inputs only, with ``agreement_pct`` against the per-head rule
and, on the overall row, its chance level as below)
or ``operating`` (per (input, block), the block frozen at each input's own normalisation, on the same
inputs: ``smoothing_pct`` the cases where repeating it lowers the input's HFC/LFC, with
``agreement_pct`` against the operator row's cases (perron-type: smoothing),
``agreement_expected_pct`` what shuffling one side gives and ``agreement_p`` the exact chance of at
least as many agreements);
``perron_lo``/``perron_hi`` a 95 % bootstrap interval over inputs (cases of one input are not
independent); ``contracting_pct`` the cases whose head's H alone rules out Perron type (a null-space
eigenvalue 0 and no other ``|1 + λ^H|`` above 1: docs/theory.md §6.10), apart from non-Perron ones, so
perron, non-perron and contracting add up to 100; ``counterpart`` names the paper column closest to
one of our rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.figures import _models
from oversmooth.figures._common import new_figure, parser, run_script
from oversmooth.figures.audit_report import plot_dominance
from oversmooth.importers.audit.cases import Agreement
from oversmooth.simulator.output import atomic_output
from oversmooth.simulator.theory import KINDS

NAME = "table1_dominance"
PERRON = KINDS.index("perron")
#: Our rows: (variant key, H protocol), in table order; ``both`` where nothing is folded (post-LN
#: MiniLM: the effective H is the stored one, one audit serves both).
OURS = (
    ("dinov2-vits14:random-init", "effective"),
    ("dinov2-vits14", "stored"),
    ("dinov2-vits14", "effective"),
    ("dinov2-vits14:plus", "stored"),
    ("dinov2-vits14:plus", "effective"),
    ("dinov2-vits14:minus", "stored"),
    ("dinov2-vits14:minus", "effective"),
    ("minilm-l3:random-init", "both"),
    ("minilm-l6-int8", "both"),
    ("minilm-l3", "both"),
    ("minilm-l3:plus", "both"),
    ("minilm-l3:minus", "both"),
)
#: The trained models whose whole-operator dominance is counted too (effective H), and on how
#: many of their first inputs (quick runs: 1): the operator costs a few hundred applications of a
#: block's operator per (input, block).
OPERATOR_ROWS = ("dinov2-vits14", "minilm-l6-int8", "minilm-l3")
OPERATOR_INPUTS = 2
#: Bootstrap resamples of the inputs for the intervals, and their seed.
BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0
#: The poster's Table 1: (model, transform, perron %, non-perron %).
PAPER = (
    ("ViT-B/16 (random init)", "random-init", 100.0, 0.0),
    ("ViT-B/16 (ImageNet)", "trained", 70.27, 29.73),
    ("DeiT-B/16 (ImageNet)", "trained", 57.82, 42.18),
    ("ViT-Ti (CIFAR100)", "trained", 98.92, 1.08),
    ("ViT-Ti⁺ (CIFAR100)", "plus", 100.0, 0.0),
    ("ViT-Ti⁻ (CIFAR100)", "minus", 0.0, 100.0),
)
#: The paper column beside each of our transforms (trained vision models only for "trained").
COUNTERPART = {
    ("vision", "trained"): "ViT-B/16 (ImageNet)",
    ("vision", "random-init"): "ViT-B/16 (random init)",
    ("language", "random-init"): "ViT-B/16 (random init)",
    ("vision", "plus"): "ViT-Ti⁺ (CIFAR100)",
    ("language", "plus"): "ViT-Ti⁺ (CIFAR100)",
    ("vision", "minus"): "ViT-Ti⁻ (CIFAR100)",
    ("language", "minus"): "ViT-Ti⁻ (CIFAR100)",
}
#: The model whose per-block breakdown is drawn beside the table.
PER_BLOCK = "minilm-l6-int8"
COLUMNS = (
    "source",
    "model",
    "transform",
    "h",
    "unit",
    "block",
    "n_inputs",
    "cases",
    "perron_pct",
    "perron_lo",
    "perron_hi",
    "non_perron_pct",
    "balanced_pct",
    "contracting_pct",
    "smoothing_pct",
    "agreement_pct",
    "agreement_expected_pct",
    "agreement_p",
    "counterpart",
)
NOTE = (
    "Our models are not the paper's: DINOv2 ViT-S/14 (self-supervised, pre-LN with LayerScale) and "
    "two MiniLM sentence encoders (post-LN BERT) on the bundled photographs and sentences, against "
    "the paper's ViT-B/16, DeiT-B/16 and ViT-Ti trained on ImageNet / CIFAR100. Our ⁺/⁻ rows are the "
    "trained weights reparameterised post hoc (the nearest effective product C diag(γ) W_V^h W_O^h "
    "diag(s) = Q Λ Q^T, no retraining); the paper trains ViT-Ti⁺/⁻ under the constraint. The "
    "paper's numbers are shown for reference only."
)


def _ours(
    variant: _models.Variant, h: str, unit: str, n_inputs: int, counterpart: str | None = None
) -> dict[str, Any]:
    """The columns every row of ours starts with, in the table's column order."""
    return {
        "source": "ours",
        "model": variant.model,
        "transform": variant.transform,
        "h": h,
        "unit": unit,
        "n_inputs": n_inputs,
        "counterpart": counterpart,
    }


def _our_rows(key: str, h: str, quick: bool) -> list[dict[str, Any]]:
    result = _models.audited(key, quick, "stored" if h == "stored" else "effective")
    variant, summary = result.variant, result.dominance
    base = _ours(
        variant,
        h,
        "head",
        result.provenance["inputs"]["n_inputs"],
        COUNTERPART.get((variant.modality, variant.transform)),
    )
    parts = [("all", summary)] + [(str(r.block), r) for r in summary.per_block]
    intervals = _models.perron_intervals(result, BOOTSTRAP, BOOTSTRAP_SEED)
    return [
        {
            **base,
            "block": block,
            "cases": part.cases,
            "perron_pct": 100 * (part.perron or 0.0),
            "perron_lo": 100 * intervals[block][0],
            "perron_hi": 100 * intervals[block][1],
            "non_perron_pct": 100 * (part.non_perron or 0.0),
            "balanced_pct": 100 * (part.balanced or 0.0),
            "contracting_pct": 100 * (part.contracting or 0.0),
        }
        for block, part in parts
    ]


def _operator_rows(key: str, quick: bool) -> list[dict[str, Any]]:
    """The whole-operator dominance of ``key`` on its first inputs: overall and per block."""
    inputs = 1 if quick else OPERATOR_INPUTS
    summary = _models.audited(key, quick, "effective", operator_inputs=inputs).dominance.operator
    if summary is None:  # pragma: no cover - operator mode always yields cases
        return []
    base = _ours(_models.VARIANTS[key], "effective", "operator", summary.inputs)
    parts = [("all", summary.cases, summary.perron, summary.agreement)] + [
        (str(b.block), b.cases, b.perron, b.agreement) for b in summary.per_block
    ]
    rows = [
        {
            **base,
            "block": block,
            "cases": cases,
            "perron_pct": 100 * perron,
            "non_perron_pct": 100 * (1 - perron),
            "agreement_pct": 100 * agreement,
        }
        for block, cases, perron, agreement in parts
    ]
    test = summary.agreement_test
    if test is not None:  # the chance level of the overall agreement
        rows[0]["agreement_expected_pct"] = 100 * test.expected / test.decided
        rows[0]["agreement_p"] = test.p_value
    return rows


def _operating_rows(key: str, quick: bool) -> list[dict[str, Any]]:
    """The operating-point operator of ``key`` (each block frozen at each input's own
    normalisation, docs/theory.md §6.12) on the inputs of :func:`_operator_rows`, overall and per
    block: its kind, and, what a varying per-token scale leaves informative, whether repeating
    it lowers the input's HFC/LFC; and how often that agrees with the whole operator at the
    effective H (perron-type: it smooths) on the same (input, block) cases, against chance."""
    inputs = 1 if quick else OPERATOR_INPUTS
    operating = _models.audited(key, quick, "effective", inputs, frozen="operating").frozen
    operator = _models.audited(key, quick, "effective", inputs).frozen
    smooths = {(int(i), int(b)): int(v) for i, b, _, v in operator}
    n_inputs = len({int(i) for i in operating[:, 0]})
    base = _ours(_models.VARIANTS[key], "effective", "operating", n_inputs)
    parts = [("all", operating)] + [
        (str(b), operating[operating[:, 1] == b]) for b in sorted({int(b) for b in operating[:, 1]})
    ]
    return [{**base, "block": block, **_frozen_shares(cases, smooths)} for block, cases in parts]


def _frozen_shares(cases: np.ndarray, smooths: dict[tuple[int, int], int]) -> dict[str, Any]:
    """Kind shares of ``cases`` ((n, 4): input, block, kind index, smooths 1/0/−1), the share
    whose repetition smooths, and its agreement with ``smooths`` of the same (input, block)
    (undecided ones left out on either side), with the expected agreement under shuffling and its
    exact p-value."""
    kinds, own = cases[:, 2], cases[:, 3]
    pairs = [
        (smooths[int(i), int(b)] == 1, int(v) == 1)
        for i, b, _, v in cases
        if int(v) >= 0 and smooths[int(i), int(b)] >= 0
    ]
    agreement = Agreement.of_pairs(pairs)
    shares = {
        "cases": len(cases),
        "perron_pct": 100 * float(np.mean(kinds == PERRON)),
        "non_perron_pct": 100 * float(np.mean(kinds != PERRON)),  # balanced ties included
        "balanced_pct": 100 * float(np.mean(kinds == KINDS.index("balanced"))),
        "smoothing_pct": 100 * float(np.mean(own == 1)),
    }
    if agreement is not None:
        shares["agreement_pct"] = 100 * agreement.agree / agreement.decided
        shares["agreement_expected_pct"] = 100 * agreement.expected / agreement.decided
        shares["agreement_p"] = agreement.p_value
    return shares


def _paper_rows() -> list[dict[str, Any]]:
    return [
        {
            "source": "paper",
            "model": model,
            "transform": transform,
            "block": "all",
            "perron_pct": perron,
            "non_perron_pct": non_perron,
        }
        for model, transform, perron, non_perron in PAPER
    ]


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Dominance fractions, overall and per block, for every row of :data:`OURS`; then the paper's."""
    rows = [row for key, h in OURS for row in _our_rows(key, h, quick)]
    rows += [row for key in OPERATOR_ROWS for row in _operator_rows(key, quick)]
    rows += [row for key in OPERATOR_ROWS for row in _operating_rows(key, quick)]
    config = {
        **_models.provenance(list(dict.fromkeys(key for key, _ in OURS)), quick),
        "h_protocols": {f"{key} ({h})": h for key, h in OURS},
        "bootstrap": {"resamples": BOOTSTRAP, "seed": BOOTSTRAP_SEED, "level": 0.95},
        "granularity": "head: the d_head eigenvalues of head h's H plus the zero eigenvalue",
        "operator": {
            "models": list(OPERATOR_ROWS),
            "inputs": 1 if quick else OPERATOR_INPUTS,
            "unit": "(input, block): the block's whole operator I + sum_h M_h^T (x) A_h",
        },
        "operating": {
            "models": list(OPERATOR_ROWS),
            "inputs": 1 if quick else OPERATOR_INPUTS,
            "unit": "(input, block): X -> X + sum_h A_h D X M_h, D the input's own 1/sigma "
            "(pre-LN), 1/rms (pre-RMSNorm) or I (post-LN, no norm)",
            "smoothing": "repeating the frozen sublayer lowers the input's HFC/LFC (every limit "
            "state below it)",
            "agreement": "of smoothing with the operator row's perron-type on the same (input, "
            "block), undecided ones left out; expected: the mean agreement when one side is "
            "shuffled (margins fixed), p: the exact chance of at least as many agreements",
        },
        "paper": "poster Table 1 (docs/theory.md §6.2)",
        "note": NOTE,
    }
    for key, h in OURS:
        if h == "stored":
            stored = _models.audited(key, quick, "stored")
            config["variants"][f"{key} (stored H)"] = stored.provenance
    return rows + _paper_rows(), config


def _label(row: dict[str, Any]) -> str:
    if row["source"] == "paper":
        return f"paper: {row['model']}"
    key = row["model"] if row["transform"] == "trained" else f"{row['model']}:{row['transform']}"
    suffix = {"stored": ", stored H", "effective": ", effective H"}.get(row["h"], "")
    return _models.VARIANTS[key].label + suffix


def _plot_totals(ax: Any, totals: list[dict[str, Any]]) -> None:
    y = np.arange(len(totals))[::-1]
    perron = np.array([row["perron_pct"] for row in totals])
    contracting = np.array([row.get("contracting_pct") or 0.0 for row in totals])
    hatch = ["//" if row["source"] == "paper" else None for row in totals]
    ax.barh(y, perron, color="#D55E00", hatch=hatch, edgecolor="white", label="perron type")
    non_perron = 100 - perron - contracting
    ax.barh(y, non_perron, left=perron, color="#0072B2", hatch=hatch, edgecolor="white")
    ax.barh(y, contracting, left=perron + non_perron, color="#BBBBBB", edgecolor="white")
    ax.set_yticks(y, [_label(row) for row in totals])
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of cases: perron (orange), non-perron (blue), contracting (grey)")
    ax.set_title("ours (solid) and the paper's Table 1 (hatched, other models)")
    ax.grid(False, axis="y")


def plot(rows: list[dict[str, Any]]):
    """Stacked bars of every row's overall split; per-block bars of :data:`PER_BLOCK`."""
    fig, (left, right) = new_figure("full", 0.5, ncols=2, width_ratios=(2.2, 1))
    per_head = [row for row in rows if row.get("unit") not in ("operator", "operating")]
    _plot_totals(left, _models.rows_of(per_head, block="all"))
    per_block = [
        row
        for row in _models.rows_of(per_head, source="ours", model=PER_BLOCK, transform="trained")
        if row["block"] != "all"
    ]
    plot_dominance(
        right,
        [int(row["block"]) for row in per_block],
        [row["perron_pct"] / 100 for row in per_block],
        [row["contracting_pct"] / 100 for row in per_block],
        legend=False,  # the colours are the left panel's, named in its axis label
    )
    right.set_title(f"{_models.VARIANTS[PER_BLOCK].label}\nper attention block")
    return fig


def _pct(value: Any) -> str:
    return "—" if value is None else f"{value:.2f}%"


def _p(value: Any) -> str:
    return "—" if value is None else f"{value:.3g}"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: our overall rows with the paper's counterpart beside, then the paper's."""
    paper = {row["model"]: row for row in rows if row["source"] == "paper"}
    lines = [
        "# Table 1: dominating eigenvalue of I + H⊗A",
        "",
        "Percentage of (input, block, head) cases whose dominating eigenvalue is of Perron type, "
        "1 + λ^H_j λ^A_n (smoothing), or not, 1 + λ^H_j λ^A_1 (balanced ties count as non-Perron); "
        "contracting: heads whose H alone rules out Perron type (a null-space eigenvalue 0 ties "
        "every row at |μ| = 1 and no other |1 + λ^H| exceeds it), decided without A and counted "
        "apart (they were non-Perron or ties decided by round-off before).",
        "",
        f"**{NOTE}**",
        "",
        "H: `effective` = every linear factor between the stream and the branch's contribution "
        "(pre-LayerNorm centring and γ, W_V^h W_O^h, LayerScale), the operator the model applies; "
        "`stored` = W_V^h W_O^h as the checkpoint stores it (the paper's protocol); `both` where "
        "nothing is folded. The ⁺/⁻ transforms set the effective product's spectrum, so the ⁺/⁻ "
        "rows under `effective` and `both` hold by construction: a plumbing check, not evidence "
        "(the informative ⁺/⁻ comparison is the observed smoothing, Fig. 3). Intervals: 95 % "
        "bootstrap over inputs.",
        "",
        "| model (ours) | transform | H | inputs | cases | Perron type [95 % CI] | non-Perron "
        "| contracting | paper's counterpart (other model) | paper: Perron | paper: non-Perron |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["source"] != "ours" or row["block"] != "all" or row["unit"] != "head":
            continue
        ref = paper.get(row["counterpart"] or "")
        lines.append(
            f"| {row['model']} | {row['transform']} | {row['h']} "
            f"| {row['n_inputs']} | {row['cases']} | {_pct(row['perron_pct'])} "
            f"[{row['perron_lo']:.1f}, {row['perron_hi']:.1f}] "
            f"| {_pct(row['non_perron_pct'])} | {_pct(row['contracting_pct'])} "
            f"| {row['counterpart'] or '—'} "
            f"| {_pct(ref and ref['perron_pct'])} | {_pct(ref and ref['non_perron_pct'])} |"
        )
    lines += [
        "",
        "The whole operator of each block, I + Σ_h M_hᵀ ⊗ A_h (effective H), on the first inputs: "
        "perron-type when its low-frequency eigenvalues 1 + eig(Σ_h M_h) dominate; agreement: the "
        "share of (input, block) cases where the per-head rule (a block is perron-type when at "
        "least half its heads are) says the same, beside what shuffling one side would give and "
        "the exact chance of at least as many.",
        "",
        "| model | inputs | (input, block) cases | operator: Perron type | agreement with the "
        "per-head rule | expected by chance | p |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['model']} | {row['n_inputs']} | {row['cases']} | {_pct(row['perron_pct'])} "
        f"| {_pct(row['agreement_pct'])} | {_pct(row.get('agreement_expected_pct'))} "
        f"| {_p(row.get('agreement_p'))} |"
        for row in rows
        if row.get("unit") == "operator" and row["block"] == "all"
    ]
    lines += [
        "",
        "The operating point of each block, X ↦ X + Σ_h A_h D X M_h with D the input's own per-token "
        "scale of the pre-norm (1/σ; I for post-LN), on the same inputs (docs/theory.md §6.12). "
        "Perron type needs its dominating eigenvector inside the low-frequency subspace, which a "
        "varying D leaves only by accident, so the informative column is the next: the cases where "
        "repeating the frozen sublayer lowers the input's HFC/LFC. Agreement: of that with the "
        "whole operator above (perron-type: it smooths) on the same (input, block) cases, "
        "undecided ones left out, beside what shuffling one side would give and the exact chance "
        "of at least as many.",
        "",
        "| model | inputs | (input, block) cases | operating point: Perron type | repeating it "
        "smooths | agreement with the operator | expected by chance | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['model']} | {row['n_inputs']} | {row['cases']} | {_pct(row['perron_pct'])} "
        f"| {_pct(row['smoothing_pct'])} | {_pct(row.get('agreement_pct'))} "
        f"| {_pct(row.get('agreement_expected_pct'))} | {_p(row.get('agreement_p'))} |"
        for row in rows
        if row.get("unit") == "operating" and row["block"] == "all"
    ]
    lines += [
        "",
        "The paper's Table 1 (poster), for reference:",
        "",
        "| model (paper) | Perron type | non-Perron |",
        "|---|---|---|",
    ]
    lines += [
        f"| {row['model']} | {_pct(row['perron_pct'])} | {_pct(row['non_perron_pct'])} |"
        for row in paper.values()
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the table (PNG, CSV, JSON), then write ``table1_dominance.md``."""
    kept: list[list[dict[str, Any]]] = []

    def compute_and_keep(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rows, config = compute(quick)
        kept.append(rows)
        return rows, config

    code = run_script(NAME, __doc__, compute_and_keep, plot, COLUMNS, argv)
    out: Path = parser(NAME, __doc__).parse_args(argv).out
    with atomic_output(out / f"{NAME}.md") as handle:
        handle.write(markdown(kept[0]))
    print(f"{NAME}: wrote {out / f'{NAME}.md'}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
