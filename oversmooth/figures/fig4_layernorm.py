"""Fig. 4: the sign of the LayerNorm weights decides smoothing under Pre-LN, not under Post-LN.

Claim (docs/theory.md §4, claims 21-22): with repeated layers, a fixed symmetric-score attention A and a
symmetric H, Pre-LN with gamma = -1 multiplies the effective value-projection spectrum by -1 and so swaps
the smoothing (H+) and non-smoothing (H-) regimes; Post-LN with a uniform sign flip only flips the sign
of X and leaves every metric unchanged; without LN the sign of gamma does not enter.

Run: ``python -m oversmooth.figures.fig4_layernorm [--quick] --out DIR``.

CSV columns: ``h_spectrum,norm,gamma_sign,layer,median,q25,q75`` (HFC/LFC over random draws of A, H, X0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from oversmooth.figures._common import new_figure, run_script
from oversmooth.simulator import spectra
from oversmooth.simulator.dynamics import iterate
from oversmooth.simulator.updates import rule_from_system

NAME = "fig4_layernorm"
SEED = 4
N_TOKENS, D_MODEL = 16, 8
FULL = {"draws": 50, "layers": 100}
QUICK = {"draws": 6, "layers": 20}
H_SPECTRA = {"positive": (0.05, 1.0), "negative": (-1.0, -0.05)}
NORMS = {"none": "linear", "post": "post-ln", "pre": "pre-ln"}
COLUMNS = ("h_spectrum", "norm", "gamma_sign", "layer", "median", "q25", "q75")


def _system(h_spectrum: str, draws: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    A = spectra.attention_symmetric_scores(N_TOKENS, batch=draws, rng=rng)
    low, high = H_SPECTRA[h_spectrum]
    H = spectra.h_symmetric(rng.uniform(low, high, (draws, D_MODEL)), rng=rng)
    X0 = spectra.random_tokens(N_TOKENS, D_MODEL, batch=draws, rng=rng)
    return A, H, X0


def compute(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Median and quartiles of HFC/LFC per layer for every (H spectrum, norm, gamma sign)."""
    size = QUICK if quick else FULL
    rows: list[dict[str, Any]] = []
    for h_spectrum in H_SPECTRA:
        A, H, X0 = _system(h_spectrum, size["draws"])
        for norm, rule_name in NORMS.items():
            for sign in (1, -1):
                gamma = np.full(D_MODEL, float(sign))
                # H is symmetric, so M = W_V W_proj = H^T = H; W_proj = I.
                rule = rule_from_system(rule_name, A=A, W_V=H, W_proj=np.eye(D_MODEL), gamma=gamma)
                ratio = iterate(rule, X0, size["layers"], metrics=("hfc_lfc",), floor=None).metrics[
                    "hfc_lfc"
                ]
                q25, median, q75 = np.quantile(ratio, [0.25, 0.5, 0.75], axis=1)
                rows.extend(
                    {
                        "h_spectrum": h_spectrum,
                        "norm": norm,
                        "gamma_sign": "+" if sign > 0 else "-",
                        "layer": layer,
                        "median": float(median[layer]),
                        "q25": float(q25[layer]),
                        "q75": float(q75[layer]),
                    }
                    for layer in range(ratio.shape[0])
                )
    config = {
        "seed": SEED,
        "n": N_TOKENS,
        "d": D_MODEL,
        **size,
        "h_spectra": H_SPECTRA,
        "a": "symmetric scores, scale 1",
        "beta": 0,
        "gamma": "+1 or -1",
    }
    return rows, config


def plot(rows: list[dict[str, Any]]):
    """One panel per H spectrum: median HFC/LFC (log scale) with the interquartile band."""
    fig, axes = new_figure("full", 0.36, ncols=2, sharey=True)
    styles = {"+": "-", "-": "--"}
    colors = {"none": "C7", "post": "C0", "pre": "C1"}
    for ax, h_spectrum in zip(axes, H_SPECTRA, strict=True):
        for norm in NORMS:
            for sign in "+-":
                sel = [
                    r
                    for r in rows
                    if (r["h_spectrum"], r["norm"], r["gamma_sign"]) == (h_spectrum, norm, sign)
                ]
                layers = [r["layer"] for r in sel]
                ax.plot(
                    layers,
                    [r["median"] for r in sel],
                    styles[sign],
                    color=colors[norm],
                    label=f"{norm} LN, γ {sign}" if norm != "none" else f"no LN, γ {sign}",
                )
                ax.fill_between(
                    layers,
                    [r["q25"] for r in sel],
                    [r["q75"] for r in sel],
                    color=colors[norm],
                    alpha=0.12,
                    linewidth=0,
                )
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(f"H spectrum {h_spectrum}")
    axes[0].set_ylabel("HFC / LFC")
    axes[1].legend(ncols=2)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Compute, plot and save the figure."""
    return run_script(NAME, __doc__, compute, plot, COLUMNS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
