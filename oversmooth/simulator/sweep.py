"""A grid of simulator runs: the sweep specification, its cells, and what one cell measures.

``oversmooth sweep SPEC --out DIR`` runs every cell of a grid over the synthetic-system options of
``oversmooth simulate`` (n, d, attention kind, H spectrum, logit scale, LayerNorm weight γ with its
sign, depth, seed) and the update rules with their options; each cell gives one row of final
metrics and theory predictions. This module is the pure part (NumPy only): reading and checking a
specification, listing its cells in a fixed order, and evaluating one cell. Running the cells in
parallel (in this process or on a Dask cluster) and drawing the regime map live above the
simulator (``oversmooth.figures.cmd_sweep``).

Specification
-------------
A JSON object (``.json``) or TOML table (``.toml``). Every key but ``layers`` is optional; each
value is one value or a list of values, and the grid is their Cartesian product::

    {
      "n": [16], "d": [8],
      "a_kind": ["symmetric", "general"],
      "h_spectrum": ["negative", "positive", "uniform:-2:-1"],
      "scale": 1.0,
      "gamma": [null, 1, -1],
      "rules": [{"rule": "linear"}, {"rule": "pre-ln"}, {"rule": "neutreno", "lam": [0.4, 0.8]}],
      "layers": [100, 1000],
      "seeds": 3
    }

``gamma`` is the uniform LayerNorm weight (either sign; ``null`` or ``"none"``: no weight, i.e. 1);
``seeds`` is a list of seeds or a count (``3`` means 0, 1, 2); each entry of ``rules`` names a rule of
:data:`oversmooth.simulator.updates.SYSTEM_RULES` with its options (:data:`oversmooth.simulator.updates.RULE_OPTIONS`),
each a value or a list of values (a list of pairs for ``weights``). Unknown keys, wrong types and
values a rule refuses are errors, found before any cell runs.

Theory per cell
---------------
The prediction is that of repeated linear layers ``X + A X M`` on the cell's A (docs/theory.md §3.2),
with ``M = diag(γ) W_V W_proj`` for ``pre-ln`` (claim 21) and ``M = W_V W_proj`` otherwise: for the
mitigations and Post-LN it is the regime the rule is compared against, not a theorem about it.

Public API
----------
SweepSpec, Cell
    A checked specification and one cell of its grid.
parse_spec, load_spec
    Check a mapping, or read and check a ``.json`` / ``.toml`` file.
evaluate_cell, evaluate_cells
    Draw, iterate and predict one cell (or several); one table row each.
SWEEP_COLUMNS
    The columns of the table, in order.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oversmooth.simulator.dynamics import FLOOR, iterate
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.limits import check_elements, check_size
from oversmooth.simulator.metrics import METRICS
from oversmooth.simulator.systems import A_KINDS, _h_interval, draw_system
from oversmooth.simulator.theory import predict
from oversmooth.simulator.updates import RULE_OPTIONS, SYSTEM_RULES, rule_from_system
from oversmooth.simulator.validation import regular_file

__all__ = [
    "SWEEP_COLUMNS",
    "Cell",
    "SweepSpec",
    "evaluate_cell",
    "evaluate_cells",
    "load_spec",
    "parse_spec",
]

#: The settings of a cell, in table order.
CELL_COLUMNS = (
    "cell",
    "n",
    "d",
    "a_kind",
    "h_spectrum",
    "scale",
    "gamma",
    "rule",
    "params",
    "layers",
    "seed",
)
#: What a cell's run measured: its stop, then each metric at the last layer run.
OBSERVED_COLUMNS = (
    "layers_run",
    "stop_reason",
    "floor_layer",
    *(f"final_{name}" for name in METRICS),
    "final_log_norm",
)
#: What the theory predicts for the cell (:func:`oversmooth.simulator.theory.predict`).
THEORY_COLUMNS = (
    "predicted_kind",
    "mu_modulus",
    "predicted_rate",
    "input_convergence",
    "angle_convergence",
    "rank_collapse",
    "hfc_lfc_limit",
    "cosine_limit",
)
#: Every column of the sweep table.
SWEEP_COLUMNS = CELL_COLUMNS + OBSERVED_COLUMNS + THEORY_COLUMNS

#: Top-level keys of a specification, each with its default (``layers`` has none).
_DEFAULTS: dict[str, Any] = {
    "n": 16,
    "d": 8,
    "a_kind": "symmetric",
    "h_spectrum": "negative",
    "scale": 1.0,
    "gamma": None,
    "rules": [{"rule": "linear"}],
    "seeds": [0],
}
_KEYS = (*_DEFAULTS, "layers")
#: Rule options holding a pair (a list of numbers is one value, a list of pairs a grid).
_PAIR_OPTIONS = ("weights",)
_BOOL_OPTIONS = ("code_faithful",)


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: a synthetic system, a rule with its options, a depth.

    ``params`` holds the rule's options as sorted ``(name, value)`` pairs.
    """

    index: int
    n: int
    d: int
    a_kind: str
    h_spectrum: str
    scale: float
    gamma: float | None
    rule: str
    params: tuple[tuple[str, Any], ...]
    layers: int
    seed: int

    def settings(self) -> dict[str, Any]:
        """The cell's columns of the table (:data:`CELL_COLUMNS`)."""
        params = " ".join(f"{key}={_format_option(value)}" for key, value in self.params)
        return {
            "cell": self.index,
            "n": self.n,
            "d": self.d,
            "a_kind": self.a_kind,
            "h_spectrum": self.h_spectrum,
            "scale": self.scale,
            "gamma": self.gamma,
            "rule": self.rule,
            "params": params,
            "layers": self.layers,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep specification: the values of every grid axis.

    Attributes
    ----------
    n, d, a_kind, h_spectrum, scale, gamma, layers, seeds : tuple
        The values of each synthetic-system axis and of the depth.
    rules : tuple of (str, tuple of (name, value) pairs)
        Every rule with one combination of its options (option lists already expanded).
    """

    n: tuple[int, ...]
    d: tuple[int, ...]
    a_kind: tuple[str, ...]
    h_spectrum: tuple[str, ...]
    scale: tuple[float, ...]
    gamma: tuple[float | None, ...]
    rules: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    layers: tuple[int, ...]
    seeds: tuple[int, ...]

    @property
    def n_cells(self) -> int:
        """Number of cells in the grid."""
        axes = (self.n, self.d, self.a_kind, self.h_spectrum, self.scale, self.gamma, self.rules)
        return math.prod(len(axis) for axis in (*axes, self.layers, self.seeds))

    def cells(self) -> list[Cell]:
        """Every cell, in a fixed order (the last axis, the seed, varies fastest)."""
        grid = itertools.product(
            self.n,
            self.d,
            self.a_kind,
            self.h_spectrum,
            self.scale,
            self.gamma,
            self.rules,
            self.layers,
            self.seeds,
        )
        return [
            Cell(index, n, d, a_kind, h_spectrum, scale, gamma, rule, params, layers, seed)
            for index, (n, d, a_kind, h_spectrum, scale, gamma, (rule, params), layers, seed) in (
                enumerate(grid)
            )
        ]

    def to_dict(self) -> dict[str, Any]:
        """The specification as plain data (for provenance records)."""
        return {
            "n": self.n,
            "d": self.d,
            "a_kind": self.a_kind,
            "h_spectrum": self.h_spectrum,
            "scale": self.scale,
            "gamma": self.gamma,
            "rules": [{"rule": rule, **dict(params)} for rule, params in self.rules],
            "layers": self.layers,
            "seeds": self.seeds,
        }


# ----------------------------------------------------------------------------------------------
# reading and checking a specification
# ----------------------------------------------------------------------------------------------


def _format_option(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(repr(float(item)) for item in value)
    return str(value).lower() if isinstance(value, bool) else repr(value)


def _values(spec: Mapping[str, Any], key: str) -> list[Any]:
    value = spec.get(key, _DEFAULTS.get(key))
    values = list(value) if isinstance(value, list) else [value]
    if not values:
        raise InputError(f"sweep spec key {key!r} must hold at least one value; got an empty list")
    return values


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ints(values: list[Any], key: str, low: int) -> tuple[int, ...]:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"sweep spec key {key!r} must hold integers >= {low}; got {value!r}")
    return tuple(values)


def _finite(values: list[Any], key: str, *, none: bool = False) -> tuple[Any, ...]:
    checked: list[float | None] = []
    for value in values:
        if none and (value is None or value == "none"):
            checked.append(None)
        elif _is_number(value) and math.isfinite(value):
            checked.append(float(value))
        else:
            allowed = "finite numbers or null" if none else "finite numbers"
            raise InputError(f"sweep spec key {key!r} must hold {allowed}; got {value!r}")
    return tuple(checked)


def _strings(values: list[Any], key: str) -> tuple[str, ...]:
    for value in values:
        if not isinstance(value, str):
            raise InputError(f"sweep spec key {key!r} must hold strings; got {value!r}")
    return tuple(values)


def _seeds(spec: Mapping[str, Any]) -> tuple[int, ...]:
    value = spec.get("seeds", _DEFAULTS["seeds"])
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise InputError(
                f"sweep spec key 'seeds' must be a positive count or a list; got {value}"
            )
        return tuple(range(value))
    return _ints(_values(spec, "seeds"), "seeds", 0)


def _option_values(rule: str, key: str, value: Any, where: str) -> list[Any]:
    """The values of one rule option: a value or a list of values, checked for type."""
    given: list[Any] = value if isinstance(value, list) else [value]
    values: list[Any] = []
    if key in _PAIR_OPTIONS:  # a list of numbers is one pair; a list of lists, several
        grid = given if given and isinstance(given[0], list) else [given]
        if all(isinstance(v, list) and all(_is_number(x) for x in v) for v in grid):
            values = [tuple(float(x) for x in v) for v in grid]
        expected = "a list of numbers or a list of such lists"
    elif key in _BOOL_OPTIONS:
        values = given if all(isinstance(v, bool) for v in given) else []
        expected = "true, false or a list of them"
    else:
        if all(_is_number(v) and math.isfinite(v) for v in given):
            values = [float(v) for v in given]
        expected = "a finite number or a list of them"
    if not values:
        raise InputError(
            f"sweep spec {where} option {key!r} of rule {rule!r} must be {expected}; got {value!r}"
        )
    return values


def _check_rule(rule: str, options: dict[str, Any], where: str) -> None:
    """Build the rule on a tiny system so that an option it refuses is found before any cell runs."""
    half = np.full((2, 2), 0.5)
    try:
        rule_from_system(rule, A=half, W_V=np.eye(2), W_proj=np.eye(2), **options)
    except InputError as err:
        raise InputError(f"sweep spec {where}: {err}") from None


def _rules(spec: Mapping[str, Any]) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    expanded = []
    for position, entry in enumerate(_values(spec, "rules")):
        where = f"rules[{position}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("rule"), str):
            raise InputError(
                f"sweep spec {where} must be an object with a string 'rule'; got {entry!r}"
            )
        rule = entry["rule"]
        if rule not in SYSTEM_RULES:
            raise InputError(
                f"sweep spec {where} 'rule' must be one of {', '.join(SYSTEM_RULES)}; got {rule!r}"
            )
        keys = sorted(key for key in entry if key != "rule")
        for key in keys:
            if key not in RULE_OPTIONS[rule]:
                accepted = ", ".join(RULE_OPTIONS[rule]) or "none"
                raise InputError(
                    f"sweep spec {where} option must be one accepted by rule {rule!r} "
                    f"({accepted}); got {key!r}"
                )
        grids = [_option_values(rule, key, entry[key], where) for key in keys]
        for combination in itertools.product(*grids):
            params = tuple(zip(keys, combination, strict=True))
            _check_rule(rule, dict(params), where)
            expanded.append((rule, params))
    return tuple(expanded)


def _check_sizes(spec: SweepSpec) -> None:
    """Refuse a grid whose cell count or arrays would exceed the size limits."""
    check_size(spec.n_cells, "sweep spec (cells in the grid)", "max_sweep_cells")
    n, d, layers = max(spec.n), max(spec.d), max(spec.layers)
    check_elements((n, n), "sweep spec n (attention matrix)")
    check_elements((n, d), "sweep spec n, d (tokens)")
    check_elements((layers + 1, len(METRICS) + 1), "sweep spec layers (metrics per layer)")


def parse_spec(spec: Any) -> SweepSpec:
    """Check a specification (a mapping, e.g. parsed JSON) and return it as a :class:`SweepSpec`.

    Raises
    ------
    InputError
        An unknown key, a missing ``layers``, a value of the wrong type or out of range, a rule
        option the rule does not accept or refuses, or a grid beyond the size limits; one line
        naming the key.
    """
    if not isinstance(spec, Mapping):
        raise InputError(f"sweep spec must be an object of grid axes; got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(_KEYS))
    if unknown:
        raise InputError(f"sweep spec key must be one of {', '.join(_KEYS)}; got {unknown[0]!r}")
    if "layers" not in spec:
        raise InputError("sweep spec must give 'layers' (the depth of every run); got none")
    h_spectra = _strings(_values(spec, "h_spectrum"), "h_spectrum")
    for h_spectrum in h_spectra:
        _h_interval(h_spectrum, "sweep spec key 'h_spectrum'")
    a_kinds = _strings(_values(spec, "a_kind"), "a_kind")
    for a_kind in a_kinds:
        if a_kind not in A_KINDS:
            raise InputError(
                f"sweep spec key 'a_kind' must hold {', '.join(A_KINDS)}; got {a_kind!r}"
            )
    checked = SweepSpec(
        n=_ints(_values(spec, "n"), "n", 2),
        d=_ints(_values(spec, "d"), "d", 1),
        a_kind=a_kinds,
        h_spectrum=h_spectra,
        scale=_finite(_values(spec, "scale"), "scale"),
        gamma=_finite(_values(spec, "gamma"), "gamma", none=True),
        rules=_rules(spec),
        layers=_ints(_values(spec, "layers"), "layers", 1),
        seeds=_seeds(spec),
    )
    _check_sizes(checked)
    return checked


def load_spec(path: str | os.PathLike[str], *, label: str = "SPEC") -> SweepSpec:
    """Read a ``.json`` or ``.toml`` specification file and check it (:func:`parse_spec`)."""
    file = regular_file(path, label)
    if file.suffix.lower() not in (".json", ".toml"):
        raise InputError(f"`{label}` must be a .json or .toml file; got {str(path)!r}")
    try:
        if file.suffix.lower() == ".toml":
            with file.open("rb") as handle:
                data: Any = tomllib.load(handle)
        else:
            with file.open(encoding="utf-8") as handle:
                data = json.load(handle)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(
            f"`{label}` must be valid {file.suffix[1:].upper()}; {str(path)!r}: {err}"
        ) from None
    except OSError as err:
        raise InputError(
            f"`{label}` must be readable; {str(path)!r}: {err.strerror or err}"
        ) from None
    return parse_spec(data)


# ----------------------------------------------------------------------------------------------
# one cell
# ----------------------------------------------------------------------------------------------


def _theory_H(rule_name: str, M: np.ndarray, gamma: np.ndarray | None) -> np.ndarray:
    """``H = M_eff^T``: ``M_eff = diag(γ) M`` under Pre-LN (claim 21), else ``M``."""
    if rule_name == "pre-ln" and gamma is not None:
        return (gamma[:, None] * M).T
    return M.T


def _optional(value: float | None) -> float | None:
    return None if value is None else float(value)


def evaluate_cell(cell: Cell) -> dict[str, Any]:
    """Draw the cell's system, iterate its rule, predict its regime; one row of :data:`SWEEP_COLUMNS`.

    Deterministic: the same cell gives the same row wherever it runs. An early stop (the float64
    floor, an overflow) is the row's ``stop_reason``, not a warning.
    """
    system = draw_system(
        n=cell.n,
        d=cell.d,
        a_kind=cell.a_kind,
        h_spectrum=cell.h_spectrum,
        scale=cell.scale,
        seed=cell.seed,
        gamma=cell.gamma,
    )
    rule = rule_from_system(
        cell.rule,
        A=system.A,
        W_V=system.W_V,
        W_proj=system.W_proj,
        gamma=system.gamma,
        **dict(cell.params),
    )
    prediction = predict(system.A, _theory_H(cell.rule, rule.M, system.gamma))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stop reason is a column of the row
        trajectory = iterate(rule, system.X0, cell.layers, floor=FLOOR)
    finals = {f"final_{name}": float(values[-1]) for name, values in trajectory.metrics.items()}
    return {
        **cell.settings(),
        "layers_run": trajectory.layers_run,
        "stop_reason": trajectory.stop_reason,
        "floor_layer": int(trajectory.floor_layer),
        **finals,
        "final_log_norm": float(trajectory.log_norm[-1]),
        "predicted_kind": prediction.dominance.kind,
        "mu_modulus": prediction.dominance.modulus,
        "predicted_rate": prediction.rate,
        "input_convergence": prediction.input_convergence,
        "angle_convergence": prediction.angle_convergence,
        "rank_collapse": prediction.rank_collapse,
        "hfc_lfc_limit": _optional(prediction.hfc_lfc_limit),
        "cosine_limit": _optional(prediction.cosine_limit),
    }


def evaluate_cells(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """:func:`evaluate_cell` of each cell, in order (one task of a parallel sweep)."""
    return [evaluate_cell(cell) for cell in cells]
