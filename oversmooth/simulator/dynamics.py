"""Iterating an update rule to great depth (10^4 layers and more) with per-layer metrics.

Renormalisation
---------------
For a homogeneous rule (``rule(cX) = c rule(X)``) every smoothing metric is scale invariant (claim
7), so :func:`iterate` divides each system's state by its Frobenius norm after every layer and keeps
the logarithm of what it divided out. The true state is ``X_l = exp(log_scale) * X_stored``; the
true ``log ||X_l||_F`` is recorded as ``log_norm``. Neither overflows nor underflows, at any depth,
for the linear rules (docs/theory.md §8 defaults). Arrays the rule keeps in ``cache["scaled"]`` (first
layer's values, see :mod:`oversmooth.simulator.updates`) are divided by the same factor.

Stopping
--------
Every run ends with one ``stop_reason``, and an early stop always issues a warning:

``"completed"``  all ``n_layers`` layers ran.
``"floor"``      every system reached the float64 floor (below), or its state became exactly zero
                 or smaller than :data:`UNDERFLOW_NORM` without renormalisation;
                 a :class:`~oversmooth.simulator.errors.NumericalFloorWarning` is issued.
``"overflow"``   without renormalisation, some ``||X_l||_F`` exceeded :data:`OVERFLOW_NORM` (a
                 growing rule such as softmax attention with skip); the run stops while everything is
                 still finite (that layer is recorded), with a ``RuntimeWarning``.
``"nonfinite"``  a layer produced NaN or inf (e.g. a user-supplied MLP overflowed inside the layer);
                 that layer is not recorded, with a ``RuntimeWarning``.

The numerical floor
-------------------
With ``floor = f`` (default :data:`FLOOR` = 1e3 * eps), a system is *at the floor* at layer l when

- its high-frequency part is round-off, ``||HFC[X_l]||_F < f ||X_l||_F`` (computed from
  ``hfc_lfc = r`` as ``r / sqrt(1 + r^2)``), or
- all its non-leading singular directions are round-off,
  ``sqrt(sum_{k>=2} sigma_k^2) < f ||X_l||_F`` (:func:`oversmooth.simulator.metrics.rank1_residual`); this test
  is made only when a singular-value metric (``sigma_ratio``, ``rank1_residual``,
  ``effective_rank``) is recorded, since only those are corrupted by it.

Past that layer the recorded metric is round-off (HFC/LFC ~ 1e-16, sigma_2/sigma_1 ~ 1e-16) and
fitting it fits noise. :attr:`Trajectory.floor_layer` gives the first such layer per system; the run
stops when every system of the batch has reached it. ``floor=None`` never stops for the floor.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oversmooth.simulator.errors import InputError, NumericalFloorWarning
from oversmooth.simulator.metrics import METRICS, all_metrics, hfc_lfc, rank1_residual
from oversmooth.simulator.updates import UpdateRule
from oversmooth.simulator.validation import (
    FloatArray,
    as_float_array,
    as_tokens,
    check_positive_int,
)

__all__ = [
    "FLOOR",
    "OVERFLOW_NORM",
    "STOP_REASONS",
    "UNDERFLOW_NORM",
    "Trajectory",
    "fit_rate",
    "iterate",
]

#: Default relative floor: 1e3 float64 machine epsilons of ||X||_F.
FLOOR = 1e3 * float(np.finfo(np.float64).eps)
#: Without renormalisation, a state norm above this stops the run ("overflow"). Scores such as
#: X W_Q W_K^T X^T are then still ~1e200, far from inf.
OVERFLOW_NORM = 1e100
#: Without renormalisation, a state norm below this stops the run ("floor").
UNDERFLOW_NORM = 1e-100
#: Every value ``Trajectory.stop_reason`` can take.
STOP_REASONS = ("completed", "floor", "overflow", "nonfinite")
#: Metrics computed from singular values, which the rank-one floor corrupts.
_SVD_METRICS = frozenset({"sigma_ratio", "rank1_residual", "effective_rank"})

StopReason = Literal["completed", "floor", "overflow", "nonfinite"]
#: One flag per system.
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class Trajectory:
    """Metrics of ``X_0, ..., X_L`` under repeated layers of one rule.

    Attributes
    ----------
    metrics : dict of str to (L+1, *batch) ndarray
        Each requested metric at layers ``0 .. layers_run``; row 0 is ``X_0``.
    log_norm : (L+1, *batch) ndarray
        ``log ||X_l||_F`` of the true (never renormalised) state.
    final : (*batch, n, d) ndarray
        The stored last state; the true ``X_L = exp(log_scale) * final``.
    log_scale : (*batch,) ndarray
        Log of the factor divided out of ``final`` (0 without renormalisation).
    layers_run : int
        ``L``, the number of layers applied and recorded.
    stop_reason : {"completed", "floor", "overflow", "nonfinite"}
    floor_layer : (*batch,) int ndarray
        First layer at which each system was at the numerical floor; -1 if never.
    renormalized : bool
        Whether the state was renormalised after every layer.
    """

    metrics: dict[str, FloatArray]
    log_norm: FloatArray
    final: FloatArray
    log_scale: FloatArray
    layers_run: int
    stop_reason: StopReason
    floor_layer: NDArray[np.intp]
    renormalized: bool

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Leading batch axes of the systems (``()`` for one system)."""
        return tuple(self.log_norm.shape[1:])

    def to_rows(self) -> list[tuple[Any, ...]]:
        """Tidy rows ``(layer, metric, value)``, plus ``system`` (flat index) for a batch.

        ``log_norm`` is included as a metric after the requested ones.

        Returns
        -------
        list of tuple
            Ordered by layer, then metric (then system).
        """
        columns = {**self.metrics, "log_norm": self.log_norm}
        batched = bool(self.batch_shape)
        rows: list[tuple[Any, ...]] = []
        for layer in range(self.layers_run + 1):
            for name, values in columns.items():
                flat = np.ravel(values[layer])
                if batched:
                    rows.extend((layer, name, float(v), s) for s, v in enumerate(flat))
                else:
                    rows.append((layer, name, float(flat[0])))
        return rows


def _check_metrics(metrics: Iterable[str]) -> tuple[str, ...]:
    if isinstance(metrics, str):
        metrics = (metrics,)
    names = tuple(metrics)
    for name in names:
        if name not in METRICS:
            raise InputError(f"`metrics` must name entries of {', '.join(METRICS)}; got {name!r}")
    return names


def _check_floor(floor: float | None) -> float | None:
    if floor is None:
        return None
    value = float(floor) if isinstance(floor, int | float) and not isinstance(floor, bool) else None
    if value is None or not 0.0 < value < 1.0:
        raise InputError(f"`floor` must be None or a number in (0, 1); got {floor!r}")
    return value


def _resolve_renormalize(renormalize: bool | str, homogeneous: bool) -> bool:
    if renormalize == "auto":
        return homogeneous
    if not isinstance(renormalize, bool):
        raise InputError(f"`renormalize` must be 'auto', True or False; got {renormalize!r}")
    if renormalize and not homogeneous:
        raise InputError(
            "`renormalize` must be 'auto' or False for a rule that is not homogeneous "
            "(rescaling would change its dynamics); got True"
        )
    return renormalize


def _frobenius(X: FloatArray) -> FloatArray:
    """``||X||_F`` per system, one pass over X."""
    return np.sqrt(np.einsum("...ij,...ij->...", X, X))


def _rescale(X: FloatArray, cache: dict[str, Any], norm: FloatArray) -> FloatArray:
    """Divide X (in place) and the cache's scaled arrays by ``norm`` (zero norms left alone)."""
    factor = 1.0 / np.where(norm > 0, norm, 1.0)
    X *= factor[..., None, None]
    scaled = cache.get("scaled", {})
    for key, array in scaled.items():
        scaled[key] = array * factor[..., None, None]
    return X


def _safe_log(norm: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore"):
        return np.log(norm)


class _Recorder:
    """Per-layer metrics, norms and floor state of one run."""

    def __init__(self, names: tuple[str, ...], floor: float | None, batch: tuple[int, ...]):
        self.names = names
        self.floor = floor
        self.values: dict[str, list[FloatArray]] = {name: [] for name in names}
        self.log_norm: list[FloatArray] = []
        self.floor_layer = np.full(batch, -1, dtype=np.intp)
        self.check_rank = bool(_SVD_METRICS & set(names))

    def record(self, layer: int, X: FloatArray, log_norm: FloatArray, zero: BoolArray) -> None:
        computed = {
            name: np.asarray(value, dtype=np.float64)
            for name, value in all_metrics(X, self.names).items()
        }
        for name, value in computed.items():
            self.values[name].append(value)
        self.log_norm.append(np.array(log_norm, dtype=np.float64))
        at_floor = zero | self._below_floor(X, computed)
        self.floor_layer[(self.floor_layer < 0) & at_floor] = layer

    def _below_floor(self, X: FloatArray, computed: dict[str, FloatArray]) -> BoolArray:
        if self.floor is None:
            return np.zeros(self.floor_layer.shape, dtype=bool)
        ratio = computed["hfc_lfc"] if "hfc_lfc" in computed else hfc_lfc(X)
        with np.errstate(invalid="ignore"):
            relative_hfc = np.where(np.isinf(ratio), 1.0, ratio / np.hypot(1.0, ratio))
        below = relative_hfc < self.floor
        if self.check_rank:
            tail = computed["rank1_residual"] if "rank1_residual" in computed else rank1_residual(X)
            below |= tail < self.floor
        return below

    def all_at_floor(self) -> bool:
        return bool(np.all(self.floor_layer >= 0))

    def stacked(self) -> tuple[dict[str, FloatArray], FloatArray]:
        metrics = {name: np.stack(values) for name, values in self.values.items()}
        return metrics, np.stack(self.log_norm)


def _initial_state(rule: UpdateRule, X0: ArrayLike) -> tuple[FloatArray, tuple[int, ...]]:
    check = getattr(rule, "check_tokens", None)
    X = check(X0, "X0") if check is not None else as_tokens(X0, "X0")
    rule_batch = tuple(getattr(rule, "batch_shape", ()))
    try:
        batch = np.broadcast_shapes(X.shape[:-2], rule_batch)
    except ValueError:
        raise InputError(
            f"`X0` batch axes {X.shape[:-2]} must broadcast with the rule's {rule_batch}"
        ) from None
    X = np.array(np.broadcast_to(X, (*batch, *X.shape[-2:])), dtype=np.float64)
    if np.any(_frobenius(X) == 0):
        raise InputError("`X0` must be nonzero (every system); got an all-zero token matrix")
    return X, batch


def iterate(
    rule: UpdateRule,
    X0: ArrayLike,
    n_layers: int,
    *,
    metrics: Sequence[str] = tuple(METRICS),
    renormalize: bool | Literal["auto"] = "auto",
    floor: float | None = FLOOR,
) -> Trajectory:
    """Apply ``rule`` ``n_layers`` times to ``X0`` and record the smoothing metrics of every layer.

    ``X_l = f(X_{l-1})`` for ``l = 1 .. n_layers`` (the rule is called with ``layer = l - 1``);
    for the linear rule ``vec(X_L) = (I + H ⊗ A)^L vec(X_0)`` (eq. vec_update).

    Parameters
    ----------
    rule : UpdateRule
        An update rule from :mod:`oversmooth.simulator.updates` (see :class:`oversmooth.simulator.updates.UpdateRule`).
        A bare callable ``rule(X, layer, cache)`` is accepted at run time too: a missing
        ``homogeneous`` counts as False, and without ``check_tokens`` and ``batch_shape`` the input
        is checked as generic tokens and the rule has no batch axes of its own.
    X0 : (*batch, n, d) array_like
        Initial tokens, nonzero; broadcast against the rule's own batch axes.
    n_layers : int
        Number of layers to apply (positive).
    metrics : sequence of str
        Names from :data:`oversmooth.simulator.metrics.METRICS`; default all.
    renormalize : {"auto", True, False}
        ``"auto"`` renormalises iff ``rule.homogeneous``; True requires a homogeneous rule.
    floor : float or None
        Relative numerical floor (see the module docstring); None disables the floor stop.

    Returns
    -------
    Trajectory

    Warns
    -----
    NumericalFloorWarning
        When systems reach the floor (the run stops once all have).
    RuntimeWarning
        When the run stops for overflow or a non-finite layer.
    """
    n_layers = check_positive_int(n_layers, "n_layers")
    names = _check_metrics(metrics)
    floor = _check_floor(floor)
    renorm = _resolve_renormalize(renormalize, bool(getattr(rule, "homogeneous", False)))
    X, batch = _initial_state(rule, X0)
    cache: dict[str, Any] = {}
    recorder = _Recorder(names, floor, batch)

    norm = _frobenius(X)
    log_scale = _safe_log(norm) if renorm else np.zeros(batch)
    if renorm:
        X = _rescale(X, cache, norm)
    recorder.record(0, X, _safe_log(norm), np.zeros(batch, dtype=bool))
    stop: StopReason = "floor" if recorder.all_at_floor() else "completed"
    layers_run = 0

    for layer in range(n_layers if stop == "completed" else 0):
        Y = rule(X, layer, cache)
        norm = _frobenius(Y)
        if not np.all(np.isfinite(norm)):
            stop = "overflow" if np.all(np.isfinite(Y)) else "nonfinite"
            break
        X = Y if Y.flags.writeable and Y is not X else np.array(Y)
        layers_run = layer + 1
        if renorm:
            log_scale = log_scale + _safe_log(norm)
            X = _rescale(X, cache, norm)
            log_norm = np.where(norm > 0, log_scale, -np.inf)
            tiny = norm == 0
        else:
            log_norm = _safe_log(norm)
            tiny = norm < UNDERFLOW_NORM
        recorder.record(layers_run, X, log_norm, tiny)
        if not renorm and np.any(norm > OVERFLOW_NORM):
            stop = "overflow"
            break
        if recorder.all_at_floor():
            stop = "floor"
            break

    metrics_out, log_norms = recorder.stacked()
    _warn_about(stop, layers_run, n_layers, recorder, floor)
    return Trajectory(
        metrics=metrics_out,
        log_norm=log_norms,
        final=X,
        log_scale=np.asarray(log_scale, dtype=np.float64),
        layers_run=layers_run,
        stop_reason=stop,
        floor_layer=recorder.floor_layer,
        renormalized=renorm,
    )


def _warn_about(
    stop: StopReason, layers_run: int, n_layers: int, recorder: _Recorder, floor: float | None
) -> None:
    reached = recorder.floor_layer >= 0
    if stop == "floor":
        warnings.warn(
            f"iteration stopped after layer {layers_run} of {n_layers}: every system reached the "
            f"float64 floor (HFC or the non-leading singular values below {floor or 0:.1e} of "
            f"||X||_F, or a vanishing state); deeper layers would only show round-off",
            NumericalFloorWarning,
            stacklevel=3,
        )
    elif stop in ("overflow", "nonfinite"):
        what = f"||X|| above {OVERFLOW_NORM:.0e}" if stop == "overflow" else "NaN or inf"
        warnings.warn(
            f"iteration stopped after layer {layers_run} of {n_layers}: the next state had {what} "
            f"(stop_reason={stop!r}); the rule is not homogeneous, so it cannot be renormalised",
            RuntimeWarning,
            stacklevel=3,
        )
    elif np.any(reached):
        warnings.warn(
            f"{int(reached.sum())} of {reached.size} systems reached the float64 floor (first at "
            f"layer {int(recorder.floor_layer[reached].min())}); their metrics after "
            f"Trajectory.floor_layer are round-off",
            NumericalFloorWarning,
            stacklevel=3,
        )


def fit_rate(values: ArrayLike, layers: ArrayLike | None = None) -> float:
    """Per-layer factor ``rho`` of a geometric sequence ``values_l ~ C rho^l`` (least squares).

    Fits ``log |values| = a + l log(rho)`` over the finite, nonzero entries (S9: every metric
    converges geometrically; claim 12 fits HFC/LFC this way).

    Parameters
    ----------
    values : (k,) array_like
        A metric, or its distance to its limit, per layer.
    layers : (k,) array_like, optional
        Layer indices; default ``0 .. k-1``.

    Returns
    -------
    float
        ``rho = exp(slope)``; below 1 for a decaying sequence.
    """
    y = np.abs(np.asarray(values, dtype=np.float64)).ravel()
    given = (
        np.arange(y.size, dtype=np.float64) if layers is None else as_float_array(layers, "layers")
    )
    x = np.ravel(given)
    if x.shape != y.shape:
        raise InputError(
            f"`layers` must have one entry per value ({y.size}); got shape {given.shape}"
        )
    usable = np.isfinite(y) & (y > 0)
    if np.count_nonzero(usable) < 2 or np.ptp(x[usable]) == 0:
        raise InputError(
            "`values` must have at least 2 finite nonzero entries at distinct layers to fit a rate; "
            f"got {int(np.count_nonzero(usable))}"
        )
    design = np.stack([np.ones(np.count_nonzero(usable)), x[usable]], axis=1)
    (_, slope), *_ = np.linalg.lstsq(design, np.log(y[usable]), rcond=None)
    return float(np.exp(slope))
