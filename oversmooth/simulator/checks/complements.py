"""Claims 34-35: S5 for complex value spectra (the disks of S5c) and the LFC block of a multi-head
layer (docs/theory.md §3.2, §3.3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator import spectra, theory
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
    N_RANGE,
    eig,
    kind_margin,
    matched_error,
    max_abs,
    relative,
    tolerance_margin,
)
from oversmooth.simulator.tolerances import EIG_TOL
from oversmooth.simulator.validation import FloatArray

# ----------------------------------------------------------------------------------------------
# claim 34: S5c, the disks D_w
# ----------------------------------------------------------------------------------------------

#: Points drawn outside every disk keep at least this relative distance from its boundary.
DISK_CLEARANCE = 0.05
#: Rejection-sampling tries per eigenvalue drawn outside the disks before the fallback.
_OUTSIDE_TRIES = 1000


def disk_centers(eig_A: ArrayLike) -> NDArray[np.complex128]:
    """Centres ``c_w = (conj(w) - 1) / (1 - |w|^2)`` of the disks D_w, one per non-Perron w.

    ``|1 + w z| > |1 + z|`` exactly when ``|z - c_w| < |c_w|`` (S5c); every D_w passes through 0.
    """
    lam = np.asarray(eig_A, dtype=np.complex128)
    others = np.delete(lam, int(theory.perron_index(lam)))
    return (others.conj() - 1.0) / (1.0 - np.abs(others) ** 2)


def _inside_point(c: complex, depth: float, gen: np.random.Generator, *, real: bool) -> complex:
    """A point of D_w at relative distance at most ``depth`` from its centre (real if ``real``)."""
    r = gen.uniform(0.0, depth)
    if real:  # D_w ∩ R = (2 Re c, 0); the real point at relative distance r
        return complex(c.real * (1.0 + r * gen.choice([-1.0, 1.0])))
    return complex(c + abs(c) * r * np.exp(1j * gen.uniform(0.0, 2.0 * math.pi)))


def _outside_point(
    centers: NDArray[np.complex128], gen: np.random.Generator, *, real: bool
) -> complex:
    """A point outside every closed D_w by the relative clearance :data:`DISK_CLEARANCE`."""
    radius = 1.0 + DISK_CLEARANCE
    for _ in range(_OUTSIDE_TRIES):
        z = complex(gen.uniform(-4.0, 3.0), 0.0 if real else gen.uniform(0.0, 3.0))
        if np.all(np.abs(z - centers) >= radius * np.abs(centers)):
            return z
    # A positive real z has |z - c| > z for Re c < 0, so this one is outside every disk.
    return complex(radius * float(np.abs(centers).max()) + 0.1)


def disk_spectrum(
    p: Mapping[str, Any], eig_A: ArrayLike, gen: np.random.Generator
) -> list[complex]:
    """``d`` eigenvalues of H, closed under conjugation: complex pairs first, then real values.

    Inside: each one in the disk of a randomly chosen non-Perron w (a pair's conjugate lies in
    D_conj(w), conj(w) being an eigenvalue of the real A too). Outside: outside every disk.
    """
    d = p["d"]
    centers = disk_centers(eig_A)
    pairs = int(gen.integers(0, d // 2 + 1))
    values: list[complex] = []
    for k in range(d - pairs):
        real = k >= pairs
        if p["side"] == "inside":
            c = complex(centers[int(gen.integers(centers.size))])
            z = _inside_point(c, p["depth"], gen, real=real)
        else:
            z = _outside_point(centers, gen, real=real)
        values += [z] if real else [z, z.conjugate()]
    return values


def _s5_disks(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n = p["n"]
    if p["a_kind"] == "general":
        A = spectra.attention_general(n, scale=p["scale"], rng=gen)
    elif p["a_kind"] == "psd":
        A = spectra.attention_symmetric_scores(n, scale=p["scale"], scores="psd", rng=gen)
    else:
        A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    eig_A = eig(A)
    H = spectra.h_nonsymmetric(disk_spectrum(p, eig_A, gen), rng=gen)
    return kind_margin(eig_A, eig(H), perron=p["side"] == "outside")


# ----------------------------------------------------------------------------------------------
# claim 35: the LFC block of a multi-head layer
# ----------------------------------------------------------------------------------------------


def multi_head_system(
    p: Mapping[str, Any],
) -> tuple[list[FloatArray], list[FloatArray], FloatArray]:
    """Attention matrices A_h, value-projection products M_h of rank d_h < d, and the dense T.

    ``T = I + sum_h M_h^T ⊗ A_h`` is the vec form of ``X + sum_h A_h X M_h``.
    """
    gen = np.random.default_rng(p["seed"])
    n, d, heads = p["n"], p["d"], p["heads"]
    A, M = [], []
    for _ in range(heads):
        if p["a_kind"] == "general":
            A.append(spectra.attention_general(n, rng=gen))
        else:
            A.append(spectra.attention_symmetric_scores(n, rng=gen))
        d_h = int(gen.integers(1, d))  # low rank: 1 <= d_h < d
        W_V = gen.standard_normal((d, d_h)) / math.sqrt(d)
        W_proj = gen.standard_normal((d_h, d)) / math.sqrt(d_h)
        M.append(W_V @ W_proj)
    T = np.eye(n * d) + sum(np.kron(M_h.T, A_h) for M_h, A_h in zip(M, A, strict=True))
    return A, M, T


def _lfc_block(p: Mapping[str, Any]) -> float:
    A, M, T = multi_head_system(p)
    n, d = A[0].shape[0], M[0].shape[0]
    total = np.sum(M, axis=0)
    nu, S = np.linalg.eig(np.eye(d) + total.T)  # T acts on 1 s^T as s -> (I + sum_h M_h)^T s
    dense = np.linalg.eigvals(T)
    scale = 1.0 + max_abs(dense)
    errors = [relative(matched_error(nu, dense), scale)]
    for k in range(d):
        v = np.outer(np.ones(n), S[:, k]).flatten(order="F")
        residual = float(np.linalg.norm(T @ v - nu[k] * v) / np.linalg.norm(v))
        errors.append(relative(residual, scale))
    return tolerance_margin(max(errors), EIG_TOL)


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (
    Check(
        "s5_complex_disks",
        34,
        "S5c: every lambda^H in some disk |z - c_w| < |c_w|, c_w = (conj(w) - 1)/(1 - |w|^2), w a "
        "non-Perron eigenvalue of A => no Perron-type dominance; every lambda^H outside all => Perron",
        GAP + ", in the direction the side of the disks predicts",
        {
            "n": N_RANGE,
            "d": IntRange(1, 8),
            "scale": FloatRange(0.5, 2.0),
            "a_kind": Choice(("general", "symmetric", "psd")),
            "side": Choice(("inside", "outside")),
            "depth": FloatRange(0.05, 0.9),
            "seed": SEED,
        },
        _s5_disks,
    ),
    Check(
        "multi_head_lfc_block",
        35,
        "identity: for row-stochastic A_h, 1 + eig(sum_h M_h) are eigenvalues of "
        "I + sum_h M_h^T ⊗ A_h, with eigenvectors vec(1 s^T)",
        TOLERANCE + " (eigenvalues matched into dense eig(T), and eigenvector residuals; EIG_TOL)",
        {
            "n": IntRange(2, 10),
            "d": IntRange(2, 8),
            "heads": IntRange(1, 4),
            "a_kind": Choice(("general", "symmetric")),
            "seed": SEED,
        },
        _lfc_block,
    ),
)
