"""Claims 21-24: the sign of the value spectrum: LayerNorm's gamma (Pre-LN and Post-LN) and the
reparameterized H+ and H- (Table 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from oversmooth.simulator import spectra, theory, updates
from oversmooth.simulator.checks.core import (
    GAP,
    SEED,
    TOLERANCE,
    Check,
    Choice,
    FloatRange,
    IntRange,
)
from oversmooth.simulator.checks.shared import (
    D_RANGE,
    SCALE_RANGE,
    attention,
    dense_system,
    iterate_quietly,
    kind_margin,
    matched_error,
    max_abs,
    orthogonal,
    relative,
    tolerance_margin,
)
from oversmooth.simulator.tolerances import EIG_TOL, STEP_RTOL

# ----------------------------------------------------------------------------------------------
# claims 21-22: LayerNorm
# ----------------------------------------------------------------------------------------------


def _pre_ln_effective_product(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X = dense_system(p)
    c = p["c"]
    negative = updates.PreLNRule(A, W_V, W_proj, gamma=-c)(X, 0, {})
    folded = updates.PreLNRule(A, W_V, -c * W_proj)(X, 0, {})
    gamma = np.random.default_rng([p["seed"], 1]).uniform(-2.0, 2.0, int(X.shape[1]))
    general = updates.PreLNRule(A, W_V, W_proj, gamma=gamma)(X, 0, {})
    general_folded = updates.PreLNRule(A, gamma[:, None] * W_V, W_proj)(X, 0, {})
    spectrum = theory.value_spectrum(W_V, W_proj)
    effective = theory.value_spectrum(-c * W_V, W_proj)
    scale = max_abs(X) + max_abs(negative)
    errors = [
        relative(max_abs(negative - folded), scale),
        relative(max_abs(general - general_folded), scale),
        relative(matched_error(effective, -c * spectrum), c * (1.0 + max_abs(spectrum))),
    ]
    return tolerance_margin(max(errors), EIG_TOL)


#: Systems per instance of the Pre-LN sign experiment (the claim is about medians, §4).
PRE_LN_BATCH = 16
PRE_LN_LAYERS = 100


def pre_ln_medians(p: Mapping[str, Any]) -> dict[tuple[float, float], float]:
    """Median final HFC/LFC of the four Pre-LN systems, keyed by (sign of H, sign of gamma).

    H+ and H- are drawn independently (own eigenvectors, own |eigenvalues|).

    With H- = -H+ the pair (H-, +c) would be the system (H+, -c) itself and the second comparison a
    copy of the first; independent draws make the four medians four different systems, so both
    orderings are outcomes of the dynamics.
    """
    gen = np.random.default_rng(p["seed"])
    n, d, K = p["n"], p["d"], PRE_LN_BATCH
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], batch=K, rng=gen)
    X0 = spectra.random_tokens(n, d, batch=K, rng=gen)
    median = {}
    for sign_h in (1.0, -1.0):
        lam = gen.uniform(0.05, 1.0, (K, d))
        Q = np.stack([orthogonal(d, gen) for _ in range(K)])
        M = (Q * (sign_h * lam)[:, None, :]) @ np.swapaxes(Q, -1, -2)
        for sign_g in (1.0, -1.0):
            rule = updates.PreLNRule(A, M, np.eye(d), gamma=sign_g * p["c"])
            final = iterate_quietly(rule, X0, PRE_LN_LAYERS, ("hfc_lfc",)).metrics["hfc_lfc"][-1]
            median[sign_h, sign_g] = float(np.median(final))
    return median


def _pre_ln_sign_flip(p: Mapping[str, Any]) -> float:
    median = pre_ln_medians(p)
    return min(
        math.log10(median[-1.0, 1.0] / median[1.0, 1.0]),
        math.log10(median[1.0, -1.0] / median[-1.0, -1.0]),
    )


def _post_ln_sign_alternation(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X0 = dense_system(p)
    plus = updates.PostLNRule(A, W_V, W_proj, gamma=p["c"], beta=0.0)
    minus = updates.PostLNRule(A, W_V, W_proj, gamma=-p["c"], beta=0.0)
    X_plus, X_minus, worst = X0, X0, 0.0
    for layer in range(p["layers"]):
        X_plus, X_minus = plus(X_plus, layer, {}), minus(X_minus, layer, {})
        sign = -1.0 if layer % 2 == 0 else 1.0
        worst = max(worst, relative(max_abs(X_minus - sign * X_plus), max_abs(X_plus)))
    return tolerance_margin(worst, STEP_RTOL)


# ----------------------------------------------------------------------------------------------
# claims 23-24: the reparameterization
# ----------------------------------------------------------------------------------------------


def _reparameterize_construction(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    d = p["d"]
    psi = p["psi_scale"] * gen.standard_normal(d)
    r = spectra.reparameterize(gen.standard_normal((d, d)), psi, p["sign"])
    scale = 1.0 + max_abs(r.eigenvalues)
    in_range = (
        max(max_abs(np.clip(r.eigenvalues, -1.0, 0.0) - r.eigenvalues), 0.0)
        if p["sign"] == "minus"
        else float(max(-r.eigenvalues.min(), 0.0))
    )
    errors = [
        max_abs(r.H - r.H.T) / scale,
        matched_error(np.linalg.eigvalsh(r.H), r.eigenvalues) / scale,
        max_abs(r.W_V @ r.W_proj - r.H) / scale,
        max_abs(r.V.T @ r.V - np.eye(d)),
        in_range,
    ]
    return tolerance_margin(max(errors), STEP_RTOL)


#: Attention matrices per instance of the Table-1 sanity check.
TABLE1_BATCH = 8


def _reparameterized_dominance(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, K = p["n"], p["d"], TABLE1_BATCH
    A = np.stack([attention(p["a_kind"], n, p["scale"], gen) for _ in range(K)])
    psi = gen.uniform(0.1, p["psi_high"], d) * gen.choice([-1.0, 1.0], d)
    r = spectra.reparameterize(gen.standard_normal((d, d)), psi, p["sign"])
    eig_A = np.linalg.eigvals(A)
    eig_H = theory.value_spectrum(r.W_V, r.W_proj)
    perron = p["sign"] == "plus"
    return min(kind_margin(eig_A[k], eig_H, perron=perron) for k in range(K))


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    Check(
        "pre_ln_effective_product",
        21,
        "Pre-LN: A LN_gamma(X) M = A N(X) diag(gamma) M; gamma = -c 1 gives spectrum -c spec(M)",
        TOLERANCE + " (tolerance 1e-9)",
        {"n": IntRange(2, 10), "d": IntRange(2, 8), "c": FloatRange(0.25, 4.0), "seed": SEED},
        _pre_ln_effective_product,
    ),
    Check(
        "pre_ln_sign_flip",
        21,
        "Pre-LN: the median HFC/LFC ordering of H+ vs H- (drawn independently) flips between "
        "gamma = +c and gamma = -c",
        "decades between the medians (over 16 systems, 100 layers) in the predicted order, worst sign",
        {
            "n": IntRange(4, 12),
            "d": IntRange(4, 12),
            "scale": SCALE_RANGE,
            "c": FloatRange(0.5, 2.0),
            "seed": SEED,
        },
        _pre_ln_sign_flip,
    ),
    Check(
        "post_ln_sign_alternation",
        22,
        "Post-LN with beta = 0: X_l(gamma = -c) = (-1)^l X_l(gamma = c) exactly",
        TOLERANCE,
        {
            "n": IntRange(2, 10),
            "d": IntRange(2, 8),
            "c": FloatRange(0.25, 4.0),
            "layers": IntRange(1, 40),
            "seed": SEED,
        },
        _post_ln_sign_alternation,
    ),
    Check(
        "reparameterize_construction",
        23,
        "H = Q Lambda Q^T is symmetric with spectrum diag(Lambda); minus in [-1, 0], plus >= 0; "
        "W_V W_proj = H",
        TOLERANCE,
        {
            "d": IntRange(1, 12),
            "sign": Choice(("plus", "minus")),
            "psi_scale": FloatRange(0.1, 3.0),
            "seed": SEED,
        },
        _reparameterize_construction,
    ),
    Check(
        "reparameterized_dominance",
        24,
        "reparameterized H+ is 100% Perron-dominated and H- 0%, for any attention (Table 1)",
        GAP + ", worst over 8 attention matrices",
        {
            "n": IntRange(2, 16),
            "d": D_RANGE,
            "scale": FloatRange(0.5, 2.0),
            "a_kind": Choice(("general", "symmetric")),
            "sign": Choice(("plus", "minus")),
            "psi_high": FloatRange(0.2, 2.0),
            "seed": SEED,
        },
        _reparameterized_dominance,
    ),
)
