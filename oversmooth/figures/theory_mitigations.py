"""Mitigations against the plain update in the smoothing regime (positive H spectrum, fixed A).

Claims (docs/theory.md §7, claims 25-29): with λ^H > 0 the plain update X + A X W_V W_proj smooths (S6).
ResFormer/SVFormer mix in the first layer's values (claim 28); Yu & Zhang's similarity removal (τ = 1)
strips the attention branch's token mean (claim 29); AttnScale (ω = 0.5) and FeatScale (s_h = 0.5)
amplify the high-frequency part. NeuTRENO (λ = 0.6) has a non-constant fixed point for the
attention-only iteration v <- A v + λ (v0 - v) (claim 27), but inside this residual update X grows
geometrically while the fidelity term λ (V_0 - V) stays fixed, so here it does not stop smoothing:
the figure shows that honestly. Median HFC/LFC and mean token cosine over random draws per rule.

Run: ``python -m oversmooth.figures.theory_mitigations [--quick] --out DIR``.

CSV columns: ``rule,layer,metric,median,q25,q75``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from oversmooth.figures._common import new_figure, run_script
from oversmooth.simulator import spectra
from oversmooth.simulator.dynamics import iterate
from oversmooth.simulator.updates import rule_from_system

NAME = "theory_mitigations"
SEED = 27
N_TOKENS, D_MODEL = 16, 8
FULL = {"draws": 40, "layers": 60}
QUICK = {"draws": 6, "layers": 15}
RULES = {
    "plain": ("linear", {}),
    "NeuTRENO λ=0.6": ("neutreno", {"lam": 0.6}),
    "ResFormer": ("resformer", {}),
    "SVFormer": ("svformer", {}),
    "similarity removal τ=1": ("similarity-removal", {"tau": 1.0}),
    "AttnScale ω=0.5": ("attnscale", {"omega": 0.5}),
    "FeatScale s_h=0.5": ("featscale", {"s_h": 0.5}),
}
METRICS = ("hfc_lfc", "cosine")
COLUMNS = ("rule", "layer", "metric", "median", "q25", "q75")


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Median and quartiles of each metric per layer and rule."""
    size = QUICK if quick else FULL
    rng = np.random.default_rng(SEED)
    A = spectra.attention_symmetric_scores(N_TOKENS, batch=size["draws"], rng=rng)
    H = spectra.h_symmetric(rng.uniform(0.05, 1.0, (size["draws"], D_MODEL)), rng=rng)
    X0 = spectra.random_tokens(N_TOKENS, D_MODEL, batch=size["draws"], rng=rng)
    rows: list[dict[str, Any]] = []
    for label, (name, options) in RULES.items():
        rule = rule_from_system(name, A=A, W_V=H, W_proj=np.eye(D_MODEL), **options)
        trajectory = iterate(rule, X0, size["layers"], metrics=METRICS, floor=None)
        for metric in METRICS:
            q25, median, q75 = np.quantile(trajectory.metrics[metric], [0.25, 0.5, 0.75], axis=1)
            rows.extend(
                {
                    "rule": label,
                    "layer": layer,
                    "metric": metric,
                    "median": float(median[layer]),
                    "q25": float(q25[layer]),
                    "q75": float(q75[layer]),
                }
                for layer in range(median.size)
            )
    config = {
        "seed": SEED,
        "n": N_TOKENS,
        "d": D_MODEL,
        **size,
        "h_spectrum": [0.05, 1.0],
        "rules": {k: [v[0], v[1]] for k, v in RULES.items()},
    }
    return rows, config


def plot(rows: list[dict[str, Any]]):
    """HFC/LFC (log scale) and mean cosine per layer, one line per rule."""
    fig, axes = new_figure("full", 0.38, ncols=2)
    for ax, metric in zip(axes, METRICS, strict=True):
        for label in RULES:
            sel = [r for r in rows if r["rule"] == label and r["metric"] == metric]
            style = "-" if label == "plain" else "--"
            ax.plot([r["layer"] for r in sel], [r["median"] for r in sel], style, label=label)
        ax.set_xlabel("layer")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("HFC / LFC (median)")
    axes[1].set_ylabel("mean token cosine (median)")
    axes[1].legend(fontsize=6)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
