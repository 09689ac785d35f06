"""The paper's checkable claims 1-30 (paper-spec §8) as data: draw an instance, run it, get a margin.

Every :class:`Check` draws the parameters of one random instance (sizes, spectrum ranges, a scale
and a seed: a small dict of ints, floats and strings described by :attr:`Check.space`) and runs
it, returning a **margin**: ``>= 0`` when the claim held on that instance, negative for a
counterexample. Its unit is stated per check (:attr:`Check.unit`); the common ones are

- ``tolerance``: ``1 - violation / tolerance`` (1 is exact, 0 is the tolerance, > 1 strictly inside
  an inequality);
- ``decades``: ``log10(threshold / value)`` for a quantity that must fall below a threshold (capped
  at the float64 floor, so at most ``log10(threshold / eps)``);
- ``gap``: the relative modulus gap ``(|mu_a| - |mu_b|) / max |mu|`` between the eigenvalue kind
  that must dominate and the other kind, plus the tie allowance :data:`TIE_RTOL`.

Where the paper's implication can fail outside its hypothesis (claim 11, claim 17's perturbed
balance) a check with ``counterexample=True`` asserts that it does fail; its margin measures the
failure. :func:`verify` runs every check on many drawn instances and returns
:class:`CheckResult` data; a failed claim is data, never an exception.

Claims 12-17 and 20 need long runs. Their instances are kept moderate (n, d <= 12, at most a few
thousand layers), and where a claim is only testable on well-separated spectra the check scans the
seeds ``[seed, 0], [seed, 1], ...`` for the first instance passing the filter the spec describes.
"""

from __future__ import annotations

import math
import time
import traceback
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import linear_sum_assignment

from simulator import dynamics, metrics, spectra, theory, updates
from simulator._validation import FloatArray, SeedLike, as_generator, check_positive_int
from simulator.errors import InputError, NumericalFloorWarning

__all__ = [
    "CHECKS",
    "DEFAULT_EXAMPLES",
    "Check",
    "CheckResult",
    "Choice",
    "FloatRange",
    "IntRange",
    "case_seeds",
    "check_names",
    "run_case",
    "verify",
]

EPS = float(np.finfo(np.float64).eps)
#: A handful of float64 operations against a hand formula.
ROUNDOFF_RTOL = 1e-12
#: Eigenvalues from two eigensolvers (or eigenvectors' residuals), relative to the largest modulus.
EIG_RTOL = 1e-9
#: A metric after many layers against its predicted limit (claims 14, 15, 17).
LIMIT_RTOL = 1e-6
#: A fitted log-rate against the predicted one, on well-separated instances (claim 12).
RATE_RTOL = 1e-3
#: A smoothing metric (HFC/LFC, 1 - cos, sigma_2/sigma_1) counts as converged to 0 below this.
SMOOTH_THRESHOLD = 1e-6
#: Relative modulus under which two eigenvalues count as tied (allowed by Def. 4).
TIE_RTOL = theory.TIE_RTOL
#: Seeds tried when a check keeps only instances passing a separation filter.
SCAN_TRIES = 256
#: Upper bound on the layers of any dynamic check.
MAX_LAYERS = 5000
#: Default number of drawn instances per check for ``oversmooth verify``.
DEFAULT_EXAMPLES = 50

TOLERANCE = "tolerance: 1 - violation/tolerance (0 at the tolerance, negative is a violation)"
DECADES = "decades: log10(threshold/value), worst over the listed quantities"
GAP = (
    "gap: (|mu| of the kind that must dominate - |mu| of the other kind) / max|mu|, + tie allowance"
)

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# parameter spaces
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntRange:
    """An integer parameter drawn uniformly from ``low .. high`` (inclusive)."""

    low: int
    high: int

    def sample(self, gen: np.random.Generator) -> int:
        """One value."""
        return int(gen.integers(self.low, self.high + 1))

    def contains(self, value: object) -> bool:
        """Whether ``value`` is an int in range."""
        return (
            isinstance(value, int | np.integer)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
        )


@dataclass(frozen=True)
class FloatRange:
    """A float parameter drawn uniformly from ``[low, high]``."""

    low: float
    high: float

    def sample(self, gen: np.random.Generator) -> float:
        """One value."""
        return float(gen.uniform(self.low, self.high))

    def contains(self, value: object) -> bool:
        """Whether ``value`` is a real number in range."""
        return (
            isinstance(value, int | float | np.floating | np.integer)
            and not isinstance(value, bool)
            and self.low <= float(value) <= self.high
        )


@dataclass(frozen=True)
class Choice:
    """A parameter drawn uniformly from a few options."""

    options: tuple[Any, ...]

    def sample(self, gen: np.random.Generator) -> Any:
        """One value."""
        return self.options[int(gen.integers(len(self.options)))]

    def contains(self, value: object) -> bool:
        """Whether ``value`` is one of the options."""
        return value in self.options


ParamSpec = IntRange | FloatRange | Choice
#: Seeds of the random matrices of one instance.
SEED = IntRange(0, 2**32 - 1)


# ----------------------------------------------------------------------------------------------
# Check and CheckResult
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One checkable claim of paper-spec §8 as data.

    Attributes
    ----------
    name : str
        Short snake_case identifier (``oversmooth verify --only NAME``).
    claim : int
        The claim's number in paper-spec §8.
    statement : str
        One line: what holds on every instance.
    unit : str
        What the margin measures.
    space : mapping of str to IntRange, FloatRange or Choice
        The parameters one instance is drawn from.
    body : callable
        ``body(params) -> margin``.
    counterexample : bool
        True when the check asserts that an implication fails outside its hypothesis.
    """

    name: str
    claim: int
    statement: str
    unit: str
    space: Mapping[str, ParamSpec]
    body: Callable[[Mapping[str, Any]], float]
    counterexample: bool = False

    def draw(self, rng: SeedLike = None) -> dict[str, Any]:
        """Draw one instance's parameters (a small dict of ints, floats and strings)."""
        gen = as_generator(rng)
        return {key: spec.sample(gen) for key, spec in self.space.items()}

    def validate(self, params: Mapping[str, Any]) -> None:
        """Raise InputError unless ``params`` has exactly this check's keys, each in range."""
        if not isinstance(params, Mapping):
            raise InputError(f"`params` must be a mapping; got {type(params).__name__}")
        missing = sorted(set(self.space) - set(params))
        extra = sorted(set(params) - set(self.space))
        if missing or extra:
            raise InputError(
                f"`params` of check {self.name!r} must have keys {sorted(self.space)}; "
                f"got missing {missing} and unknown {extra}"
            )
        for key, spec in self.space.items():
            if not spec.contains(params[key]):
                raise InputError(f"`params[{key!r}]` must be in {spec}; got {params[key]!r}")

    def run(self, params: Mapping[str, Any]) -> float:
        """Run one instance and return its margin (``>= 0``: the claim held)."""
        self.validate(params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalFloorWarning)
            return float(self.body(params))


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check over many drawn instances.

    Attributes
    ----------
    name, claim, statement : as in :class:`Check`
    cases : int
        Instances run.
    passed : bool
        Every margin was ``>= 0`` and no instance raised.
    worst_margin : float
        The smallest margin (``-inf`` when an instance raised).
    failing_seed : int or None
        Seed of the worst failing instance; ``run_case(check, failing_seed)`` reproduces it.
    seconds : float
        Wall time of all the instances.
    error : str or None
        The exception of the first instance that raised, if any.
    """

    name: str
    claim: int
    statement: str
    cases: int
    passed: bool
    worst_margin: float
    failing_seed: int | None
    seconds: float
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (``worst_margin`` None when not finite) for JSON output."""
        out = asdict(self)
        out["worst_margin"] = self.worst_margin if math.isfinite(self.worst_margin) else None
        return out


# ----------------------------------------------------------------------------------------------
# margins and small helpers
# ----------------------------------------------------------------------------------------------


def _tolerance_margin(violation: float, tolerance: float) -> float:
    """``1 - violation / tolerance``; NaN violations count as failures."""
    return 1.0 - violation / tolerance if math.isfinite(violation) else -math.inf


def _decades_below(value: float, threshold: float = SMOOTH_THRESHOLD) -> float:
    """``log10(threshold / value)`` with value floored at eps; NaN counts as a failure."""
    if not math.isfinite(value):
        return -math.inf
    return math.log10(threshold) - math.log10(max(abs(value), EPS))


def _decades_above(value: float, threshold: float) -> float:
    """``log10(value / threshold)`` for a quantity that must stay above a threshold."""
    if math.isnan(value) or value <= 0:
        return -math.inf
    return math.log10(value) - math.log10(threshold)


def _relative(error: float, scale: float) -> float:
    return error / max(scale, np.finfo(np.float64).tiny)


def _max_abs(X: ArrayLike) -> float:
    return float(np.max(np.abs(X)))


def _orthogonal(d: int, gen: np.random.Generator) -> FloatArray:
    Q, R = np.linalg.qr(gen.standard_normal((d, d)))
    return Q * np.sign(np.diagonal(R))


def _uniform_spectrum(gen: np.random.Generator, d: int, low: float, high: float) -> FloatArray:
    """``d`` eigenvalues in ``[min(low, high), max(low, high)]``, the first one exactly ``low``."""
    values = gen.uniform(min(low, high), max(low, high), d)
    values[0] = low
    return values


def _linear_rule(A: FloatArray, H: FloatArray, *, skip: bool = True) -> updates.LinearRule:
    """The update ``X + A X M`` with ``M = H^T`` (``W_V = M``, ``W_proj = I``)."""
    return updates.LinearRule(A, np.swapaxes(H, -1, -2), np.eye(H.shape[-1]), skip=skip)


def _matched_error(a: ArrayLike, b: ArrayLike) -> float:
    """Largest distance between two multisets of complex numbers under the best matching."""
    a, b = np.ravel(a).astype(complex), np.ravel(b).astype(complex)
    cost = np.abs(a[:, None] - b[None, :])
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].max())


def _modulus_gap(eig_A: ArrayLike, eig_H: ArrayLike, *, perron: bool) -> float:
    """Relative gap between the Perron and the non-Perron maximal ``|mu|`` (the ``gap`` unit).

    Positive when the required kind (Perron if ``perron`` else non-Perron) strictly dominates.
    """
    mu = np.abs(theory.kron_eigenvalues(eig_A, eig_H))
    p = int(theory.perron_index(eig_A))
    perron_top = mu[p].max()
    other_top = np.delete(mu, p, axis=0).max()
    gap = perron_top - other_top if perron else other_top - perron_top
    return float(gap / mu.max()) + TIE_RTOL


def _iterate(rule: Any, X0: FloatArray, layers: int, names: Sequence[str]) -> dynamics.Trajectory:
    """``dynamics.iterate`` with the floor warning silenced (reaching the floor is the point)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalFloorWarning)
        return dynamics.iterate(rule, X0, layers, metrics=tuple(names))


def _layers_for(rate: float, target: float, extra: int = 10) -> int:
    """Layers for a geometric factor ``rate`` to shrink a quantity by ``target``, capped."""
    if rate <= 0:
        return extra
    if rate >= 1:
        return MAX_LAYERS
    return min(MAX_LAYERS, math.ceil(math.log(target) / math.log(rate)) + extra)


class _NoInstanceError(RuntimeError):
    """No seed of the scan passed the check's filter."""


def _scan(seed: int, build: Callable[[np.random.Generator], T], accept: Callable[[T], bool]) -> T:
    """The first instance ``build(default_rng([seed, k]))`` (k = 0, 1, ...) that ``accept`` keeps."""
    for attempt in range(SCAN_TRIES):
        instance = build(np.random.default_rng([seed, attempt]))
        if accept(instance):
            return instance
    raise _NoInstanceError(f"no instance passed the filter in {SCAN_TRIES} seeds from seed {seed}")


class _System(NamedTuple):
    """One linear system ``X + A X H^T`` with its initial tokens."""

    A: FloatArray
    H: FloatArray
    X0: FloatArray


def _eig(A: ArrayLike) -> NDArray[np.complex128]:
    return np.linalg.eigvals(A).astype(np.complex128)


def _rows_rate(system: _System) -> tuple[float, int]:
    """``max_{i != i*} |mu_ij| / |mu*|`` and the dominating A-index ``i*`` (first of the ties).

    Modes sharing the A-eigenvector of the dominating one keep ``u_i* x^T`` rank one, so only the
    other rows set the convergence of HFC/LFC, the cosine and sigma_2/sigma_1 (S3, S9).
    """
    mu = np.abs(theory.kron_eigenvalues(_eig(system.A), _eig(system.H)))
    i_star = int(np.unravel_index(np.argmax(mu), mu.shape)[0])
    return float(np.delete(mu, i_star, axis=0).max() / mu.max()), i_star


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
    return _tolerance_margin(_relative(_max_abs(lhs - rhs), _max_abs(lhs)), ROUNDOFF_RTOL)


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
    predicted = theory.kron_eigenvalues(_eig(A), _eig(H))
    error = _matched_error(dense, predicted)
    return _tolerance_margin(_relative(error, 1.0 + _max_abs(predicted)), EIG_RTOL)


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
    return _tolerance_margin(_relative(worst, 1.0 + _max_abs(mu)), EIG_RTOL)


def _perron_conditions(A: FloatArray, eig_tol: float) -> list[float]:
    """Margins of: A 1 = 1, a root at 1, and the gap ``1 - max |lambda_i|`` of the others."""
    lam = _eig(A)
    p = int(theory.perron_index(lam))
    others = np.delete(lam, p)
    row_sums = _max_abs(A.sum(axis=1) - 1.0)
    return [
        _tolerance_margin(row_sums, ROUNDOFF_RTOL),
        _tolerance_margin(abs(lam[p] - 1.0), eig_tol),
        float(1.0 - np.abs(others).max()),
    ]


def _perron_root_real(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores=p["scores"], rng=gen)
    lam = _eig(A)
    imaginary = _tolerance_margin(float(np.abs(lam.imag).max()), EIG_RTOL)
    return min(imaginary, *_perron_conditions(A, EIG_RTOL))


def _perron_root_general(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_general(p["n"], scale=p["scale"], rng=gen)
    return min(_perron_conditions(A, EIG_RTOL))


def _psd_scores_spectrum(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n = p["n"]
    A = spectra.attention_symmetric_scores(
        n, scale=p["scale"], scores="psd", rank=min(p["rank"], n), rng=gen
    )
    lam = _eig(A)
    return min(
        _tolerance_margin(float(np.abs(lam.imag).max()), EIG_RTOL),
        _tolerance_margin(float(-lam.real.min()), EIG_RTOL),
        _tolerance_margin(float(lam.real.max() - 1.0), EIG_RTOL),
    )


def _closed_form(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, L = p["n"], p["d"], p["layers"]
    A = spectra.attention_symmetric_scores(n, rng=gen)
    H = spectra.h_symmetric(
        _uniform_spectrum(gen, d, p["h_low"], p["h_low"] + p["h_width"]), rng=gen
    )
    X0 = spectra.random_tokens(n, d, rng=gen)
    rule, X, cache = _linear_rule(A, H), X0.copy(), {}
    for layer in range(L):
        X = rule(X, layer, cache)
    term, total, magnitude = X0.copy(), np.zeros_like(X0), 0.0
    for k in range(L + 1):
        weight = math.comb(L, k)
        total += weight * term
        magnitude += weight * float(np.linalg.norm(term))
        term = A @ term @ H.T
    error = float(np.linalg.norm(X - total))
    return _tolerance_margin(_relative(error, magnitude), 100 * ROUNDOFF_RTOL)


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
        _relative(_max_abs(lfc + hfc - X), _max_abs(X)),
        _relative(abs(norm**2 - lfc_norm**2 - float(np.linalg.norm(hfc)) ** 2), norm**2),
        _relative(float(s[1]) if s.size > 1 else 0.0, norm),
        _relative(abs(float(s[0]) - lfc_norm), norm),
    ]
    return _tolerance_margin(max(errors), ROUNDOFF_RTOL)


def _metric_invariance(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    X = spectra.random_tokens(p["n"], p["d"], rng=gen)
    c = p["sign"] * 10.0 ** p["log10_c"]
    Q = _orthogonal(p["d"], gen)
    ratio, ratio_scaled, ratio_rotated = (metrics.hfc_lfc(Y) for Y in (X, c * X, X @ Q))
    errors = [
        _relative(abs(ratio_scaled - ratio), ratio),
        _relative(abs(ratio_rotated - ratio), ratio),
        abs(metrics.cosine(c * X) - metrics.cosine(X)),
        abs(metrics.sigma_ratio(c * X) - metrics.sigma_ratio(X)),
        abs(metrics.sigma_ratio(X @ Q) - metrics.sigma_ratio(X)),
    ]
    return _tolerance_margin(float(max(errors)), 1e3 * ROUNDOFF_RTOL)


# ----------------------------------------------------------------------------------------------
# claims 8-11: which eigenvalue dominates
# ----------------------------------------------------------------------------------------------


def _attention(kind: str, n: int, scale: float, gen: np.random.Generator) -> FloatArray:
    if kind == "symmetric":
        return spectra.attention_symmetric_scores(n, scale=scale, rng=gen)
    return spectra.attention_general(n, scale=scale, rng=gen)


def _value_matrix(kind: str, eigenvalues: FloatArray, gen: np.random.Generator) -> FloatArray:
    if kind == "symmetric":
        return spectra.h_symmetric(eigenvalues, rng=gen)
    return spectra.h_nonsymmetric(eigenvalues, rng=gen)


def _corner_theorem(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores=p["scores"], rng=gen)
    lam_H = _uniform_spectrum(gen, p["d"], p["h_low"], p["h_low"] + p["h_width"])
    eig_A = np.sort(_eig(A).real)
    eig_H = np.sort(np.linalg.eigvalsh(spectra.h_symmetric(lam_H, rng=gen)))
    top = float(np.abs(theory.kron_eigenvalues(eig_A, eig_H)).max())
    corners = [abs(1 + h * a) for h in (eig_H[0], eig_H[-1]) for a in (eig_A[0], eig_A[-1])]
    return _tolerance_margin(_relative(abs(top - max(corners)), top), ROUNDOFF_RTOL)


def _signed_dominance(p: Mapping[str, Any], sign: float, *, perron: bool) -> float:
    gen = np.random.default_rng(p["seed"])
    A = _attention(p["a_kind"], p["n"], p["scale"], gen)
    magnitudes = _uniform_spectrum(gen, p["d"], p["h_low"], p["h_low"] * p["h_ratio"])
    H = _value_matrix(p["h_kind"], sign * magnitudes, gen)
    return _kind_margin(_eig(A), _eig(H), perron=perron)


def _kind_margin(eig_A: ArrayLike, eig_H: ArrayLike, *, perron: bool) -> float:
    """The ``gap`` margin, or -1 when theory.dominance_kinds disagrees outside a tie."""
    kind = theory.KINDS[int(theory.dominance_kinds(eig_A, eig_H))]
    gap = _modulus_gap(eig_A, eig_H, perron=perron)
    agrees = (kind == "perron") == perron or gap <= 2 * TIE_RTOL
    return gap if agrees else min(gap, -1.0)


def _positive_h_perron(p: Mapping[str, Any]) -> float:
    return _signed_dominance(p, 1.0, perron=True)


def _negative_h_non_perron(p: Mapping[str, Any]) -> float:
    return _signed_dominance(p, -1.0, perron=False)


def _s5_bound_2x2(p: Mapping[str, Any]) -> float:
    a = p["a"]
    A = np.array([[1.0 - a, a], [a, 1.0 - a]])
    H = np.array([[p["h"]]])
    dom = theory.dominance(A, H)
    gap = _modulus_gap(dom.eig_A, dom.eig_H, perron=True)
    return gap if dom.kind == "perron" else min(gap, -1.0)


def _s5_bound_psd(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores="psd", rng=gen)
    H = spectra.h_symmetric(
        _uniform_spectrum(gen, p["d"], p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    dom = theory.dominance(A, H)
    gap = _modulus_gap(dom.eig_A, dom.eig_H, perron=True)
    return gap if dom.kind == "perron" else min(gap, -1.0)


# ----------------------------------------------------------------------------------------------
# claims 12-20: dynamics of X + A X M
# ----------------------------------------------------------------------------------------------


def _positive_system(p: Mapping[str, Any], gen: np.random.Generator) -> _System:
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    high = p["h_high"] if "h_high" in p else p["h_low"] * p["h_ratio"]
    H = spectra.h_symmetric(_uniform_spectrum(gen, d, p["h_low"], high), rng=gen)
    return _System(A, H, spectra.random_tokens(n, d, rng=gen))


def _perron_rate(system: _System) -> float:
    """``rho = max_{i != n, j} |mu_ij| / max_j |mu_nj|``: the decay of HFC/LFC under S2."""
    eig_A = _eig(system.A)
    mu = np.abs(theory.kron_eigenvalues(eig_A, _eig(system.H)))
    p = int(theory.perron_index(eig_A))
    return float(np.delete(mu, p, axis=0).max() / mu[p].max())


def _smoothing_decades(X: FloatArray) -> float:
    """Decades below SMOOTH_THRESHOLD of HFC/LFC, 1 - cos and sigma_2/sigma_1 (the worst)."""
    return min(
        _decades_below(float(metrics.hfc_lfc(X))),
        _decades_below(1.0 - float(metrics.cosine(X))),
        _decades_below(float(metrics.sigma_ratio(X))),
    )


def _positive_h_input_convergence(p: Mapping[str, Any]) -> float:
    system = _positive_system(p, np.random.default_rng(p["seed"]))
    layers = _layers_for(_perron_rate(system), SMOOTH_THRESHOLD * 1e-3)
    trajectory = _iterate(_linear_rule(system.A, system.H), system.X0, layers, ("hfc_lfc",))
    return _smoothing_decades(trajectory.final)


def _separations(system: _System) -> tuple[float, float]:
    """Next-to-leading ratios of the non-Perron and of the Perron ``|mu|`` (claim 12's filter)."""
    eig_A = _eig(system.A)
    mu = np.abs(theory.kron_eigenvalues(eig_A, _eig(system.H)))
    p = int(theory.perron_index(eig_A))
    others = np.sort(np.delete(mu, p, axis=0).ravel())[::-1]
    perron = np.sort(mu[p])[::-1]
    perron_sep = perron[1] / perron[0] if perron.size > 1 else 0.0
    return float(others[1] / others[0]), float(perron_sep)


def _well_separated(system: _System) -> bool:
    rho = _perron_rate(system)
    return rho <= 0.95 and max(_separations(system)) < min(0.9, rho)


def _positive_h_rate(p: Mapping[str, Any]) -> float:
    system = _scan(p["seed"], lambda gen: _positive_system(p, gen), _well_separated)
    rho = _perron_rate(system)
    layers = _layers_for(rho, 1e-11)
    trajectory = _iterate(_linear_rule(system.A, system.H), system.X0, layers, ("hfc_lfc",))
    ratio = trajectory.metrics["hfc_lfc"]
    usable = int(np.argmax(ratio < 1e-11)) if np.any(ratio < 1e-11) else ratio.size
    window = np.arange(usable // 2, usable)
    fitted = dynamics.fit_rate(ratio[window], window)
    error = abs(math.log(fitted) - math.log(rho)) / abs(math.log(rho))
    return _tolerance_margin(error, RATE_RTOL)


#: HFC/LFC that claim 13 must reach; float64 saturates it near 1e13-1e16 (LFC at round-off).
DIVERGENCE_TARGET = 1e10


def _doubly_stochastic_divergence(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_doubly_stochastic(n, scale=p["scale"], rng=gen)
    H = spectra.h_symmetric(
        -_uniform_spectrum(gen, d, p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    growth = _perron_rate(_System(A, H, A))
    target = DIVERGENCE_TARGET
    # Twice the asymptotic estimate: near 1e10 the growth slows as the ratio approaches its float64
    # saturation (the LFC of the dominant mode is round-off, not exactly zero).
    layers = 2 * _layers_for(1.0 / growth, 1.0 / target, extra=20)
    X0 = spectra.random_tokens(n, d, rng=gen)
    ratio = _iterate(_linear_rule(A, H), X0, layers, ("hfc_lfc",)).metrics["hfc_lfc"]
    reached = np.nonzero(ratio > target)[0]
    if reached.size == 0:
        return _decades_above(float(ratio[-1]), target)
    steps = np.diff(np.log(ratio[: reached[0] + 1]))
    return float(steps[steps.size // 2 :].min() / math.log(growth))


def _non_perron_system(p: Mapping[str, Any], gen: np.random.Generator) -> _System:
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    H = spectra.h_symmetric(
        -_uniform_spectrum(gen, d, p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    return _System(A, H, spectra.random_tokens(n, d, rng=gen))


def _non_perron_run(p: Mapping[str, Any]) -> tuple[theory.Prediction, FloatArray]:
    """A filtered S3 instance (a real, single-row dominating mode, rate <= 0.97) and its X_L."""

    def accept(system: _System) -> bool:
        prediction = theory.predict(system.A, system.H)
        return prediction.hfc_lfc_limit is not None and _rows_rate(system)[0] <= 0.97

    system = _scan(p["seed"], lambda gen: _non_perron_system(p, gen), accept)
    prediction = theory.predict(system.A, system.H)
    # When u_1 is nearly orthogonal to 1 the limit is large and the LFC tiny: corrections to the
    # LFC are amplified by the limit itself, so converge that much further.
    amplification = max(1.0, prediction.hfc_lfc_limit or 1.0)
    layers = _layers_for(_rows_rate(system)[0], 1e-9 / amplification)
    trajectory = _iterate(_linear_rule(system.A, system.H), system.X0, layers, ("hfc_lfc",))
    return prediction, trajectory.final


def _non_perron_hfc_limit(p: Mapping[str, Any]) -> float:
    prediction, X = _non_perron_run(p)
    limit = prediction.hfc_lfc_limit
    error = _relative(abs(float(metrics.hfc_lfc(X)) - limit), limit)
    return min(_tolerance_margin(error, LIMIT_RTOL), _decades_above(limit, 1e-12))


def _non_perron_cosine_limit(p: Mapping[str, Any]) -> float:
    prediction, X = _non_perron_run(p)
    limit = prediction.cosine_limit
    error = abs(float(metrics.cosine(X)) - limit)
    return min(_tolerance_margin(error, LIMIT_RTOL), 1.0 - limit)


def _non_perron_rank_collapse(p: Mapping[str, Any]) -> float:
    _, X = _non_perron_run(p)
    return _decades_below(float(metrics.sigma_ratio(X)))


class _Balanced(NamedTuple):
    """S4: H-eigenvalues ``{a, -1, small...}`` with ``a = -lambda^A_1``, so ``1 + a = 1 - lambda^A_1``."""

    system: _System
    a: float
    Q: FloatArray
    spectrum: FloatArray

    def shifted(self, shift: float) -> _System:
        """The same system with the balanced eigenvalue ``a`` moved to ``a + shift``."""
        spectrum = self.spectrum.copy()
        spectrum[0] += shift
        return self.system._replace(H=(self.Q * spectrum) @ self.Q.T)


def _balanced_system(p: Mapping[str, Any], gen: np.random.Generator) -> _Balanced:
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    a = -float(np.min(_eig(A).real))
    spectrum = np.concatenate([[a, -1.0], gen.uniform(-p["small"], p["small"], d - 2)])
    Q = _orthogonal(d, gen)
    system = _System(A, (Q * spectrum) @ Q.T, spectra.random_tokens(n, d, rng=gen))
    return _Balanced(system, a, Q, spectrum)


def _balanced_accept(instance: _Balanced) -> bool:
    """Keep a clearly negative lambda^A_1 (so a - 0.1 > 0) and the other modes at rate <= 0.95."""
    if instance.a < 0.15:
        return False
    dom = theory.dominance(instance.system.A, instance.system.H)
    return dom.kind == "balanced" and dom.rate <= 0.95


def _balanced_limit(system: _System) -> float:
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


def _sigma_ratio_after(system: _System, rate: float, target: float) -> float:
    layers = _layers_for(rate, target)
    rule = _linear_rule(system.A, system.H)
    return float(_iterate(rule, system.X0, layers, ("sigma_ratio",)).metrics["sigma_ratio"][-1])


def _balanced_no_rank_collapse(p: Mapping[str, Any]) -> float:
    system = _scan(p["seed"], lambda gen: _balanced_system(p, gen), _balanced_accept).system
    rate = theory.dominance(system.A, system.H).rate
    measured, limit = _sigma_ratio_after(system, rate, 1e-10), _balanced_limit(system)
    error = _relative(abs(measured - limit), limit)
    return min(_tolerance_margin(error, LIMIT_RTOL), _decades_above(measured, 1e-8))


def _balanced_perturbed_collapses(p: Mapping[str, Any]) -> float:
    instance = _scan(p["seed"], lambda gen: _balanced_system(p, gen), _balanced_accept)
    system = instance.shifted(p["sign"] * p["epsilon"])
    rate = theory.dominance(system.A, system.H).rate  # the broken tie is the slowest mode
    return _decades_below(_sigma_ratio_after(system, rate, 1e-9))


def _no_skip_low_pass(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_general(n, scale=p["scale"], rng=gen)
    lam = gen.uniform(-p["h_radius"], p["h_radius"], d).astype(complex)
    if p["h_kind"] == "complex" and d >= 2:
        lam[:2] = p["h_radius"] * np.exp(np.array([1j, -1j]) * gen.uniform(0.1, 3.0))
    H = spectra.h_nonsymmetric(lam, rng=gen)
    eig_A = _eig(A)
    second = float(np.sort(np.abs(eig_A))[-2])
    layers = _layers_for(second, SMOOTH_THRESHOLD * 1e-3)
    X0 = spectra.random_tokens(n, d, rng=gen)
    trajectory = _iterate(_linear_rule(A, H, skip=False), X0, layers, ("hfc_lfc",))
    return _decades_below(float(metrics.hfc_lfc(trajectory.final)))


def _hfc_step_system(
    p: Mapping[str, Any],
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = _attention(p["a_kind"], n, p["scale"], gen)
    M = gen.standard_normal((d, d)) * (p["m_scale"] / math.sqrt(d))
    X = spectra.random_tokens(n, d, rng=gen)
    centring = np.eye(n) - np.full((n, n), 1.0 / n)
    return A, M, X, centring


def _hfc_step_identity(p: Mapping[str, Any]) -> float:
    A, M, X, centring = _hfc_step_system(p)
    _, hfc = metrics.lfc_hfc_split(A @ X @ M)
    expected = centring @ A @ centring @ X @ M
    scale = float(np.linalg.norm(A @ X @ M)) + float(np.linalg.norm(X @ M))
    return _tolerance_margin(_relative(float(np.linalg.norm(hfc - expected)), scale), ROUNDOFF_RTOL)


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


def _alternating_system(p: Mapping[str, Any], gen: np.random.Generator) -> _System:
    """A lazy ``A = (1 - alpha) I + alpha B`` (spectrum in [1 - 2 alpha, 1]) and H in (-2, -1)."""
    n, d = p["n"], p["d"]
    B = spectra.attention_symmetric_scores(n, scale=p["scale"], rng=gen)
    A = (1.0 - p["alpha"]) * np.eye(n) + p["alpha"] * B
    H = spectra.h_symmetric(
        _uniform_spectrum(gen, d, p["h_low"], p["h_low"] * p["h_ratio"]), rng=gen
    )
    return _System(A, H, spectra.random_tokens(n, d, rng=gen))


def _alternating_accept(system: _System) -> bool:
    dom = theory.dominance(system.A, system.H)
    return dom.kind == "perron" and dom.mu.real < 0 and _perron_rate(system) <= 0.95


#: Layers after X_L over which consecutive states must point in opposite directions (claim 20).
ALTERNATION_LAYERS = 10


def _alternating_sign(p: Mapping[str, Any]) -> float:
    system = _scan(p["seed"], lambda gen: _alternating_system(p, gen), _alternating_accept)
    rule = _linear_rule(system.A, system.H)
    layers = _layers_for(_perron_rate(system), SMOOTH_THRESHOLD * 1e-3)
    X = _iterate(rule, system.X0, layers, ("hfc_lfc",)).final
    smoothing = _smoothing_decades(X)
    worst_cos = -1.0
    for layer in range(layers, layers + ALTERNATION_LAYERS):
        following = rule(X, layer, {})
        cos = float(np.sum(X * following) / (np.linalg.norm(X) * np.linalg.norm(following)))
        worst_cos, X = max(worst_cos, cos), following / np.linalg.norm(following)
    return min(smoothing, -worst_cos)


# ----------------------------------------------------------------------------------------------
# claims 21-22: LayerNorm
# ----------------------------------------------------------------------------------------------


def _dense_system(p: Mapping[str, Any]) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    gen = np.random.default_rng(p["seed"])
    n, d = p["n"], p["d"]
    A = spectra.attention_symmetric_scores(n, rng=gen)
    W_V = gen.standard_normal((d, d)) / math.sqrt(d)
    W_proj = gen.standard_normal((d, d)) / math.sqrt(d)
    return A, W_V, W_proj, spectra.random_tokens(n, d, rng=gen)


def _pre_ln_effective_product(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X = _dense_system(p)
    c = p["c"]
    negative = updates.PreLNRule(A, W_V, W_proj, gamma=-c)(X, 0, {})
    folded = updates.PreLNRule(A, W_V, -c * W_proj)(X, 0, {})
    gamma = np.random.default_rng([p["seed"], 1]).uniform(-2.0, 2.0, X.shape[1])
    general = updates.PreLNRule(A, W_V, W_proj, gamma=gamma)(X, 0, {})
    general_folded = updates.PreLNRule(A, gamma[:, None] * W_V, W_proj)(X, 0, {})
    spectrum = theory.value_spectrum(W_V, W_proj)
    effective = theory.value_spectrum(-c * W_V, W_proj)
    scale = _max_abs(X) + _max_abs(negative)
    errors = [
        _relative(_max_abs(negative - folded), scale),
        _relative(_max_abs(general - general_folded), scale),
        _relative(_matched_error(effective, -c * spectrum), c * (1.0 + _max_abs(spectrum))),
    ]
    return _tolerance_margin(max(errors), EIG_RTOL)


#: Systems per instance of the Pre-LN sign experiment (the claim is about medians, §4).
PRE_LN_BATCH = 16
PRE_LN_LAYERS = 100


def _pre_ln_sign_flip(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, K = p["n"], p["d"], PRE_LN_BATCH
    A = spectra.attention_symmetric_scores(n, scale=p["scale"], batch=K, rng=gen)
    lam = gen.uniform(0.05, 1.0, (K, d))
    Q = np.stack([_orthogonal(d, gen) for _ in range(K)])
    X0 = spectra.random_tokens(n, d, batch=K, rng=gen)
    median = {}
    for sign_h in (1.0, -1.0):
        M = (Q * (sign_h * lam)[:, None, :]) @ np.swapaxes(Q, -1, -2)
        for sign_g in (1.0, -1.0):
            rule = updates.PreLNRule(A, M, np.eye(d), gamma=sign_g * p["c"])
            final = _iterate(rule, X0, PRE_LN_LAYERS, ("hfc_lfc",)).metrics["hfc_lfc"][-1]
            median[sign_h, sign_g] = float(np.median(final))
    return min(
        math.log10(median[-1.0, 1.0] / median[1.0, 1.0]),
        math.log10(median[1.0, -1.0] / median[-1.0, -1.0]),
    )


def _post_ln_sign_alternation(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X0 = _dense_system(p)
    plus = updates.PostLNRule(A, W_V, W_proj, gamma=p["c"], beta=0.0)
    minus = updates.PostLNRule(A, W_V, W_proj, gamma=-p["c"], beta=0.0)
    X_plus, X_minus, worst = X0, X0, 0.0
    for layer in range(p["layers"]):
        X_plus, X_minus = plus(X_plus, layer, {}), minus(X_minus, layer, {})
        sign = -1.0 if layer % 2 == 0 else 1.0
        worst = max(worst, _relative(_max_abs(X_minus - sign * X_plus), _max_abs(X_plus)))
    return _tolerance_margin(worst, ROUNDOFF_RTOL)


# ----------------------------------------------------------------------------------------------
# claims 23-24: the reparameterization
# ----------------------------------------------------------------------------------------------


def _reparameterize_construction(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    d = p["d"]
    psi = p["psi_scale"] * gen.standard_normal(d)
    r = spectra.reparameterize(gen.standard_normal((d, d)), psi, p["sign"])
    scale = 1.0 + _max_abs(r.eigenvalues)
    in_range = (
        max(_max_abs(np.clip(r.eigenvalues, -1.0, 0.0) - r.eigenvalues), 0.0)
        if p["sign"] == "minus"
        else float(max(-r.eigenvalues.min(), 0.0))
    )
    errors = [
        _max_abs(r.H - r.H.T) / scale,
        _matched_error(np.linalg.eigvalsh(r.H), r.eigenvalues) / scale,
        _max_abs(r.W_V @ r.W_proj - r.H) / scale,
        _max_abs(r.V.T @ r.V - np.eye(d)),
        in_range,
    ]
    return _tolerance_margin(max(errors), ROUNDOFF_RTOL)


#: Attention matrices per instance of the Table-1 sanity check.
TABLE1_BATCH = 8


def _reparameterized_dominance(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, K = p["n"], p["d"], TABLE1_BATCH
    A = np.stack([_attention(p["a_kind"], n, p["scale"], gen) for _ in range(K)])
    psi = gen.uniform(0.1, p["psi_high"], d) * gen.choice([-1.0, 1.0], d)
    r = spectra.reparameterize(gen.standard_normal((d, d)), psi, p["sign"])
    eig_A = np.linalg.eigvals(A)
    eig_H = theory.value_spectrum(r.W_V, r.W_proj)
    perron = p["sign"] == "plus"
    return min(_kind_margin(eig_A[k], eig_H, perron=perron) for k in range(K))


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
    errors = [_max_abs(A_hat.sum(axis=1) - 1.0), _max_abs(identity - A)]
    if p["a_kind"] == "doubly-stochastic":
        lam = _eig(A)
        others = np.delete(lam, int(theory.perron_index(lam)))
        expected = np.concatenate([[1.0], (1.0 + omega) * others])
        errors.append(_matched_error(_eig(A_hat), expected) / (1.0 + abs(omega)))
    return _tolerance_margin(max(errors), EIG_RTOL)


def _featscale_algebra(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X = _dense_system(p)
    gen = np.random.default_rng([p["seed"], 1])
    s_d, s_h = p["s_scale"] * gen.standard_normal((2, X.shape[1]))
    zero = updates.FeatScaleRule(A, W_V, W_proj, s_d=0.0, s_h=0.0)(X, 0, {})
    linear = updates.LinearRule(A, W_V, W_proj)(X, 0, {})
    code = updates.FeatScaleRule(A, W_V, W_proj, s_d=s_d, s_h=s_h, code_faithful=True)(X, 0, {})
    doubled = updates.FeatScaleRule(A, W_V, W_proj, s_d=2 * s_d, s_h=2 * s_h)(X, 0, {})
    scale = _max_abs(linear) + _max_abs(code)
    errors = [_max_abs(zero - linear), _max_abs(code - doubled)]
    return _tolerance_margin(_relative(max(errors), scale), ROUNDOFF_RTOL)


def _neutreno_system(p: Mapping[str, Any]) -> tuple[FloatArray, FloatArray]:
    """PSD-score A (spectrum in [0, 1], so rho(A - lam I) < 1 for 0 < lam < 1) and values v^0."""
    gen = np.random.default_rng(p["seed"])
    A = spectra.attention_symmetric_scores(p["n"], scale=p["scale"], scores="psd", rng=gen)
    return A, gen.standard_normal((p["n"], p["d_v"]))


def _neutreno_iterate(A: FloatArray, v0: FloatArray, lam: float, layers: int) -> FloatArray:
    """``v^{l+1} = A v^l + lam (v^0 - v^l)`` from ``v^0`` (paper-spec §7.3, fixed A)."""
    v = v0
    for _ in range(layers):
        v = A @ v + lam * (v0 - v)
    return v


def _neutreno_fixed_point(p: Mapping[str, Any]) -> float:
    A, v0 = _neutreno_system(p)
    lam, n = p["lam"], A.shape[0]
    rate = float(np.abs(_eig(A) - lam).max())
    if rate >= 1.0:
        return 1.0 - rate
    fixed = lam * np.linalg.solve((1.0 + lam) * np.eye(n) - A, v0)
    v = _neutreno_iterate(A, v0, lam, _layers_for(rate, 1e-14))
    error = _relative(float(np.linalg.norm(v - fixed)), float(np.linalg.norm(fixed)))
    return min(
        _tolerance_margin(error, 100 * ROUNDOFF_RTOL),
        _decades_above(float(metrics.hfc_lfc(fixed)), 1e-8),
    )


def _neutreno_without_fidelity(p: Mapping[str, Any]) -> float:
    A, v0 = _neutreno_system(p)
    second = float(np.sort(np.abs(_eig(A)))[-2])
    v = _neutreno_iterate(A, v0, 0.0, _layers_for(second, SMOOTH_THRESHOLD * 1e-3))
    return _decades_below(float(metrics.hfc_lfc(v)))


def _value_residual_algebra(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    n, d, d_v = p["n"], p["d"], p["d_v"]
    A = spectra.attention_general(n, rng=gen)
    W_V = gen.standard_normal((d, d_v)) / math.sqrt(d)
    W_O = gen.standard_normal((d_v, d)) / math.sqrt(d_v)
    X0 = spectra.random_tokens(n, d, rng=gen)
    rule = updates.ValueResidualRule(A, W_V, W_O, mode=p["mode"])
    V1, X, cache, worst = X0 @ W_V, X0, {}, 0.0
    for layer in range(p["layers"]):
        if layer == 0:
            values = X @ W_V
        elif p["mode"] == "resformer":
            values = 0.5 * V1 + 0.5 * (X @ W_V)
        else:
            values = V1
        expected = X + A @ values @ W_O
        X = rule(X, layer, cache)
        worst = max(worst, _relative(_max_abs(X - expected), _max_abs(expected)))
    return _tolerance_margin(worst, ROUNDOFF_RTOL)


def _similarity_removal_algebra(p: Mapping[str, Any]) -> float:
    A, W_V, W_proj, X = _dense_system(p)
    tau = p["tau"]
    lfc, hfc = metrics.lfc_hfc_split(X)
    lfc_removed, hfc_removed = metrics.lfc_hfc_split(X - tau * X.mean(axis=0))
    branch = updates.LinearRule(A, W_V, W_proj, skip=False)(X, 0, {})
    rule_branch = updates.SimilarityRemovalRule(A, W_V, W_proj, tau=tau)(X, 0, {}) - X
    lfc_b, hfc_b = metrics.lfc_hfc_split(branch)
    lfc_r, hfc_r = metrics.lfc_hfc_split(rule_branch)
    full = X - X.mean(axis=0)
    scale = _max_abs(X) + _max_abs(branch)
    errors = [
        _max_abs(lfc_removed - (1.0 - tau) * lfc),
        _max_abs(hfc_removed - hfc),
        _max_abs(lfc_r - (1.0 - tau) * lfc_b),
        _max_abs(hfc_r - hfc_b),
        _max_abs(full.mean(axis=0)),
    ]
    ratio = float(metrics.hfc_lfc(full))
    return min(
        _tolerance_margin(_relative(max(errors), scale), ROUNDOFF_RTOL),
        _decades_above(ratio, 1.0 / ROUNDOFF_RTOL),
    )


def _dong_vs_rank1(p: Mapping[str, Any]) -> float:
    gen = np.random.default_rng(p["seed"])
    u, v = gen.standard_normal(p["n"]), gen.standard_normal(p["d"])
    X = np.outer(u, v)
    centred = u - u.mean()
    norm_1_inf = np.linalg.norm(centred, 1) * np.abs(centred).max()
    predicted = math.sqrt(norm_1_inf / (np.linalg.norm(u, 1) * np.abs(u).max()))
    dong = float(metrics.dong_residual(X))
    errors = [float(metrics.rank1_residual(X)), _relative(abs(dong - predicted), predicted)]
    return min(
        _tolerance_margin(max(errors), ROUNDOFF_RTOL),
        _decades_above(dong, ROUNDOFF_RTOL),
    )


# ----------------------------------------------------------------------------------------------
# the registry
# ----------------------------------------------------------------------------------------------

_N = IntRange(2, 12)
_D = IntRange(1, 8)
_SCALE = FloatRange(0.5, 1.5)
_DYNAMIC = {"n": IntRange(4, 12), "d": IntRange(2, 8), "scale": _SCALE}

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
            "d": _D,
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
            "n": _N,
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
            "d": _D,
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
            "d": _D,
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
            "n": _N,
            "d": IntRange(1, 6),
            "scale": _SCALE,
            "h_low": FloatRange(-8.0, -2.2),
            "h_ratio": FloatRange(0.0, 1.0),
            "seed": SEED,
        },
        _s5_bound_psd,
        counterexample=True,
    ),
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
            "n": _N,
            "d": _D,
            "scale": _SCALE,
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
            "n": _N,
            "d": _D,
            "scale": _SCALE,
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
            "n": _N,
            "d": _D,
            "scale": _SCALE,
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
            "scale": _SCALE,
            "alpha": FloatRange(0.1, 0.3),
            "h_low": FloatRange(-1.95, -1.6),
            "h_ratio": FloatRange(0.8, 1.0),
            "seed": SEED,
        },
        _alternating_sign,
    ),
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
        "Pre-LN: the median HFC/LFC ordering of H+ vs H- flips between gamma = +c and gamma = -c",
        "decades between the medians (over 16 systems, 100 layers) in the predicted order, worst sign",
        {
            "n": IntRange(4, 12),
            "d": IntRange(4, 12),
            "scale": _SCALE,
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
            "d": _D,
            "scale": FloatRange(0.5, 2.0),
            "a_kind": Choice(("general", "symmetric")),
            "sign": Choice(("plus", "minus")),
            "psi_high": FloatRange(0.2, 2.0),
            "seed": SEED,
        },
        _reparameterized_dominance,
    ),
    Check(
        "attnscale_algebra",
        25,
        "AttnScale: A_hat 1 = 1; omega = 0 is the identity; doubly stochastic A: non-Perron "
        "eigenvalues scale by 1 + omega",
        TOLERANCE + " (tolerance 1e-9)",
        {
            "n": _N,
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
        {"n": IntRange(2, 10), "d": _D, "s_scale": FloatRange(0.0, 2.0), "seed": SEED},
        _featscale_algebra,
    ),
    Check(
        "neutreno_fixed_point",
        27,
        "NeuTRENO v <- A v + lam (v0 - v) converges to lam ((1 + lam) I - A)^{-1} v0, HFC/LFC > 0",
        TOLERANCE + " (relative error, tolerance 1e-10); decades of HFC/LFC(limit) above 1e-8",
        {
            "n": _N,
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
            "n": _N,
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
            "d": _D,
            "d_v": _D,
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
        {"n": _N, "d": _D, "tau": FloatRange(-1.0, 2.0), "seed": SEED},
        _similarity_removal_algebra,
    ),
    Check(
        "dong_vs_rank1",
        30,
        "X = u v^T with u not parallel to 1: rank-1 residual 0 but Dong's mean residual > 0",
        TOLERANCE + "; decades of the Dong residual above the round-off level",
        {"n": IntRange(2, 16), "d": _D, "seed": SEED},
        _dong_vs_rank1,
    ),
)


# ----------------------------------------------------------------------------------------------
# running many instances
# ----------------------------------------------------------------------------------------------


def check_names() -> tuple[str, ...]:
    """Names of every registered check, in registry order."""
    return tuple(check.name for check in CHECKS)


def _select(names: Iterable[str] | None, checks: Sequence[Check] | None) -> list[Check]:
    pool = list(CHECKS if checks is None else checks)
    if names is None:
        return pool
    if isinstance(names, str):
        names = (names,)
    by_name = {check.name: check for check in pool}
    selected = []
    for name in names:
        if name not in by_name:
            raise InputError(
                f"`names` must name registered checks; got {name!r}{_suggest(name, by_name)}"
            )
        selected.append(by_name[name])
    return selected


def _suggest(name: str, known: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def case_seeds(name: str, seed: int, examples: int) -> list[int]:
    """The per-instance seeds of check ``name`` for a run with ``seed`` (independent of the others).

    Parameters
    ----------
    name : str
    seed : int
        The run's seed (``oversmooth verify --seed``).
    examples : int

    Returns
    -------
    list of int
        ``run_case(check, s)`` reproduces the instance drawn from each.
    """
    sequence = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
    return [int(s) for s in sequence.generate_state(examples, dtype=np.uint32)]


def run_case(check: Check, seed: int) -> float:
    """Draw the instance of ``seed`` and return its margin (``>= 0``: the claim held)."""
    return check.run(check.draw(seed))


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InputError(f"`seed` must be a non-negative integer; got {seed!r}")
    return int(seed)


def _run_check(check: Check, seeds: list[int]) -> CheckResult:
    worst, failing, error = math.inf, None, None
    start = time.perf_counter()
    for case_seed in seeds:
        try:
            margin = run_case(check, case_seed)
        except Exception as err:  # a crash inside a check is a failed case, reported as data
            margin = -math.inf
            if error is None:
                frame = traceback.extract_tb(err.__traceback__)[-1]
                error = f"{type(err).__name__}: {err} (at {frame.name}, line {frame.lineno})"
        if math.isnan(margin):
            margin = -math.inf
        if margin < worst:
            worst = margin
            failing = case_seed if margin < 0 else None
    seconds = time.perf_counter() - start
    passed = worst >= 0
    return CheckResult(
        check.name,
        check.claim,
        check.statement,
        len(seeds),
        passed,
        worst,
        None if passed else failing,
        seconds,
        error,
    )


def verify(
    *,
    examples: int = DEFAULT_EXAMPLES,
    seed: int = 0,
    names: Iterable[str] | None = None,
    checks: Sequence[Check] | None = None,
) -> list[CheckResult]:
    """Run checks on ``examples`` drawn instances each and return one result per check.

    Parameters
    ----------
    examples : int
        Instances per check (positive).
    seed : int
        Seed of the whole run; each check draws its instances from ``case_seeds(name, seed, n)``.
    names : iterable of str, optional
        Run only these checks (default all); an unknown name is an InputError with a suggestion.
    checks : sequence of Check, optional
        The pool to choose from; default :data:`CHECKS`.

    Returns
    -------
    list of CheckResult
        In the order of ``names`` (or of the pool). A failed claim, or an instance that raised, is a
        result with ``passed=False``; it never raises.
    """
    examples = check_positive_int(examples, "examples")
    seed = _check_seed(seed)
    selected = _select(names, checks)
    return [_run_check(check, case_seeds(check.name, seed, examples)) for check in selected]
