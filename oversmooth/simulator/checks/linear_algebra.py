"""Claims 1-11: Lemma 1 and its eigen-structure, the attention spectrum, the closed form, the
frequency metrics, and which kind of eigenvalue dominates (S1, S5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from oversmooth.simulator import metrics, spectra, theory
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
    N_RANGE,
    SCALE_RANGE,
    attention,
    eig,
    kind_margin,
    linear_rule,
    matched_error,
    max_abs,
    modulus_gap,
    orthogonal,
    relative,
    tolerance_margin,
    uniform_spectrum,
)
from oversmooth.simulator.tolerances import EIG_TOL, STEP_RTOL
from oversmooth.simulator.validation import FloatArray

# ----------------------------------------------------------------------------------------------
# claims 1-5: linear algebra
# ----------------------------------------------------------------------------------------------

_SMALL = {"n": IntRange(2, 6), "d": IntRange(1, 5)}


def _vec_identity(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_general(n, rng=gen)
    X = spectra.random_tokens(n, d, rng=gen)
    M = gen.standard_normal((d, d)) / math.sqrt(d)
    lhs = (X + A @ X @ M).flatten(order="F")
    rhs = (np.eye(n * d) + np.kron(M.T, A)) @ X.flatten(order="F")
    return tolerance_margin(relative(max_abs(lhs - rhs), max_abs(lhs)), STEP_RTOL)


def _lemma1_system(p: Mapping[str, Any]) -> tuple[FloatArray, FloatArray]:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    if p["a_kind"] == "symmetric":
        A = spectra.attention_symmetric_scores(n, rng=gen)
    else:
        A = spectra.attention_general(n, rng=gen)
    lam = gen.uniform(-2.0, 2.0, d).astype(complex)
    if p["h_kind"] == "complex" and d >= 2:
        z = complex(gen.uniform(-2.0, 2.0), gen.uniform(0.1, 1.0))
        lam[:2] = (z, z.conjugate())
    return A, spectra.h_nonsymmetric(lam, rng=gen)


def _lemma1_eigenvalues(p: Mapping[str, Any]) -> float:
    A, H = _lemma1_system(p)
    dense = np.linalg.eigvals(np.eye(A.shape[0] * H.shape[0]) + np.kron(H, A))
    predicted = theory.kron_eigenvalues(eig(A), eig(H))
    error = matched_error(dense, predicted)
    return tolerance_margin(relative(error, 1.0 + max_abs(predicted)), EIG_TOL)


def _lemma1_eigenvectors(p: Mapping[str, Any]) -> float:
    A, H = _lemma1_system(p)
    T_ = np.eye(A.shape[0] * H.shape[0]) + np.kron(H, A)
    lam_A, U = np.linalg.eig(A)
    lam_H, S = np.linalg.eig(H)
    mu = theory.kron_eigenvalues(lam_A, lam_H)
    worst = 0.0
    for i in range(A.shape[0]):
        for j in range(H.shape[0]):
            v = np.outer(U[:, i], S[:, j]).flatten(order="F")
            residual = np.linalg.norm(T_ @ v - mu[i, j] * v) / np.linalg.norm(v)
            worst = max(worst, float(residual))
    return tolerance_margin(relative(worst, 1.0 + max_abs(mu)), EIG_TOL)


def _perron_conditions(A: FloatArray, eig_tol: float) -> list[float]:
    """Margins of: A 1 = 1, a root at 1, and the gap ``1 - max |lambda_i|`` of the others."""
    lam = eig(A)
    p = int(theory.perron_index(lam))
    others = np.delete(lam, p)
    row_sums = max_abs(A.sum(axis=1) - 1.0)
    return [
        tolerance_margin(row_sums, STEP_RTOL),
        tolerance_margin(abs(lam[p] - 1.0), eig_tol),
        float(1.0 - np.abs(others).max()),
    ]


def _perron_root_real(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores=p["scores"], rng=gen)
    lam = eig(A)
    imaginary = tolerance_margin(float(np.abs(lam.imag).max()), EIG_TOL)
    return min(imaginary, *_perron_conditions(A, EIG_TOL))


def _perron_root_general(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_general(p["n"], scale=p["scale"], rng=gen)
    return min(_perron_conditions(A, EIG_TOL))


def _psd_scores_spectrum(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n = p["n"]
    A = spectra.attention_symmetric_scores(
        n, scale=p["scale"], scores="psd", rank=min(p["rank"], n), rng=gen
    )
    lam = eig(A)
    return min(
        tolerance_margin(float(np.abs(lam.imag).max()), EIG_TOL),
        tolerance_margin(float(-lam.real.min()), EIG_TOL),
        tolerance_margin(float(lam.real.max() - 1.0), EIG_TOL),
    )


def _closed_form(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, L = p["n"], p["d"], p["layers"]
    A = spectra.attention_symmetric_scores(n, rng=gen)
    H = spectra.h_symmetric(
        uniform_spectrum(gen, d, p["h_low"], p["h_low"] + p["h_width"]), rng=gen
    )
    X0 = spectra.random_tokens(n, d, rng=gen)
    cache: dict[str, Any] = {}
    rule, X = linear_rule(A, H), X0.copy()
    for layer in range(L):
        X = rule(X, layer, cache)
    term, total, magnitude = X0.copy(), np.zeros_like(X0), 0.0
    for k in range(L + 1):
        weight = math.comb(L, k)
        total += weight * term
        magnitude += weight * float(np.linalg.norm(term))
        term = A @ term @ H.T
    error = float(np.linalg.norm(X - total))
    return tolerance_margin(relative(error, magnitude), 100 * STEP_RTOL)


# ----------------------------------------------------------------------------------------------
# claims 6-7: frequency metrics
# ----------------------------------------------------------------------------------------------


def _frequency_split(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    X = (spectra.random_tokens(p["n"], p["d"], rng=gen) + p["offset"]) * 10.0 ** p["log10_scale"]
    lfc, hfc = metrics.lfc_hfc_split(X)
    norm = float(np.linalg.norm(X))
    lfc_norm = float(np.linalg.norm(lfc))
    s = np.linalg.svd(lfc, compute_uv=False)
    errors = [
        relative(max_abs(lfc + hfc - X), max_abs(X)),
        relative(abs(norm**2 - lfc_norm**2 - float(np.linalg.norm(hfc)) ** 2), norm**2),
        relative(float(s[1]) if s.size > 1 else 0.0, norm),
        relative(abs(float(s[0]) - lfc_norm), norm),
    ]
    return tolerance_margin(max(errors), STEP_RTOL)


def _metric_invariance(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    X = spectra.random_tokens(p["n"], p["d"], rng=gen)
    c = p["sign"] * 10.0 ** p["log10_c"]
    Q = orthogonal(p["d"], gen)
    ratio, ratio_scaled, ratio_rotated = (float(metrics.hfc_lfc(Y)) for Y in (X, c * X, X @ Q))
    errors = [
        relative(abs(ratio_scaled - ratio), ratio),
        relative(abs(ratio_rotated - ratio), ratio),
        abs(float(metrics.cosine(c * X) - metrics.cosine(X))),
        abs(float(metrics.sigma_ratio(c * X) - metrics.sigma_ratio(X))),
        abs(float(metrics.sigma_ratio(X @ Q) - metrics.sigma_ratio(X))),
    ]
    return tolerance_margin(max(errors), 1e3 * STEP_RTOL)


# ----------------------------------------------------------------------------------------------
# claims 8-11: which eigenvalue dominates
# ----------------------------------------------------------------------------------------------


def _value_matrix(kind: str, eigenvalues: FloatArray, gen: np.random.Generator) -> FloatArray:
    if kind == "symmetric":
        return spectra.h_symmetric(eigenvalues, rng=gen)
    return spectra.h_nonsymmetric(eigenvalues, rng=gen)


def _corner_theorem(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores=p["scores"], rng=gen)
    lam_H = uniform_spectrum(gen, p["d"], p["h_low"], p["h_low"] + p["h_width"])
    eig_A = np.sort(eig(A).real)
    eig_H = np.sort(np.linalg.eigvalsh(spectra.h_symmetric(lam_H, rng=gen)))
    top = float(np.abs(theory.kron_eigenvalues(eig_A, eig_H)).max())
    corners = [abs(1 + h * a) for h in (eig_H[0], eig_H[-1]) for a in (eig_A[0], eig_A[-1])]
    return tolerance_margin(relative(abs(top - max(corners)), top), STEP_RTOL)


def _signed_dominance(p: Mapping[str, Any], sign: float, *, perron: bool) -> float:
    gen = np.random.default_rng(p["seed"])
    A = attention(p["a_kind"], p["n"], p["scale"], gen)
    magnitudes = uniform_spectrum(gen, p["d"], p["h_low"], p["h_low"] * p["h_ratio"])
    H = _value_matrix(p["h_kind"], sign * magnitudes, gen)
    return kind_margin(eig(A), eig(H), perron=perron)


def _positive_h_perron(p: Mapping[str, Any]) -> float:
    return _signed_dominance(p, 1.0, perron=True)


def _negative_h_non_perron(p: Mapping[str, Any]) -> float:
    return _signed_dominance(p, -1.0, perron=False)


def _s5_bound_2x2(p: Mapping[str, Any]) -> float:
    a = p["a"]
    A = np.array([[1.0 - a, a], [a, 1.0 - a]])
    H = np.array([[p["h"]]])
    dom = theory.dominance(A, H)
    gap = modulus_gap(dom.eig_A, dom.eig_H, perron=True)
    return gap if dom.kind == "perron" else min(gap, -1.0)


def _s5_bound_psd(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores="psd", rng=gen)
    H = spectra.h_symmetric(
        uniform_spectrum(gen, p["d"], p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    dom = theory.dominance(A, H)
    gap = modulus_gap(dom.eig_A, dom.eig_H, perron=True)
    return gap if dom.kind == "perron" else min(gap, -1.0)


def _s5_complex_h(p: Mapping[str, Any]) -> float:
    """Complex pairs ``x ± iy``, x in [-1, 0), outside the disk D_{1-alpha} of S5c (docs/theory.md).

    ``A = (1 - alpha) I + alpha B`` with PSD-score B has spec(A) in [1 - alpha, 1], and the disks
    ``|z + 1/(1+t)| < 1/(1+t)`` shrink as t grows, so outside D_{1-alpha} every pair's Perron value
    ``|1 + z|`` beats ``|1 + t z|`` for every non-Perron t: the Perron row dominates.
    """
    gen = np.random.default_rng(p["seed"])
    n, alpha = p["n"], p["alpha"]
    B = spectra.attention_symmetric_scores(n, scale=p["scale"], scores="psd", rng=gen)
    A = (1.0 - alpha) * np.eye(n) + alpha * B
    x = gen.uniform(-1.0, 0.0, p["pairs"])  # Re lambda^H in [-1, 0): inside S5's real interval
    boundary = np.sqrt(np.maximum(-2.0 * x / (2.0 - alpha) - x**2, 0.0))
    z = x + 1j * (boundary + gen.uniform(0.1, 1.0, p["pairs"]))
    H = spectra.h_nonsymmetric(np.concatenate([z, z.conj()]), rng=gen)
    return kind_margin(eig(A), eig(H), perron=True)


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    Check(
        "vec_identity",
        1,
        "vec(X + A X M) = (I + kron(M^T, A)) vec(X) with column-stacking vec",
        TOLERANCE,
        {**_SMALL, "n": IntRange(2, 8), "seed": SEED},
        _vec_identity,
    ),
    Check(
        "lemma1_eigenvalues",
        2,
        "eig(I + H ⊗ A) = {1 + lambda^H_j lambda^A_i} as multisets (complex spectra allowed)",
        TOLERANCE,
        {
            **_SMALL,
            "a_kind": Choice(("symmetric", "general")),
            "h_kind": Choice(("real", "complex")),
            "seed": SEED,
        },
        _lemma1_eigenvalues,
    ),
    Check(
        "lemma1_eigenvectors",
        2,
        "(I + H ⊗ A) vec(u_i s_j^T) = mu_ij vec(u_i s_j^T) for eigenvectors u_i of A, s_j of H",
        TOLERANCE,
        {
            **_SMALL,
            "a_kind": Choice(("symmetric", "general")),
            "h_kind": Choice(("real", "complex")),
            "seed": SEED,
        },
        _lemma1_eigenvectors,
    ),
    Check(
        "perron_root_real",
        3,
        "symmetric-score A: real spectrum, A1 = 1, the root 1 simple, all others in (-1, 1)",
        TOLERANCE + "; spectral gap 1 - max|lambda_i| for the strict inequality",
        {
            "n": IntRange(2, 16),
            "scale": FloatRange(0.2, 2.0),
            "scores": Choice(("psd", "indefinite")),
            "seed": SEED,
        },
        _perron_root_real,
    ),
    Check(
        "perron_root_general",
        3,
        "any positive row-stochastic A: |lambda_i| < 1 except the Perron root 1",
        TOLERANCE + "; spectral gap 1 - max|lambda_i| for the strict inequality",
        {"n": IntRange(2, 16), "scale": FloatRange(0.2, 2.0), "seed": SEED},
        _perron_root_general,
    ),
    Check(
        "psd_scores_spectrum",
        4,
        "PSD scores S = X B X^T (B >= 0) give spec(A) in [0, 1]",
        TOLERANCE,
        {
            "n": IntRange(2, 16),
            "scale": FloatRange(0.2, 3.0),
            "rank": IntRange(1, 16),
            "seed": SEED,
        },
        _psd_scores_spectrum,
    ),
    Check(
        "closed_form",
        5,
        "X_L = sum_k C(L, k) A^k X_0 M^k matches L iterated layers",
        TOLERANCE + " (error relative to sum_k C(L,k) ||A^k X_0 M^k||, tolerance 1e-10)",
        {
            **_SMALL,
            "n": IntRange(2, 8),
            "layers": IntRange(1, 30),
            "h_low": FloatRange(-1.5, 0.5),
            "h_width": FloatRange(0.0, 1.5),
            "seed": SEED,
        },
        _closed_form,
    ),
    Check(
        "frequency_split",
        6,
        "LFC + HFC = X, Pythagoras in Frobenius norm, rank(LFC) <= 1, ||LFC||_2 = ||LFC||_F",
        TOLERANCE,
        {
            "n": IntRange(2, 16),
            "d": D_RANGE,
            "log10_scale": FloatRange(-3.0, 3.0),
            "offset": FloatRange(-3.0, 3.0),
            "seed": SEED,
        },
        _frequency_split,
    ),
    Check(
        "metric_invariance",
        7,
        "HFC/LFC, mean cosine, sigma2/sigma1 invariant to X -> cX; HFC/LFC, sigma2/sigma1 to X -> XQ",
        TOLERANCE + " (tolerance 1e-9)",
        {
            "n": N_RANGE,
            "d": IntRange(2, 8),
            "log10_c": FloatRange(-3.0, 3.0),
            "sign": Choice((1.0, -1.0)),
            "seed": SEED,
        },
        _metric_invariance,
    ),
    Check(
        "corner_theorem",
        8,
        "max |1 + lambda^H_j lambda^A_i| is attained at one of the 4 corner values (S1)",
        TOLERANCE,
        {
            "n": IntRange(2, 16),
            "d": IntRange(1, 12),
            "scale": FloatRange(0.5, 3.0),
            "scores": Choice(("psd", "indefinite")),
            "h_low": FloatRange(-3.0, 1.0),
            "h_width": FloatRange(0.0, 3.0),
            "seed": SEED,
        },
        _corner_theorem,
    ),
    Check(
        "positive_h_perron",
        9,
        "all lambda^H > 0 => the dominating eigenvalue is Perron-type, for any positive stochastic A",
        GAP,
        {
            "n": IntRange(2, 16),
            "d": D_RANGE,
            "scale": FloatRange(0.5, 2.0),
            "a_kind": Choice(("general", "symmetric")),
            "h_kind": Choice(("symmetric", "nonsymmetric")),
            "h_low": FloatRange(0.01, 2.0),
            "h_ratio": FloatRange(1.0, 3.0),
            "seed": SEED,
        },
        _positive_h_perron,
    ),
    Check(
        "negative_h_non_perron",
        10,
        "all lambda^H in [-1, 0) => no Perron-type eigenvalue dominates, for any positive stochastic A",
        GAP,
        {
            "n": IntRange(2, 16),
            "d": D_RANGE,
            "scale": FloatRange(0.5, 2.0),
            "a_kind": Choice(("general", "symmetric")),
            "h_kind": Choice(("symmetric", "nonsymmetric")),
            "h_low": FloatRange(0.01, 1.0),
            "h_ratio": FloatRange(0.01, 1.0),
            "seed": SEED,
        },
        _negative_h_non_perron,
    ),
    Check(
        "s5_bound_needed_2x2",
        11,
        "S5 fails outside [-1, 0): lambda^H in [-6, -1.5] with A = [[1-a, a], [a, 1-a]] is Perron-dominated",
        GAP,
        {"a": FloatRange(0.2, 0.3), "h": FloatRange(-6.0, -1.5)},
        _s5_bound_2x2,
        counterexample=True,
    ),
    Check(
        "s5_bound_needed_psd",
        11,
        "S5 fails outside [-1, 0): min lambda^H < -2 with spec(A) in [0, 1) is Perron-dominated",
        GAP,
        {
            "n": N_RANGE,
            "d": IntRange(1, 6),
            "scale": SCALE_RANGE,
            "h_low": FloatRange(-8.0, -2.2),
            "h_ratio": FloatRange(0.0, 1.0),
            "seed": SEED,
        },
        _s5_bound_psd,
        counterexample=True,
    ),
    Check(
        "s5_needs_real_h",
        11,
        "S5 needs real lambda^H: pairs x ± iy, x in [-1, 0), with y^2 > -2x/(2-a) - x^2 and "
        "spec(A) in [1-a, 1] are Perron-dominated",
        GAP,
        {
            "n": N_RANGE,
            "pairs": IntRange(1, 4),
            "scale": SCALE_RANGE,
            "alpha": FloatRange(0.2, 0.9),
            "seed": SEED,
        },
        _s5_complex_h,
        counterexample=True,
    ),
)
