"""Tables 2–3 at laptop scale: data efficiency and corruption robustness of ViT, ViT⁺ and ViT⁻.

Reads the results folder of ``oversmooth train`` (``results.csv``; nothing is trained here and
torch is not imported) and writes, over seeds, the mean ± standard deviation (ddof 1) of the test
accuracy (%) and the paired differences ViT⁺ − ViT and ViT⁻ − ViT (same seed: same training subset,
initial batches and corrupted test set) with the two-sided paired t-test's p-value
(``scipy.stats.ttest_rel``; empty with fewer than two seeds or no spread).

- Table 2 (``table`` = 2): clean accuracy per training fraction.
- Table 3 (``table`` = 3): accuracy per corruption severity 0–5 at the largest fraction trained,
  per corruption (``gaussian_noise``, ``gaussian_blur``) and their per-seed ``mean`` (the paper
  averages CIFAR-100-C's corruption types); severity 0 is the clean accuracy.

**Not the paper's setting**: ours are small ViTs on sklearn's 8×8 digits (or the user's ``.npz``)
with two synthetic corruptions; the paper's are ViT-Ti on CIFAR-100 and CIFAR-100-C. The paper's
numbers stand beside ours (``source`` = ``paper``) for reference only.

Not run by ``python -m oversmooth.figures`` unless named (``--only table23_training``): it needs a
results folder, which takes minutes of training to make.

Run: ``python -m oversmooth.figures.table23_training --results DIR --out DIR``.

CSV columns: ``source,table,variant,fraction,corruption,severity,n_seeds,mean,std,diff_mean,
diff_std,p_value``: accuracies and differences in percentage points; ``diff_*`` and ``p_value``
against the standard model (empty on its own rows and on the paper's).
Also writes ``table23_training.md`` (Markdown tables).
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.figures._common import new_figure, parser, provenance, save_outputs
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.output import atomic_output

NAME = "table23_training"
COLUMNS = (
    "source",
    "table",
    "variant",
    "fraction",
    "corruption",
    "severity",
    "n_seeds",
    "mean",
    "std",
    "diff_mean",
    "diff_std",
    "p_value",
)
VARIANTS = ("standard", "plus", "minus")
LABELS = {"standard": "ViT", "plus": "ViT⁺", "minus": "ViT⁻"}
PAPER_LABELS = {"standard": "ViT-Ti", "plus": "ViT-Ti⁺", "minus": "ViT-Ti⁻"}
#: The paper's Table 2 (ViT-Ti on CIFAR-100; fraction → (mean, std) per variant).
PAPER_TABLE2 = {
    "standard": {1.0: (66.78, 0.1), 0.5: (56.38, 0.5), 0.1: (32.47, 0.9)},
    "plus": {1.0: (64.34, 0.3), 0.5: (55.21, 0.5), 0.1: (28.67, 0.5)},
    "minus": {1.0: (66.62, 0.3), 0.5: (56.58, 0.3), 0.1: (33.99, 0.4)},
}
#: The paper's Table 3 (CIFAR-100-C, severities 0–5).
PAPER_TABLE3 = {
    "standard": (
        (66.78, 0.1),
        (61.59, 0.2),
        (57.75, 0.2),
        (53.12, 0.1),
        (49.32, 0.1),
        (39.17, 0.2),
    ),
    "plus": ((64.34, 0.3), (58.36, 0.4), (53.83, 0.5), (49.03, 0.6), (45.15, 0.6), (35.86, 0.6)),
    "minus": ((66.62, 0.3), (61.62, 0.2), (58.00, 0.3), (53.56, 0.2), (49.70, 0.3), (40.07, 0.2)),
}
CAVEAT = (
    "Laptop scale, not the paper's: small ViTs on sklearn's 8×8 digits (or the given .npz) with "
    "synthetic Gaussian noise and blur, not ViT-Ti on CIFAR-100/CIFAR-100-C. The paper's numbers "
    "are listed for reference only."
)


def read_results(folder: Path) -> dict[tuple[str, float, int, str, int], float]:
    """``results.csv`` of ``oversmooth train`` as {(variant, fraction, seed, corruption, severity):
    accuracy in %}; a missing or foreign file is one :class:`InputError` line."""
    path = Path(folder) / "results.csv"
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as err:
        raise InputError(
            f"--results: cannot read {str(path)!r} ({err.strerror or err}); make it with "
            f"`oversmooth train --out {folder}`"
        ) from None
    try:
        return {
            (
                r["variant"],
                float(r["fraction"]),
                int(r["seed"]),
                r["corruption"],
                int(r["severity"]),
            ): 100.0 * float(r["accuracy"])
            for r in rows
        }
    except (KeyError, ValueError, TypeError) as err:
        raise InputError(
            f"--results: {str(path)!r} is not a results table of oversmooth train: {err}"
        ) from None


def _stat(values: Sequence[float] | np.ndarray) -> tuple[float, float | None]:
    array = np.asarray(values, dtype=np.float64)
    return float(array.mean()), (float(array.std(ddof=1)) if array.size > 1 else None)


def _paired(ours: Mapping[int, float], base: Mapping[int, float]) -> dict[str, Any]:
    from scipy import stats

    seeds = sorted(set(ours) & set(base))
    if not seeds:
        return {"diff_mean": None, "diff_std": None, "p_value": None}
    diff = np.array([ours[s] - base[s] for s in seeds])
    mean, std = _stat(diff)
    p = None
    if diff.size > 1 and np.ptp(diff) > 0:
        p = float(stats.ttest_rel([ours[s] for s in seeds], [base[s] for s in seeds]).pvalue)
    return {"diff_mean": mean, "diff_std": std, "p_value": p}


def _row(
    table: int,
    variant: str,
    fraction: float,
    corruption: str,
    severity: int,
    by_seed: Mapping[int, float],
    base: Mapping[int, float] | None,
) -> dict[str, Any]:
    mean, std = _stat(list(by_seed.values()))
    row = {
        "source": "ours",
        "table": table,
        "variant": variant,
        "fraction": fraction,
        "corruption": corruption,
        "severity": severity,
        "n_seeds": len(by_seed),
        "mean": mean,
        "std": std,
        "diff_mean": None,
        "diff_std": None,
        "p_value": None,
    }
    if base is not None and variant != "standard":
        row.update(_paired(by_seed, base))
    return row


def table_rows(results: Mapping[tuple[str, float, int, str, int], float]) -> list[dict[str, Any]]:
    """Our Table 2 and Table 3 rows (see the module docstring), then the paper's."""
    variants = [v for v in VARIANTS if any(k[0] == v for k in results)]
    fractions = sorted({k[1] for k in results}, reverse=True)
    corruptions = sorted({k[3] for k in results if k[3] != "clean"})
    seeds = sorted({k[2] for k in results})

    def by_seed(variant: str, fraction: float, corruption: str, severity: int) -> dict[int, float]:
        if corruption == "mean":
            return {
                s: float(
                    np.mean([results[(variant, fraction, s, c, severity)] for c in corruptions])
                )
                for s in seeds
                if all((variant, fraction, s, c, severity) in results for c in corruptions)
            }
        return {
            s: results[(variant, fraction, s, corruption, severity)]
            for s in seeds
            if (variant, fraction, s, corruption, severity) in results
        }

    rows = []
    for fraction in fractions:
        base = by_seed("standard", fraction, "clean", 0) if "standard" in variants else None
        for variant in variants:
            rows.append(
                _row(2, variant, fraction, "clean", 0, by_seed(variant, fraction, "clean", 0), base)
            )
    top = fractions[0] if fractions else 1.0
    for corruption in [*(["mean"] if corruptions else []), *corruptions]:
        for severity in range(6):
            keyed = "clean" if severity == 0 else corruption  # severity 0: the clean accuracy
            base = by_seed("standard", top, keyed, severity) if "standard" in variants else None
            for variant in variants:
                values = by_seed(variant, top, keyed, severity)
                if values:
                    rows.append(_row(3, variant, top, corruption, severity, values, base))
    for variant in VARIANTS:
        for fraction, (mean, std) in PAPER_TABLE2[variant].items():
            rows.append(
                {
                    "source": "paper",
                    "table": 2,
                    "variant": variant,
                    "fraction": fraction,
                    "corruption": "clean",
                    "severity": 0,
                    "n_seeds": None,
                    "mean": mean,
                    "std": std,
                }
            )
        for severity, (mean, std) in enumerate(PAPER_TABLE3[variant]):
            rows.append(
                {
                    "source": "paper",
                    "table": 3,
                    "variant": variant,
                    "fraction": 1.0,
                    "corruption": "cifar100-c",
                    "severity": severity,
                    "n_seeds": None,
                    "mean": mean,
                    "std": std,
                }
            )
    return rows


def _cell(row: Mapping[str, Any]) -> str:
    text = f"{row['mean']:.2f}" + (f" ± {row['std']:.2f}" if row.get("std") is not None else "")
    if row.get("diff_mean") is not None:
        spread = f" ± {row['diff_std']:.2f}" if row.get("diff_std") is not None else ""
        p = f", p = {row['p_value']:.3g}" if row.get("p_value") is not None else ""
        text += f" (Δ {row['diff_mean']:+.2f}{spread}{p})"
    return text


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The tables as Markdown: ours (Table 2, Table 3 per corruption), then the paper's."""
    ours = [r for r in rows if r["source"] == "ours"]
    paper = [r for r in rows if r["source"] == "paper"]
    lines = [f"# Tables 2–3 at laptop scale\n\n{CAVEAT}\n"]
    lines.append(
        "Accuracy % (mean ± std over seeds); Δ: paired difference to ViT (same seeds) ± std, p: paired t-test.\n"
    )
    fractions = sorted({r["fraction"] for r in ours if r["table"] == 2}, reverse=True)
    lines += [
        "## Table 2: data efficiency (ours)\n",
        "| model | " + " | ".join(f"{100 * f:g}%" for f in fractions) + " |",
        "|---" * (len(fractions) + 1) + "|",
    ]
    for variant in VARIANTS:
        cells = {
            r["fraction"]: _cell(r) for r in ours if r["table"] == 2 and r["variant"] == variant
        }
        if cells:
            lines.append(
                f"| {LABELS[variant]} | " + " | ".join(cells.get(f, "") for f in fractions) + " |"
            )
    for corruption in dict.fromkeys(
        r["corruption"] for r in ours if r["table"] == 3 and r["severity"]
    ):
        top = next(r["fraction"] for r in ours if r["table"] == 3)
        lines += [
            f"\n## Table 3: {corruption} by severity (ours, {100 * top:g}% of the data)\n",
            "| model | " + " | ".join(str(s) for s in range(6)) + " |",
            "|---" * 7 + "|",
        ]
        for variant in VARIANTS:
            cells = {
                r["severity"]: _cell(r)
                for r in ours
                if r["table"] == 3
                and r["variant"] == variant
                and (
                    r["corruption"] == corruption
                    or (r["severity"] == 0 and r["corruption"] == "clean")
                )
            }
            if cells:
                lines.append(
                    f"| {LABELS[variant]} | "
                    + " | ".join(cells.get(s, "") for s in range(6))
                    + " |"
                )
    lines += [
        "\n## The paper (ViT-Ti, CIFAR-100 / CIFAR-100-C; reference only, not comparable)\n",
        "| model | 100% | 50% | 10% | severity 1 | 2 | 3 | 4 | 5 |",
        "|---" * 9 + "|",
    ]
    for variant in VARIANTS:
        two = [_cell(r) for r in paper if r["variant"] == variant and r["table"] == 2]
        three = [
            _cell(r) for r in paper if r["variant"] == variant and r["table"] == 3 and r["severity"]
        ]
        lines.append(f"| {PAPER_LABELS[variant]} | " + " | ".join(two + three) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Left: clean accuracy by fraction; right: accuracy by severity (mean over corruptions)."""
    fig, (left, right) = new_figure("full", 0.35, ncols=2)
    ours = [r for r in rows if r["source"] == "ours"]
    for variant in VARIANTS:
        two = sorted(
            (r["fraction"], r["mean"], r["std"] or 0.0)
            for r in ours
            if r["table"] == 2 and r["variant"] == variant
        )
        three = sorted(
            (r["severity"], r["mean"], r["std"] or 0.0)
            for r in ours
            if r["table"] == 3 and r["variant"] == variant and r["corruption"] == "mean"
        )
        if two:
            x, y, e = zip(*two, strict=True)
            left.errorbar(x, y, yerr=e, marker="o", capsize=2, label=LABELS[variant])
        if three:
            x, y, e = zip(*three, strict=True)
            right.errorbar(x, y, yerr=e, marker="o", capsize=2, label=LABELS[variant])
    left.set(
        xlabel="fraction of the training set", ylabel="test accuracy (%)", title="data efficiency"
    )
    right.set(
        xlabel="severity (mean over corruptions)", ylabel="test accuracy (%)", title="robustness"
    )
    left.legend()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Read ``--results``, write the CSV, JSON, PNG and Markdown into ``--out``."""
    p = parser(NAME, __doc__)
    p.add_argument(
        "--results", type=Path, default=Path("train-out"), help="the folder of `oversmooth train`"
    )
    args = p.parse_args(argv)
    rows = table_rows(read_results(args.results))
    config = {"quick": args.quick, "results": str(args.results), "caveat": CAVEAT}
    meta = provenance(NAME, sys.argv[1:] if argv is None else list(argv), config)
    paths = save_outputs(plot(rows), rows, COLUMNS, NAME, meta, args.out)
    with atomic_output(args.out / f"{NAME}.md") as handle:
        handle.write(markdown(rows))
    print(f"{NAME}: wrote {', '.join(str(p) for p in [*paths, args.out / f'{NAME}.md'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
