"""Claims 12-20: the dynamics of ``X + A X M`` over many layers: convergence, divergence and the
limits of the smoothing metrics (S2-S4, S7-S9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from oversmooth.simulator import dynamics, metrics, spectra, theory
from oversmooth.simulator.checks.core import (
    DECADES,
    SEED,
    TOLERANCE,
    Check,
    Choice,
    FloatRange,
    IntRange,
    ParamSpec,
)
from oversmooth.simulator.checks.shared import (
    D_RANGE,
    N_RANGE,
    SCALE_RANGE,
    LinearSystem,
    attention,
    decades_above,
    decades_below,
    eig,
    iterate_quietly,
    layers_for,
    linear_rule,
    orthogonal,
    relative,
    rows_rate,
    scan,
    tolerance_margin,
    uniform_spectrum,
)
from oversmooth.simulator.tolerances import LIMIT_RTOL, RATE_RTOL, SMOOTH_THRESHOLD, STEP_RTOL
from oversmooth.simulator.validation import FloatArray

# ----------------------------------------------------------------------------------------------
# claims 12-20: dynamics of X + A X M
# ----------------------------------------------------------------------------------------------


def _positive_system(p: Mapping[str, Any], gen: np.random.Generator) -> LinearSystem:
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    high = p["h_high"] if "h_high" in p else p["h_low"] * p["h_ratio"]
    H = spectra.h_symmetric(uniform_spectrum(gen, d, p["h_low"], high), rng=gen)
    return LinearSystem(A, H, spectra.random_tokens(n, d, rng=gen))


def _perron_rate(system: LinearSystem) -> float:
    """``rho = max_{i != n, j} |mu_ij| / max_j |mu_nj|``: the decay of HFC/LFC under S2; infinite
    where every Perron mode is annihilated (``mu_nj = 0``: λ^H_j λ^A_n = −1 for every j)."""
    eig_A = eig(system.A)
    mu = np.abs(theory.kron_eigenvalues(eig_A, eig(system.H)))
    p = int(theory.perron_index(eig_A))
    perron = float(mu[p].max())
    return float(np.delete(mu, p, axis=0).max()) / perron if perron > 0 else math.inf


def _smoothing_decades(X: FloatArray) -> float:
    """Decades below SMOOTH_THRESHOLD of HFC/LFC, 1 - cos and sigma_2/sigma_1 (the worst)."""
    return min(
        decades_below(float(metrics.hfc_lfc(X))),
        decades_below(1.0 - float(metrics.cosine(X))),
        decades_below(float(metrics.sigma_ratio(X))),
    )


def _positive_h_input_convergence(p: Mapping[str, Any]) -> float:
    system = _positive_system(p, np.random.default_rng(p["seed"]))
    layers = layers_for(_perron_rate(system), SMOOTH_THRESHOLD * 1e-3)
    trajectory = iterate_quietly(linear_rule(system.A, system.H), system.X0, layers, ("hfc_lfc",))
    return _smoothing_decades(trajectory.final)


def _separations(system: LinearSystem) -> tuple[float, float]:
    """Next-to-leading ratios of the non-Perron and of the Perron ``|mu|`` (claim 12's filter)."""
    eig_A = eig(system.A)
    mu = np.abs(theory.kron_eigenvalues(eig_A, eig(system.H)))
    p = int(theory.perron_index(eig_A))
    others = np.sort(np.delete(mu, p, axis=0).ravel())[::-1]
    perron = np.sort(mu[p])[::-1]
    perron_sep = perron[1] / perron[0] if perron.size > 1 else 0.0
    return float(others[1] / others[0]), float(perron_sep)


def _well_separated(system: LinearSystem) -> bool:
    rho = _perron_rate(system)
    return rho <= 0.95 and max(_separations(system)) < min(0.9, rho)


def _positive_h_rate(p: Mapping[str, Any]) -> float:
    system = scan(p["seed"], lambda gen: _positive_system(p, gen), _well_separated)
    rho = _perron_rate(system)
    layers = layers_for(rho, 1e-11)
    trajectory = iterate_quietly(linear_rule(system.A, system.H), system.X0, layers, ("hfc_lfc",))
    ratio = trajectory.metrics["hfc_lfc"]
    usable = int(np.argmax(ratio < 1e-11)) if np.any(ratio < 1e-11) else ratio.size
    window = np.arange(usable // 2, usable)
    fitted = dynamics.fit_rate(ratio[window], window)
    error = abs(math.log(fitted) - math.log(rho)) / abs(math.log(rho))
    return tolerance_margin(error, RATE_RTOL)


#: HFC/LFC that claim 13 must reach; float64 saturates it near 1e13-1e16 (LFC at round-off).
DIVERGENCE_TARGET = 1e10


def _doubly_stochastic_divergence(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_doubly_stochastic(n, scale=p["scale"], rng=gen)
    H = spectra.h_symmetric(
        -uniform_spectrum(gen, d, p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    growth = _perron_rate(LinearSystem(A, H, A))
    target = DIVERGENCE_TARGET
    X0 = spectra.random_tokens(n, d, rng=gen)
    if math.isinf(growth):  # the first layer removes the token mean, up to round-off
        ratio = iterate_quietly(linear_rule(A, H), X0, 1, ("hfc_lfc",)).metrics["hfc_lfc"]
        return decades_above(float(ratio[-1]), target)
    # Twice the asymptotic estimate: near 1e10 the growth slows as the ratio approaches its float64
    # saturation (the LFC of the dominant mode is round-off, not exactly zero).
    layers = 2 * layers_for(1.0 / growth, 1.0 / target, extra=20)
    ratio = iterate_quietly(linear_rule(A, H), X0, layers, ("hfc_lfc",)).metrics["hfc_lfc"]
    reached = np.nonzero(ratio > target)[0]
    if reached.size == 0:
        return decades_above(float(ratio[-1]), target)
    steps = np.diff(np.log(ratio[: reached[0] + 1]))
    return float(steps[steps.size // 2 :].min() / math.log(growth))


def _non_perron_system(p: Mapping[str, Any], gen: np.random.Generator) -> LinearSystem:
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    H = spectra.h_symmetric(
        -uniform_spectrum(gen, d, p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    return LinearSystem(A, H, spectra.random_tokens(n, d, rng=gen))


def _non_perron_run(p: Mapping[str, Any]) -> tuple[float, float, FloatArray]:
    """A filtered S3 instance (a real, single-row dominating mode, rate <= 0.97): the predicted
    HFC/LFC and cosine limits, and X_L."""

    def accept(system: LinearSystem) -> bool:
        prediction = theory.predict(system.A, system.H)
        return prediction.hfc_lfc_limit is not None and rows_rate(system)[0] <= 0.97

    system = scan(p["seed"], lambda gen: _non_perron_system(p, gen), accept)
    prediction = theory.predict(system.A, system.H)
    hfc_limit, cosine_limit = prediction.hfc_lfc_limit, prediction.cosine_limit
    if hfc_limit is None or cosine_limit is None:  # accept() kept only instances with limits
        raise RuntimeError("theory.predict gave no limits for an accepted non-Perron instance")
    # When u_1 is nearly orthogonal to 1 the limit is large and the LFC tiny: corrections to the
    # LFC are amplified by the limit itself, so converge that much further.
    amplification = max(1.0, hfc_limit)
    layers = layers_for(rows_rate(system)[0], 1e-9 / amplification)
    trajectory = iterate_quietly(linear_rule(system.A, system.H), system.X0, layers, ("hfc_lfc",))
    return hfc_limit, cosine_limit, trajectory.final


def _non_perron_hfc_limit(p: Mapping[str, Any]) -> float:
    limit, _, X = _non_perron_run(p)
    error = relative(abs(float(metrics.hfc_lfc(X)) - limit), limit)
    return min(tolerance_margin(error, LIMIT_RTOL), decades_above(limit, 1e-12))


def _non_perron_cosine_limit(p: Mapping[str, Any]) -> float:
    _, limit, X = _non_perron_run(p)
    error = abs(float(metrics.cosine(X)) - limit)
    return min(tolerance_margin(error, LIMIT_RTOL), 1.0 - limit)


def _non_perron_rank_collapse(p: Mapping[str, Any]) -> float:
    _, _, X = _non_perron_run(p)
    return decades_below(float(metrics.sigma_ratio(X)))


class _Balanced(NamedTuple):
    """S4: H-eigenvalues ``{a, -1, small...}`` with ``a = -lambda^A_1``, so ``1 + a = 1 - lambda^A_1``."""

    system: LinearSystem
    a: float
    Q: FloatArray
    spectrum: FloatArray

    def shifted(self, shift: float) -> LinearSystem:
        """The same system with the balanced eigenvalue ``a`` moved to ``a + shift``."""
        spectrum = self.spectrum.copy()
        spectrum[0] += shift
        return self.system._replace(H=(self.Q * spectrum) @ self.Q.T)


def _balanced_system(p: Mapping[str, Any], gen: np.random.Generator) -> _Balanced:
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    a = -float(np.min(eig(A).real))
    spectrum = np.concatenate([[a, -1.0], gen.uniform(-p["small"], p["small"], d - 2)])
    Q = orthogonal(d, gen)
    system = LinearSystem(A, (Q * spectrum) @ Q.T, spectra.random_tokens(n, d, rng=gen))
    return _Balanced(system, a, Q, spectrum)


def _balanced_accept(instance: _Balanced) -> bool:
    """Keep a clearly negative lambda^A_1 (so a - 0.1 > 0) and the other modes at rate <= 0.95."""
    if instance.a < 0.15:
        return False
    dom = theory.dominance(instance.system.A, instance.system.H)
    return dom.kind == "balanced" and dom.rate <= 0.95


def _balanced_limit(system: LinearSystem) -> float:
    """sigma_2/sigma_1 of ``c_a 1 s_a^T + c_b u_1 s_b^T``, the limit direction of X_L under S4."""
    lam_A, U = np.linalg.eig(system.A)
    W = np.linalg.inv(U)  # rows: left eigenvectors with w_i^T u_i = 1
    lam_H, S = np.linalg.eigh(system.H)
    p, i1 = int(theory.perron_index(lam_A)), int(np.argmin(lam_A.real))
    ja, jb = int(np.argmax(lam_H)), int(np.argmin(lam_H))
    Y = np.zeros(system.X0.shape, dtype=complex)
    for i, j in ((p, ja), (i1, jb)):
        coefficient = W[i] @ system.X0 @ S[:, j]
        Y += coefficient * np.outer(U[:, i], S[:, j])
    return float(metrics.sigma_ratio(Y.real))


def _sigma_ratio_after(system: LinearSystem, rate: float, target: float) -> float:
    layers = layers_for(rate, target)
    rule = linear_rule(system.A, system.H)
    return float(
        iterate_quietly(rule, system.X0, layers, ("sigma_ratio",)).metrics["sigma_ratio"][-1]
    )


def _balanced_no_rank_collapse(p: Mapping[str, Any]) -> float:
    system = scan(p["seed"], lambda gen: _balanced_system(p, gen), _balanced_accept).system
    rate = theory.dominance(system.A, system.H).rate
    measured, limit = _sigma_ratio_after(system, rate, 1e-10), _balanced_limit(system)
    error = relative(abs(measured - limit), limit)
    return min(tolerance_margin(error, LIMIT_RTOL), decades_above(measured, 1e-8))


def _balanced_perturbed_collapses(p: Mapping[str, Any]) -> float:
    instance = scan(p["seed"], lambda gen: _balanced_system(p, gen), _balanced_accept)
    system = instance.shifted(p["sign"] * p["epsilon"])
    rate = theory.dominance(system.A, system.H).rate  # the broken tie is the slowest mode
    return decades_below(_sigma_ratio_after(system, rate, 1e-9))


def _no_skip_low_pass(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_general(n, scale=p["scale"], rng=gen)
    lam = gen.uniform(-p["h_radius"], p["h_radius"], d).astype(complex)
    if p["h_kind"] == "complex" and d >= 2:
        lam[:2] = p["h_radius"] * np.exp(np.array([1j, -1j]) * gen.uniform(0.1, 3.0))
    H = spectra.h_nonsymmetric(lam, rng=gen)
    eig_A = eig(A)
    second = float(np.sort(np.abs(eig_A))[-2])
    layers = layers_for(second, SMOOTH_THRESHOLD * 1e-3)
    X0 = spectra.random_tokens(n, d, rng=gen)
    trajectory = iterate_quietly(linear_rule(A, H, skip=False), X0, layers, ("hfc_lfc",))
    return decades_below(float(metrics.hfc_lfc(trajectory.final)))


def _hfc_step_system(
    p: Mapping[str, Any],
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = attention(p["a_kind"], n, p["scale"], gen)
    M = gen.standard_normal((d, d)) * (p["m_scale"] / math.sqrt(d))
    X = spectra.random_tokens(n, d, rng=gen)
    centring = np.eye(n) - np.full((n, n), 1.0 / n)
    return A, M, X, centring


def _hfc_step_identity(p: Mapping[str, Any]) -> float:
    A, M, X, centring = _hfc_step_system(p)
    _, hfc = metrics.lfc_hfc_split(A @ X @ M)
    expected = centring @ A @ centring @ X @ M
    scale = float(np.linalg.norm(A @ X @ M)) + float(np.linalg.norm(X @ M))
    return tolerance_margin(relative(float(np.linalg.norm(hfc - expected)), scale), STEP_RTOL)


#: Round-off allowance of the S8 bounds, relative to ``(1 + sqrt(lambda_A) s_max(M)) ||HFC[X]||``.
BOUND_SLACK = 1e-10


def _hfc_step_bounds(p: Mapping[str, Any]) -> float:
    A, M, X, centring = _hfc_step_system(p)
    hfc_norm = float(np.linalg.norm(metrics.lfc_hfc_split(X)[1]))
    lam_A = float(np.linalg.eigvalsh(A.T @ centring @ A).max())
    factor = math.sqrt(max(lam_A, 0.0)) * float(np.linalg.norm(M, 2))
    branch = float(np.linalg.norm(metrics.lfc_hfc_split(A @ X @ M)[1]))
    step = float(np.linalg.norm(metrics.lfc_hfc_split(X + A @ X @ M)[1]))
    scale = hfc_norm * (1.0 + factor)
    slacks = [
        factor * hfc_norm - branch,
        (1.0 + factor) * hfc_norm - step,
        step - (1.0 - factor) * hfc_norm,
    ]
    return min(slacks) / scale + BOUND_SLACK


def _alternating_system(p: Mapping[str, Any], gen: np.random.Generator) -> LinearSystem:
    """A lazy ``A = (1 - alpha) I + alpha B`` (spectrum in [1 - 2 alpha, 1]) and H in (-2, -1)."""
    n, d = p["n"], p["d"]
    B = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    A = (1.0 - p["alpha"]) * np.eye(n) + p["alpha"] * B
    H = spectra.h_symmetric(
        uniform_spectrum(gen, d, p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    return LinearSystem(A, H, spectra.random_tokens(n, d, rng=gen))


def _alternating_accept(system: LinearSystem) -> bool:
    dom = theory.dominance(system.A, system.H)
    return dom.kind == "perron" and dom.mu.real < 0 and _perron_rate(system) <= 0.95


#: Layers after X_L over which consecutive states must point in opposite directions (claim 20).
ALTERNATION_LAYERS = 10


def _alternating_sign(p: Mapping[str, Any]) -> float:
    system = scan(p["seed"], lambda gen: _alternating_system(p, gen), _alternating_accept)
    rule = linear_rule(system.A, system.H)
    layers = layers_for(_perron_rate(system), SMOOTH_THRESHOLD * 1e-3)
    X = iterate_quietly(rule, system.X0, layers, ("hfc_lfc",)).final
    smoothing = _smoothing_decades(X)
    worst_cos = -1.0
    for layer in range(layers, layers + ALTERNATION_LAYERS):
        following = rule(X, layer, {})
        cos = float(np.sum(X * following) / (np.linalg.norm(X) * np.linalg.norm(following)))
        worst_cos, X = max(worst_cos, cos), following / np.linalg.norm(following)
    return min(smoothing, -worst_cos)


_DYNAMIC: dict[str, ParamSpec] = {"n": IntRange(4, 12), "d": IntRange(2, 8), "scale": SCALE_RANGE}

# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    Check(
        "positive_h_input_convergence",
        12,
        "positive H: HFC/LFC -> 0, mean cosine -> 1, sigma2/sigma1 -> 0 (S2)",
        DECADES + " (HFC/LFC, 1 - cos, sigma2/sigma1 below 1e-6)",
        {**_DYNAMIC, "h_low": FloatRange(0.2, 1.0), "h_ratio": FloatRange(1.0, 2.0), "seed": SEED},
        _positive_h_input_convergence,
    ),
    Check(
        "positive_h_rate",
        12,
        "positive H, separated spectra: log(HFC/LFC) decays with slope log(rho) (S2, S9)",
        TOLERANCE + " (relative slope error, tolerance 1e-3)",
        {
            "n": _DYNAMIC["n"],
            "d": IntRange(2, 4),
            "scale": FloatRange(1.2, 2.0),
            "h_low": FloatRange(0.05, 0.2),
            "h_high": FloatRange(0.6, 1.0),
            "seed": SEED,
        },
        _positive_h_rate,
    ),
    Check(
        "doubly_stochastic_divergence",
        13,
        "negative H, symmetric doubly stochastic A: HFC/LFC grows without bound, monotonically late on",
        "decades of HFC/LFC above 1e10 if never reached; else the smallest per-layer log-growth "
        "over the second half of the run (until 1e10) divided by the predicted log-growth",
        {
            **_DYNAMIC,
            "d": IntRange(1, 8),
            "h_low": FloatRange(0.2, 1.0),
            "h_ratio": FloatRange(0.25, 1.0),
            "seed": SEED,
        },
        _doubly_stochastic_divergence,
    ),
    Check(
        "non_perron_hfc_limit",
        14,
        "negative H, general A: HFC/LFC -> ||(I - Pi) u_1|| / ||Pi u_1||, finite and nonzero (S3a)",
        TOLERANCE + " (relative error, tolerance 1e-6)",
        {
            **_DYNAMIC,
            "scale": FloatRange(0.5, 2.0),
            "h_low": FloatRange(0.3, 1.0),
            "h_ratio": FloatRange(0.1, 1.0),
            "seed": SEED,
        },
        _non_perron_hfc_limit,
    ),
    Check(
        "non_perron_cosine_limit",
        15,
        "negative H, general A: mean cosine -> ((p - m)^2 - n) / (n (n - 1)) < 1 (S3b)",
        TOLERANCE + " (absolute error, tolerance 1e-6); 1 - limit for the strict inequality",
        {
            **_DYNAMIC,
            "scale": FloatRange(0.5, 2.0),
            "h_low": FloatRange(0.3, 1.0),
            "h_ratio": FloatRange(0.1, 1.0),
            "seed": SEED,
        },
        _non_perron_cosine_limit,
    ),
    Check(
        "non_perron_rank_collapse",
        16,
        "negative H, general A: sigma2/sigma1 -> 0, rank collapse still happens (S3c)",
        DECADES + " (sigma2/sigma1 below 1e-6)",
        {
            **_DYNAMIC,
            "scale": FloatRange(0.5, 2.0),
            "h_low": FloatRange(0.3, 1.0),
            "h_ratio": FloatRange(0.1, 1.0),
            "seed": SEED,
        },
        _non_perron_rank_collapse,
    ),
    Check(
        "balanced_no_rank_collapse",
        17,
        "H-eigenvalues {-lambda^A_1, -1, small}: sigma2/sigma1 -> the positive rank-2 limit (S4)",
        TOLERANCE + " (relative error to the predicted limit, tolerance 1e-6)",
        {
            "n": IntRange(4, 10),
            "d": IntRange(2, 6),
            "scale": FloatRange(1.0, 2.0),
            "small": FloatRange(0.0, 0.2),
            "seed": SEED,
        },
        _balanced_no_rank_collapse,
    ),
    Check(
        "balanced_perturbed_collapses",
        17,
        "S4 needs the exact tie: shifting -lambda^A_1 by 0.02-0.1 restores rank collapse",
        DECADES + " (sigma2/sigma1 below 1e-6)",
        {
            "n": IntRange(4, 10),
            "d": IntRange(2, 6),
            "scale": FloatRange(1.0, 2.0),
            "small": FloatRange(0.0, 0.2),
            "epsilon": FloatRange(0.02, 0.1),
            "sign": Choice((1.0, -1.0)),
            "seed": SEED,
        },
        _balanced_perturbed_collapses,
        counterexample=True,
    ),
    Check(
        "no_skip_low_pass",
        18,
        "without the skip, X_l = A X_{l-1} M: HFC/LFC -> 0 whatever spec(H) (S7)",
        DECADES + " (HFC/LFC below 1e-6)",
        {
            "n": N_RANGE,
            "d": D_RANGE,
            "scale": SCALE_RANGE,
            "h_radius": FloatRange(0.1, 3.0),
            "h_kind": Choice(("real", "complex")),
            "seed": SEED,
        },
        _no_skip_low_pass,
    ),
    Check(
        "hfc_step_identity",
        19,
        "HFC[A X M] = (I - Pi) A (I - Pi) X M exactly (S8)",
        TOLERANCE,
        {
            "n": N_RANGE,
            "d": D_RANGE,
            "scale": SCALE_RANGE,
            "a_kind": Choice(("general", "symmetric")),
            "m_scale": FloatRange(0.1, 3.0),
            "seed": SEED,
        },
        _hfc_step_identity,
    ),
    Check(
        "hfc_step_bounds",
        19,
        "||HFC[A X M]|| <= sqrt(lambda_A) s_max(M) ||HFC[X]||, and the two-sided bound with skip (S8)",
        "relative slack: min over the three bounds of (bound - value) / "
        "((1 + sqrt(lambda_A) s_max(M)) ||HFC[X]||), + 1e-10 round-off allowance",
        {
            "n": N_RANGE,
            "d": D_RANGE,
            "scale": SCALE_RANGE,
            "a_kind": Choice(("general", "symmetric")),
            "m_scale": FloatRange(0.1, 3.0),
            "seed": SEED,
        },
        _hfc_step_bounds,
    ),
    Check(
        "alternating_sign",
        20,
        "Perron dominance with mu* < 0: X_L alternates sign while the metrics still converge",
        DECADES + " (HFC/LFC, 1 - cos, sigma2/sigma1 below 1e-6); -cos(X_l, X_{l+1}) over the "
        "10 layers after X_L for the sign alternation",
        {
            "n": IntRange(3, 10),
            "d": IntRange(1, 6),
            "scale": SCALE_RANGE,
            "alpha": FloatRange(0.1, 0.3),
            "h_low": FloatRange(-1.95, -1.6),
            "h_ratio": FloatRange(0.8, 1.0),
            "seed": SEED,
        },
        _alternating_sign,
    ),
)
