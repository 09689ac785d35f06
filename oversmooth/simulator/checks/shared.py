"""Helpers shared by the claim modules: margins, system builders, iteration and seed scans.

Public API
----------
tolerance_margin, decades_below, decades_above, kind_margin, modulus_gap
    The margin units of :mod:`oversmooth.simulator.checks` (``tolerance``, ``decades``, ``gap``).
relative, max_abs, matched_error, eig, rows_rate
    Errors, spectra and the convergence rate of a linear system.
orthogonal, uniform_spectrum, attention, dense_system, linear_rule, LinearSystem
    Builders of random instances.
iterate_quietly, layers_for, scan
    Iteration without the floor warning, layer budgets, and seed scans for filtered instances.
N_RANGE, D_RANGE, SCALE_RANGE
    Parameter spaces of tokens, features and attention scale used by several claim groups.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import linear_sum_assignment

from oversmooth.simulator import dynamics, spectra, theory, updates
from oversmooth.simulator.checks.core import (
    MAX_LAYERS,
    SCAN_TRIES,
    FloatRange,
    IntRange,
)
from oversmooth.simulator.errors import NumericalFloorWarning
from oversmooth.simulator.tolerances import EPS, SMOOTH_THRESHOLD, TIE_RTOL
from oversmooth.simulator.validation import FloatArray

_T = TypeVar("_T")


# ----------------------------------------------------------------------------------------------
# margins and small helpers
# ----------------------------------------------------------------------------------------------


def tolerance_margin(violation: float, tolerance: float) -> float:
    """``1 - violation / tolerance``; NaN violations count as failures."""
    return 1.0 - violation / tolerance if math.isfinite(violation) else -math.inf


def decades_below(value: float, threshold: float = SMOOTH_THRESHOLD) -> float:
    """``log10(threshold / value)`` with value floored at eps; NaN counts as a failure."""
    if not math.isfinite(value):
        return -math.inf
    return math.log10(threshold) - math.log10(max(abs(value), EPS))


def decades_above(value: float, threshold: float) -> float:
    """``log10(value / threshold)`` for a quantity that must stay above a threshold."""
    if math.isnan(value) or value <= 0:
        return -math.inf
    return math.log10(value) - math.log10(threshold)


def relative(error: float, scale: float) -> float:
    """``error / scale``, with ``scale`` floored at the smallest normal float64."""
    return error / max(scale, np.finfo(np.float64).tiny)


def max_abs(X: ArrayLike) -> float:
    """Largest absolute entry."""
    return float(np.max(np.abs(X)))


def orthogonal(d: int, gen: np.random.Generator) -> FloatArray:
    """A Haar-random ``(d, d)`` orthogonal matrix."""
    Q, R = np.linalg.qr(gen.standard_normal((d, d)))
    return Q * np.sign(np.diagonal(R))


def uniform_spectrum(gen: np.random.Generator, d: int, low: float, high: float) -> FloatArray:
    """``d`` eigenvalues in ``[min(low, high), max(low, high)]``, the first one exactly ``low``."""
    values = gen.uniform(min(low, high), max(low, high), d)
    values[0] = low
    return values


def linear_rule(A: FloatArray, H: FloatArray, *, skip: bool = True) -> updates.LinearRule:
    """The update ``X + A X M`` with ``M = H^T`` (``W_V = M``, ``W_proj = I``)."""
    return updates.LinearRule(A, np.swapaxes(H, -1, -2), np.eye(H.shape[-1]), skip=skip)


def matched_error(a: ArrayLike, b: ArrayLike) -> float:
    """Largest distance between two multisets of complex numbers under the best matching."""
    a, b = np.ravel(a).astype(complex), np.ravel(b).astype(complex)
    cost = np.abs(a[:, None] - b[None, :])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


def modulus_gap(eig_A: ArrayLike, eig_H: ArrayLike, *, perron: bool) -> float:
    """Relative gap between the Perron and the non-Perron maximal ``|mu|`` (the ``gap`` unit).

    Positive when the required kind (Perron if ``perron`` else non-Perron) strictly dominates.
    """
    mu = np.abs(theory.kron_eigenvalues(eig_A, eig_H))
    p = int(theory.perron_index(eig_A))
    perron_top = mu[p].max()
    other_top = np.delete(mu, p, axis=0).max()
    gap = perron_top - other_top if perron else other_top - perron_top
    return float(gap / mu.max()) + TIE_RTOL


def iterate_quietly(
    rule: updates.UpdateRule, X0: FloatArray, layers: int, names: Sequence[str]
) -> dynamics.Trajectory:
    """``dynamics.iterate`` with the floor warning silenced (reaching the floor is the point)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalFloorWarning)
        return dynamics.iterate(rule, X0, layers, metrics=tuple(names))


def layers_for(rate: float, target: float, extra: int = 10) -> int:
    """Layers for a geometric factor ``rate`` to shrink a quantity by ``target``, capped."""
    if rate <= 0:
        return extra
    if rate >= 1:
        return MAX_LAYERS
    return min(MAX_LAYERS, math.ceil(math.log(target) / math.log(rate)) + extra)


class _NoInstanceError(RuntimeError):
    """No seed of the scan passed the check's filter."""


def scan(seed: int, build: Callable[[np.random.Generator], _T], accept: Callable[[_T], bool]) -> _T:
    """The first instance ``build(default_rng([seed, k]))`` (k = 0, 1, ...) that ``accept`` keeps."""
    for attempt in range(SCAN_TRIES):
        instance = build(np.random.default_rng([seed, attempt]))
        if accept(instance):
            return instance
    raise _NoInstanceError(f"no instance passed the filter in {SCAN_TRIES} seeds from seed {seed}")


class LinearSystem(NamedTuple):
    """One linear system ``X + A X H^T`` with its initial tokens."""

    A: FloatArray
    H: FloatArray
    X0: FloatArray


def eig(A: FloatArray) -> NDArray[np.complex128]:
    """Eigenvalues of a square matrix, as complex128."""
    return np.linalg.eigvals(A).astype(np.complex128)


def rows_rate(system: LinearSystem) -> tuple[float, int]:
    """``max_{i != i*} |mu_ij| / |mu*|`` and the dominating A-index ``i*`` (first of the ties).

    Modes sharing the A-eigenvector of the dominating one keep ``u_i* x^T`` rank one, so only the
    other rows set the convergence of HFC/LFC, the cosine and sigma_2/sigma_1 (S3, S9).
    """
    mu = np.abs(theory.kron_eigenvalues(eig(system.A), eig(system.H)))
    i_star = int(np.unravel_index(np.argmax(mu), mu.shape)[0])
    return float(np.delete(mu, i_star, axis=0).max() / mu.max()), i_star


# ----------------------------------------------------------------------------------------------
# builders used by several claim groups
# ----------------------------------------------------------------------------------------------


def attention(kind: str, n: int, scale: float, gen: np.random.Generator) -> FloatArray:
    """An ``(n, n)`` attention matrix: ``symmetric`` scores, or else ``general``."""
    if kind == "symmetric":
        return spectra.attention_symmetric_scores(n, scale=scale, rng=gen)
    return spectra.attention_general(n, scale=scale, rng=gen)


def kind_margin(eig_A: ArrayLike, eig_H: ArrayLike, *, perron: bool) -> float:
    """The ``gap`` margin, or -1 when theory.dominance_kinds disagrees outside a tie."""
    kind = theory.KINDS[int(theory.dominance_kinds(eig_A, eig_H))]
    gap = modulus_gap(eig_A, eig_H, perron=perron)
    agrees = (kind == "perron") == perron or gap <= 2 * TIE_RTOL
    return gap if agrees else min(gap, -1.0)


def dense_system(p: Mapping[str, Any]) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``(A, W_V, W_proj, X0)`` with dense Gaussian weights, drawn from ``p["seed"]``."""
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, rng=gen)
    W_V = gen.standard_normal((d, d)) / math.sqrt(d)
    W_proj = gen.standard_normal((d, d)) / math.sqrt(d)
    return A, W_V, W_proj, spectra.random_tokens(n, d, rng=gen)


# ----------------------------------------------------------------------------------------------
# parameter-space pieces shared by the registries
# ----------------------------------------------------------------------------------------------

N_RANGE = IntRange(2, 12)
D_RANGE = IntRange(1, 8)
SCALE_RANGE = FloatRange(0.5, 1.5)
