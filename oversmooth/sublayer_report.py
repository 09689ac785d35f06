"""The attribution's and the operating point's files and ``report.md`` sections.

Public API
----------
ATTRIBUTION_FILE, OPERATING_FILE
    ``attribution.csv`` (whenever the audit attributed) and ``operating.csv``
    (``--dominance operating``).
write_sublayer_files
    Write whichever of the two the result has.
sublayer_sections
    The report's sections: predicted against observed, block by block, and the operating point.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oversmooth.importers.audit.operating_step import ATTRIBUTION_COLUMNS, OPERATING_COLUMNS
from oversmooth.importers.audit.records import AuditResult, BlockVerdict
from oversmooth.importers.audit.sublayer_summary import (
    OTHER_PARTS,
    attribution_blocks,
    operating_blocks,
)
from oversmooth.simulator.output import write_tidy_csv

__all__ = ["ATTRIBUTION_FILE", "OPERATING_FILE", "sublayer_sections", "write_sublayer_files"]

ATTRIBUTION_FILE = "attribution.csv"
OPERATING_FILE = "operating.csv"


def write_sublayer_files(result: AuditResult, folder: Path) -> list[Path]:
    """Write ``attribution.csv`` and ``operating.csv`` where the result has their cases."""
    paths = []
    if result.attribution:
        paths.append(folder / ATTRIBUTION_FILE)
        write_tidy_csv(paths[-1], ATTRIBUTION_COLUMNS, (case.row() for case in result.attribution))
    if result.operating:
        paths.append(folder / OPERATING_FILE)
        write_tidy_csv(paths[-1], OPERATING_COLUMNS, (case.row() for case in result.operating))
    return paths


def _signed(value: float) -> str:
    return f"{value:+.3f}" if np.isfinite(value) else "—"


def _direction(delta: float) -> str:
    return "lowers" if delta < 0 else ("raises" if delta > 0 else "keeps")


def _because(row: dict, observed: float, linear: float) -> str:
    """Why the attention sublayer moved HFC/LFC the way it did: of the effective-H operator and
    the parts the theory leaves out (the per-token scale, the bias row, a post-LN norm), the one
    that moved it most in the observed direction, with every part listed."""
    parts = {"linear": linear} | {  # the reconstruction residual (~1e-7) explains nothing
        name: row["parts"][name]["delta_hfc_lfc"]
        for name in OTHER_PARTS
        if name != "reconstruction"
        and row["parts"][name]["delta_hfc_lfc"] not in (0.0,)
        and np.isfinite(row["parts"][name]["delta_hfc_lfc"])
    }
    listed = ", ".join(f"{name} {_signed(value)}" for name, value in parts.items())
    along = {name: value for name, value in parts.items() if np.sign(value) == np.sign(observed)}
    if not along or not np.isfinite(observed):
        return f"against every part's sign: their interaction ({listed})"
    part = max(along, key=lambda name: abs(along[name]))
    if part == "linear":
        return f"mostly through the effective-H operator, the part the theory covers ({listed})"
    return f"mostly because of the {part} {_signed(along[part])}, outside the theory ({listed})"


def _sentence(row: dict, verdict: BlockVerdict | None) -> str:
    """'predicted X, observed Y, because of Z' for one block."""
    linear = row["parts"]["linear"]["delta_hfc_lfc"]
    observed = row["attention_hfc_lfc"]
    predicted = verdict.predicted if verdict is not None else "—"
    return (
        f"- block {row['block']}: predicted **{predicted}** (per-head rule, effective H); the "
        f"effective-H operator alone {_direction(linear)} HFC/LFC ({_signed(linear)}); the "
        f"attention sublayer {_direction(observed)} it ({_signed(observed)}), "
        f"{_because(row, observed, linear)}; the MLP {_signed(row['parts']['mlp']['delta_hfc_lfc'])}."
    )


def _attribution_lines(result: AuditResult, verdicts: Sequence[BlockVerdict]) -> list[str]:
    rows = attribution_blocks(result.attribution)
    by_block = {v.block: v for v in verdicts}
    inputs = max(row["inputs"] for row in rows)
    lines = [
        "",
        "## What moved HFC/LFC: attribution (docs/theory.md §6.12)",
        "",
        f"On the first {inputs} input(s), each block's attention sublayer is rebuilt on the same X "
        "and the same A with parts removed: **linear** is X + Σ_h A_h X M_h with the effective H "
        "(the part the theory covers), **scale** the pre-norm's per-token 1/σ (D), **bias** the "
        "bias row c (Shapley split over D and c, the linear operator the base; the sequential "
        "split linear → scale → bias is in `attribution.csv`), **norm** a post-LN norm, "
        "**residual** the graph's sublayer tensor minus the rebuilt one (its relative size in the "
        "last column), **MLP** the rest of the block. Means over the inputs of the change of "
        "HFC/LFC (not ratios); the parts sum to the block's change.",
        "",
        "| block | predicted | linear | scale | bias | norm | residual | attention sublayer "
        "| MLP | Δ cosine: linear | Δ cosine: sublayer | rel. residual |",
        "|---" * 12 + "|",
    ]
    for row in rows:
        parts = row["parts"]
        verdict = by_block.get(row["block"])
        cells = [
            str(row["block"]),
            verdict.predicted if verdict is not None else "—",
            *(_signed(parts[p]["delta_hfc_lfc"]) for p in ("linear", *OTHER_PARTS)),
            _signed(row["attention_hfc_lfc"]),
            _signed(parts["mlp"]["delta_hfc_lfc"]),
            _signed(parts["linear"]["delta_cosine"]),
            _signed(row["attention_cosine"]),
            f"{row['reconstruction_residual']:.1e}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Block by block:", ""]
    lines += [_sentence(row, by_block.get(row["block"])) for row in rows]
    return lines


def _operating_lines(result: AuditResult, verdicts: Sequence[BlockVerdict]) -> list[str]:
    rows = operating_blocks(result.operating)
    by_block = {v.block: v for v in verdicts}
    lines = [
        "",
        "### The operating point: the sublayer frozen at each input's norm (docs/theory.md §6.12)",
        "",
        "T_D(X) = X + Σ_h A_h D X M_h with D the pre-norm's per-token 1/σ of that input (I for "
        "post-LN blocks). A D that varies over the tokens leaves the low-frequency subspace "
        "non-invariant, so **perron** (the dominating eigenvector inside it: repetition drives "
        "HFC/LFC to 0) becomes the exception; the graded answer is the limit, the HFC/LFC of the "
        "dominating eigenvector that repetition reaches, against the input's own HFC/LFC "
        "(**smoothing**: below it). Beside it, the per-head verdict of the effective H, unchanged.",
        "",
        "| block | D | mean 1/σ | perron | non-perron | balanced | smoothing | no smoothing "
        "| limit HFC/LFC | input HFC/LFC | per-head verdict (effective H) |",
        "|---" * 11 + "|",
    ]
    for row in rows:
        verdict = by_block.get(row["block"])
        lines.append(
            f"| {row['block']} | {row['scale']} | {row['mean_inverse_scale']:.3g} "
            f"| {100 * row['perron']:.0f}% | {100 * row['non_perron']:.0f}% "
            f"| {100 * row['balanced']:.0f}% | {100 * row['smoothing']:.0f}% "
            f"| {100 * row['no_smoothing']:.0f}% | {row['limit_hfc_lfc']:.3g} "
            f"| {row['input_hfc_lfc']:.3g} | {verdict.predicted if verdict else '—'} |"
        )
    return lines


def sublayer_sections(result: AuditResult, verdicts: Sequence[BlockVerdict]) -> list[str]:
    """The report's attribution section and, with ``--dominance operating``, the operating
    point's; ``verdicts`` are the per-block verdicts of the dominance summary."""
    lines = _attribution_lines(result, verdicts) if result.attribution else []
    return lines + (_operating_lines(result, verdicts) if result.operating else [])
