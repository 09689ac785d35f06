"""Claims 25-30: related methods (AttnScale, FeatScale, NeuTRENO, value residuals, similarity
removal) and Dong's residual against the rank-one residual.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from oversmooth.simulator import metrics, spectra, theory, updates
from oversmooth.simulator.checks.core import (
    DECADES,
    SEED,
    TOLERANCE,
    Check,
    Choice,
    FloatRange,
    IntRange,
)
from oversmooth.simulator.checks.shared import (
    D_RANGE,
    N_RANGE,
    decades_above,
    decades_below,
    dense_system,
    eig,
    layers_for,
    matched_error,
    max_abs,
    relative,
    tolerance_margin,
)
from oversmooth.simulator.tolerances import EIG_TOL, SMOOTH_THRESHOLD, STEP_RTOL
from oversmooth.simulator.validation import FloatArray

# ----------------------------------------------------------------------------------------------
# claims 25-30: related methods and metrics
# ----------------------------------------------------------------------------------------------


def _attnscale_algebra(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, omega = p["n"], p["omega"]
    if p["a_kind"] == "doubly-stochastic":
        A = spectra.attention_doubly_stochastic(n, rng=gen)
    else:
        A = spectra.attention_general(n, rng=gen)
    A_hat = updates.AttnScaleRule(A, np.eye(1), np.eye(1), omega=omega).A_hat
    identity = updates.AttnScaleRule(A, np.eye(1), np.eye(1), omega=0.0).A_hat
    errors = [max_abs(A_hat.sum(axis=1) - 1.0), max_abs(identity - A)]
    if p["a_kind"] == "doubly-stochastic":
        lam = eig(A)
        others = np.delete(lam, int(theory.perron_index(lam)))
        expected = np.concatenate([[1.0], (1.0 + omega) * others])
        errors.append(matched_error(eig(A_hat), expected) / (1.0 + abs(omega)))
    return tolerance_margin(max(errors), EIG_TOL)


def _featscale_algebra(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X = dense_system(p)
    gen = np.random.default_rng([p["seed"], 1])
    s_d, s_h = p["s_scale"] * gen.standard_normal((2, X.shape[1]))
    zero = updates.FeatScaleRule(A, W_V, W_proj, s_d=0.0, s_h=0.0)(X, 0, {})
    linear = updates.LinearRule(A, W_V, W_proj)(X, 0, {})
    code = updates.FeatScaleRule(A, W_V, W_proj, s_d=s_d, s_h=s_h, code_faithful=True)(X, 0, {})
    doubled = updates.FeatScaleRule(A, W_V, W_proj, s_d=2 * s_d, s_h=2 * s_h)(X, 0, {})
    scale = max_abs(linear) + max_abs(code)
    errors = [max_abs(zero - linear), max_abs(code - doubled)]
    return tolerance_margin(relative(max(errors), scale), STEP_RTOL)


def _neutreno_system(p: Mapping[str, Any]) -> tuple[FloatArray, FloatArray]:
    """PSD-score A (spectrum in [0, 1], so rho(A - lam I) < 1 for 0 < lam < 1) and values v^0."""
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores="psd", rng=gen)
    return A, gen.standard_normal((p["n"], p["d_v"]))


def _neutreno_iterate(A: FloatArray, v0: FloatArray, lam: float, layers: int) -> FloatArray:
    """``v^{l+1} = A v^l + lam (v^0 - v^l)`` from ``v^0`` (docs/theory.md §7.3, fixed A)."""
    v = v0
    for _ in range(layers):
        v = A @ v + lam * (v0 - v)
    return v


def _neutreno_fixed_point(p: Mapping[str, Any]) -> float:
    A, v0 = _neutreno_system(p)
    lam, n = p["lam"], A.shape[0]
    rate = float(np.abs(eig(A) - lam).max())
    if rate >= 1.0:
        return 1.0 - rate
    fixed = lam * np.linalg.solve((1.0 + lam) * np.eye(n) - A, v0)
    v = _neutreno_iterate(A, v0, lam, layers_for(rate, 1e-14))
    error = relative(float(np.linalg.norm(v - fixed)), float(np.linalg.norm(fixed)))
    return min(
        tolerance_margin(error, 100 * STEP_RTOL),
        decades_above(float(metrics.hfc_lfc(fixed)), 1e-8),
    )


def _neutreno_without_fidelity(p: Mapping[str, Any]) -> float:
    A, v0 = _neutreno_system(p)
    second = float(np.sort(np.abs(eig(A)))[-2])
    v = _neutreno_iterate(A, v0, 0.0, layers_for(second, SMOOTH_THRESHOLD * 1e-3))
    return decades_below(float(metrics.hfc_lfc(v)))


def _value_residual_algebra(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, d_v = p["n"], p["d"], p["d_v"]
    A = spectra.attention_general(n, rng=gen)
    W_V = gen.standard_normal((d, d_v)) / math.sqrt(d)
    W_O = gen.standard_normal((d_v, d)) / math.sqrt(d_v)
    X0 = spectra.random_tokens(n, d, rng=gen)
    rule = updates.ValueResidualRule(A, W_V, W_O, mode=p["mode"])
    cache: dict[str, Any] = {}
    V1, X, worst = X0 @ W_V, X0, 0.0
    for layer in range(p["layers"]):
        if layer == 0:
            values = X @ W_V
        elif p["mode"] == "resformer":
            values = 0.5 * V1 + 0.5 * (X @ W_V)
        else:
            values = V1
        expected = X + A @ values @ W_O
        X = rule(X, layer, cache)
        worst = max(worst, relative(max_abs(X - expected), max_abs(expected)))
    return tolerance_margin(worst, STEP_RTOL)


def _similarity_removal_algebra(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X = dense_system(p)
    tau = p["tau"]
    lfc, hfc = metrics.lfc_hfc_split(X)
    lfc_removed, hfc_removed = metrics.lfc_hfc_split(X - tau * X.mean(axis=0))
    branch = updates.LinearRule(A, W_V, W_proj, skip=False)(X, 0, {})
    rule_branch = updates.SimilarityRemovalRule(A, W_V, W_proj, tau=tau)(X, 0, {}) - X
    lfc_b, hfc_b = metrics.lfc_hfc_split(branch)
    lfc_r, hfc_r = metrics.lfc_hfc_split(rule_branch)
    full = X - X.mean(axis=0)
    scale = max_abs(X) + max_abs(branch)
    errors = [
        max_abs(lfc_removed - (1.0 - tau) * lfc),
        max_abs(hfc_removed - hfc),
        max_abs(lfc_r - (1.0 - tau) * lfc_b),
        max_abs(hfc_r - hfc_b),
        max_abs(full.mean(axis=0)),
    ]
    ratio = float(metrics.hfc_lfc(full))
    return min(
        tolerance_margin(relative(max(errors), scale), STEP_RTOL),
        decades_above(ratio, 1.0 / STEP_RTOL),
    )


def _dong_vs_rank1(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    u, v = gen.standard_normal(p["n"]), gen.standard_normal(p["d"])
    X = np.outer(u, v)
    centred = u - u.mean()
    norm_1_inf = np.linalg.norm(centred, 1) * np.abs(centred).max()
    predicted = math.sqrt(norm_1_inf / (np.linalg.norm(u, 1) * np.abs(u).max()))
    dong = float(metrics.dong_residual(X))
    errors = [float(metrics.rank1_residual(X)), relative(abs(dong - predicted), predicted)]
    return min(
        tolerance_margin(max(errors), STEP_RTOL),
        decades_above(dong, STEP_RTOL),
    )


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    Check(
        "attnscale_algebra",
        25,
        "AttnScale: A_hat 1 = 1; omega = 0 is the identity; doubly stochastic A: non-Perron "
        "eigenvalues scale by 1 + omega",
        TOLERANCE + " (tolerance 1e-9)",
        {
            "n": N_RANGE,
            "omega": FloatRange(-0.9, 3.0),
            "a_kind": Choice(("doubly-stochastic", "general")),
            "seed": SEED,
        },
        _attnscale_algebra,
    ),
    Check(
        "featscale_algebra",
        26,
        "FeatScale: s_d = s_h = 0 is the plain layer; the code-faithful form equals 2 s_d, 2 s_h",
        TOLERANCE,
        {"n": IntRange(2, 10), "d": D_RANGE, "s_scale": FloatRange(0.0, 2.0), "seed": SEED},
        _featscale_algebra,
    ),
    Check(
        "neutreno_fixed_point",
        27,
        "NeuTRENO v <- A v + lam (v0 - v) converges to lam ((1 + lam) I - A)^{-1} v0, HFC/LFC > 0",
        TOLERANCE + " (relative error, tolerance 1e-10); decades of HFC/LFC(limit) above 1e-8",
        {
            "n": N_RANGE,
            "d_v": IntRange(1, 6),
            "scale": FloatRange(0.2, 0.6),
            "lam": FloatRange(0.2, 0.9),
            "seed": SEED,
        },
        _neutreno_fixed_point,
    ),
    Check(
        "neutreno_without_fidelity_smooths",
        27,
        "NeuTRENO with lam = 0 is v <- A v: HFC/LFC -> 0",
        DECADES + " (HFC/LFC below 1e-6)",
        {
            "n": N_RANGE,
            "d_v": IntRange(1, 6),
            "scale": FloatRange(0.2, 0.6),
            "lam": FloatRange(0.2, 0.9),
            "seed": SEED,
        },
        _neutreno_without_fidelity,
    ),
    Check(
        "value_residual_algebra",
        28,
        "ResFormer layer n >= 1 adds A (V_1 + V_n)/2 W_O, SVFormer A V_1 W_O; layer 0 is unchanged",
        TOLERANCE,
        {
            "n": IntRange(2, 10),
            "d": D_RANGE,
            "d_v": D_RANGE,
            "layers": IntRange(1, 6),
            "mode": Choice(("resformer", "svformer")),
            "seed": SEED,
        },
        _value_residual_algebra,
    ),
    Check(
        "similarity_removal_algebra",
        29,
        "(I - tau Pi): LFC scales by 1 - tau, HFC unchanged; tau = 1 leaves t_sim = 0, HFC/LFC = inf",
        TOLERANCE + "; decades of HFC/LFC above 1e12 for tau = 1",
        {"n": N_RANGE, "d": D_RANGE, "tau": FloatRange(-1.0, 2.0), "seed": SEED},
        _similarity_removal_algebra,
    ),
    Check(
        "dong_vs_rank1",
        30,
        "X = u v^T with u not parallel to 1: rank-1 residual 0 but Dong's mean residual > 0",
        TOLERANCE + "; decades of the Dong residual above the round-off level",
        {"n": IntRange(2, 16), "d": D_RANGE, "seed": SEED},
        _dong_vs_rank1,
    ),
)
