"""``oversmooth simulate``: iterate one update rule on a fixed system and write the metrics per layer.

The system ``(A, W_V, W_proj, X0[, gamma, beta])`` comes from an ``.npz`` file (``--system``) or is
drawn from the synthetic options (``--n``, ``--d``, ``--a-kind``, ``--h-spectrum``, ``--scale``,
``--seed``, ``--gamma``). The output CSV is tidy, ``layer,metric,value``, with layer 0 = X0.
"""

from __future__ import annotations

import argparse
import csv
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simulator.dynamics import FLOOR, Trajectory, iterate
from simulator.errors import InputError
from simulator.output import atomic_output
from simulator.spectra import (
    attention_doubly_stochastic,
    attention_general,
    attention_symmetric_scores,
    h_symmetric,
    random_tokens,
)
from simulator.theory import Prediction, predict
from simulator.updates import RULE_OPTIONS, SYSTEM_RULES, rule_from_system
from simulator.validation import as_float_array, check_choice, check_positive_int, regular_file

__all__ = ["System", "draw_system", "load_system", "parse_rule_params", "register", "run"]

REQUIRED_KEYS = ("A", "W_V", "W_proj", "X0")
OPTIONAL_KEYS = ("gamma", "beta")
A_KINDS = ("symmetric", "doubly-stochastic", "general")
#: Named H spectra: eigenvalues drawn uniformly in these intervals (claims 9 and 10).
H_SPECTRA = {"negative": (-1.0, -0.05), "positive": (0.05, 1.0)}
SYNTHETIC_DEFAULTS = {
    "n": 16,
    "d": 8,
    "a_kind": "symmetric",
    "h_spectrum": "negative",
    "scale": 1.0,
    "seed": 0,
    "gamma": None,
}


@dataclass(frozen=True)
class System:
    """A fixed system: attention, weights, initial tokens and optional LayerNorm parameters."""

    A: np.ndarray
    W_V: np.ndarray
    W_proj: np.ndarray
    X0: np.ndarray
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays to save, under their npz keys."""
        keys = (*REQUIRED_KEYS, *OPTIONAL_KEYS)
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``simulate`` to the dispatcher."""
    parser = subparsers.add_parser(
        "simulate",
        help="iterate an update rule on a fixed system and write per-layer smoothing metrics",
        description=__doc__.splitlines()[0],
    )
    source = parser.add_argument_group("system (a file, or synthetic options)")
    source.add_argument("--system", metavar="SYS.npz", help="A, W_V, W_proj, X0[, gamma, beta]")
    source.add_argument("--n", type=int, help="tokens (default 16)")
    source.add_argument("--d", type=int, help="features (default 8)")
    source.add_argument("--a-kind", help=f"{' | '.join(A_KINDS)} (default symmetric)")
    source.add_argument(
        "--h-spectrum", help="negative | positive | uniform:LOW:HIGH (default negative)"
    )
    source.add_argument("--scale", type=float, help="attention logit scale (default 1)")
    source.add_argument("--seed", type=int, help="random seed (default 0)")
    source.add_argument("--gamma", type=float, help="uniform LayerNorm weight, either sign")
    parser.add_argument("--rule", default="linear", help=f"{', '.join(SYSTEM_RULES)}")
    parser.add_argument(
        "--rule-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a rule option, e.g. lam=0.4, tau=1, omega=0.5, s_h=0.5, weights=0.5,0.5",
    )
    parser.add_argument("--layers", type=int, required=True, help="number of layers L")
    parser.add_argument("--out", required=True, metavar="TRAJ.csv", help="tidy per-layer metrics")
    parser.add_argument("--save-system", metavar="SYS.npz", help="also write the system used")
    parser.add_argument("--no-floor", action="store_true", help="do not stop at the float64 floor")
    parser.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------
# the system: from a file or drawn
# ----------------------------------------------------------------------------------------------


def load_system(path: str) -> System:
    """Read and validate the arrays of a system file (structure only; the rule checks the rest)."""
    arrays = _read_npz(path)
    missing = [key for key in REQUIRED_KEYS if key not in arrays]
    if missing:
        raise InputError(
            f"`--system` must contain the keys {', '.join(REQUIRED_KEYS)}; {path!r} lacks "
            f"{', '.join(missing)} (has {', '.join(sorted(arrays)) or 'no arrays'})"
        )
    checked = {
        key: _array(arrays[key], key, path) for key in arrays if key in System.__annotations__
    }
    for key, ndim in (("A", 2), ("W_V", 2), ("W_proj", 2), ("X0", 2), ("gamma", 1), ("beta", 1)):
        if key in checked and checked[key].ndim != ndim:
            what = "a single 2-D matrix" if ndim == 2 else "a 1-D vector (one per feature)"
            raise InputError(
                f"`{key}` in --system {path!r} must be {what}; got shape {checked[key].shape}"
            )
    return System(**checked)


def _read_npz(path: str) -> dict[str, Any]:
    try:
        data = np.load(regular_file(path, "--system"), allow_pickle=False)
    except OSError as err:
        raise InputError(
            f"`--system` must be a readable .npz file; got {path!r} ({err.strerror or err})"
        ) from None
    except (ValueError, EOFError, zipfile.BadZipFile):
        raise InputError(f"`--system` must be a NumPy .npz archive; got {path!r}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise InputError(
            f"`--system` must be an .npz archive of named arrays; got .npy data {path!r}"
        )
    try:
        with data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise InputError(
            f"`--system` must hold plain numeric arrays; {path!r} has an unreadable entry "
            f"({type(err).__name__})"
        ) from None


def _array(value: Any, key: str, path: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        kind = getattr(value, "dtype", type(value).__name__)
        raise InputError(f"`{key}` in --system {path!r} must be a real numeric array; got {kind}")
    try:
        return as_float_array(value, key)
    except InputError as err:
        raise InputError(f"{err} (in --system {path!r})") from None


def _h_interval(spec: str) -> tuple[float, float]:
    if spec in H_SPECTRA:
        return H_SPECTRA[spec]
    parts = spec.split(":")
    try:
        if len(parts) != 3 or parts[0] != "uniform":
            raise ValueError
        low, high = float(parts[1]), float(parts[2])
    except ValueError:
        raise InputError(
            f"`--h-spectrum` must be negative, positive or uniform:LOW:HIGH; got {spec!r}"
        ) from None
    if not (np.isfinite(low) and np.isfinite(high) and low <= high):
        raise InputError(f"`--h-spectrum` must have finite LOW <= HIGH; got {spec!r}")
    return low, high


def draw_system(
    *,
    n: int,
    d: int,
    a_kind: str,
    h_spectrum: str,
    scale: float,
    seed: int,
    gamma: float | None = None,
) -> System:
    """Draw A of the given kind, ``H = Q diag(lambda) Q^T`` with lambda uniform in the H spectrum's
    interval, ``W_V = I``, ``W_proj = H^T`` (so ``W_V W_proj = M = H^T``) and ``X0 ~ N(0, 1)``."""
    n = check_positive_int(n, "--n")
    d = check_positive_int(d, "--d")
    if n < 2:
        raise InputError(f"`--n` must be at least 2 (tokens); got {n}")
    check_choice(a_kind, "--a-kind", A_KINDS)
    low, high = _h_interval(h_spectrum)
    if not np.isfinite(scale):
        raise InputError(f"`--scale` must be finite; got {scale!r}")
    if seed < 0:
        raise InputError(f"`--seed` must be a non-negative integer; got {seed!r}")
    rng = np.random.default_rng(seed)
    draw_a = {
        "symmetric": attention_symmetric_scores,
        "doubly-stochastic": attention_doubly_stochastic,
        "general": attention_general,
    }[a_kind]
    A = draw_a(n, scale=scale, rng=rng)
    H = h_symmetric(rng.uniform(low, high, d), rng=rng)
    X0 = random_tokens(n, d, rng=rng)
    g = None if gamma is None else np.full(d, float(gamma))
    return System(A=A, W_V=np.eye(d), W_proj=H.T.copy(), X0=X0, gamma=g)


def _system_from_args(args: argparse.Namespace) -> System:
    synthetic = {key: getattr(args, key) for key in SYNTHETIC_DEFAULTS}
    if args.system is not None:
        given = [
            f"--{key.replace('_', '-')}" for key, value in synthetic.items() if value is not None
        ]
        if given:
            raise InputError(
                f"`--system` and the synthetic options are exclusive; got --system with {given[0]}"
            )
        return load_system(args.system)
    chosen = {
        key: SYNTHETIC_DEFAULTS[key] if value is None else value for key, value in synthetic.items()
    }
    return draw_system(**chosen)


# ----------------------------------------------------------------------------------------------
# rule options
# ----------------------------------------------------------------------------------------------


def _parse_value(key: str, text: str) -> Any:
    if key == "code_faithful":
        if text.lower() not in ("true", "false", "1", "0"):
            raise InputError(f"`--rule-param {key}` must be true or false; got {text!r}")
        return text.lower() in ("true", "1")
    try:
        numbers = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise InputError(
            f"`--rule-param {key}` must be a number or comma-separated numbers; got {text!r}"
        ) from None
    return numbers if key == "weights" or len(numbers) > 1 else numbers[0]


def parse_rule_params(rule: str, items: list[str]) -> dict[str, Any]:
    """``["lam=0.4"] -> {"lam": 0.4}``, checking each key against the rule's options."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise InputError(f"`--rule-param` must look like KEY=VALUE; got {item!r}")
        if key not in RULE_OPTIONS[rule]:
            accepted = ", ".join(RULE_OPTIONS[rule]) or "none"
            raise InputError(
                f"`--rule-param` key must be one accepted by rule {rule!r} ({accepted}); got {key!r}"
            )
        options[key] = _parse_value(key, text)
    return options


# ----------------------------------------------------------------------------------------------
# running and reporting
# ----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Validate everything, iterate, write the CSV (and the system), print a summary."""
    check_choice(args.rule, "--rule", SYSTEM_RULES)
    layers = check_positive_int(args.layers, "--layers")
    options = parse_rule_params(args.rule, args.rule_param)
    system = _system_from_args(args)
    try:
        rule = rule_from_system(
            args.rule,
            A=system.A,
            W_V=system.W_V,
            W_proj=system.W_proj,
            gamma=system.gamma,
            beta=system.beta,
            **options,
        )
        rule.check_tokens(system.X0, "X0")
    except InputError as err:
        where = f" (in --system {args.system!r})" if args.system is not None else ""
        raise InputError(f"{err}{where}") from None
    prediction = predict(system.A, rule.H)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trajectory = iterate(rule, system.X0, layers, floor=None if args.no_floor else FLOOR)
    if args.save_system:
        _write(
            args.save_system,
            "--save-system",
            lambda handle: np.savez(handle, **system.arrays()),
            "wb",
        )
    _write(args.out, "--out", lambda handle: _write_csv(handle, trajectory), "w")
    _print_summary(args, system, trajectory, prediction, [str(w.message) for w in caught])
    return 0


def _write(path: str, option: str, writer: Any, mode: str) -> None:
    with atomic_output(path, mode, label=option) as handle:  # errors name the option, one line
        writer(handle)


def _write_csv(handle: Any, trajectory: Trajectory) -> None:
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(("layer", "metric", "value"))
    writer.writerows(trajectory.to_rows())


def _format(value: float) -> str:
    return f"{value:.6g}"


def _print_summary(
    args: argparse.Namespace,
    system: System,
    trajectory: Trajectory,
    prediction: Prediction,
    notes: list[str],
) -> None:
    n, d = system.X0.shape
    source = args.system if args.system is not None else "synthetic"
    print(
        f"simulate: rule {args.rule}, system {source} (n={n}, d={d}), "
        f"{trajectory.layers_run} of {args.layers} layers, stop_reason {trajectory.stop_reason}"
    )
    final = ", ".join(
        f"{name}={_format(float(values[-1]))}" for name, values in trajectory.metrics.items()
    )
    print(f"final metrics (layer {trajectory.layers_run}): {final}")
    print(f"log ||X_L||_F = {_format(float(trajectory.log_norm[-1]))}")
    print(_describe_prediction(prediction))
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {Path(args.out)}")


def _describe_prediction(prediction: Prediction) -> str:
    dom = prediction.dominance
    verdict = {True: "yes", False: "no"}
    limits = []
    if prediction.hfc_lfc_limit is not None:
        limits.append(f"hfc_lfc -> {_format(prediction.hfc_lfc_limit)}")
    if prediction.cosine_limit is not None:
        limits.append(f"cosine -> {_format(prediction.cosine_limit)}")
    return (
        f"theory for the linear rule X + A X W_V W_proj: dominating eigenvalue {dom.kind} "
        f"(|mu*| = {_format(dom.modulus)}, rate {_format(prediction.rate)}); "
        f"input convergence {verdict[prediction.input_convergence]}, "
        f"angle convergence {verdict[prediction.angle_convergence]}, "
        f"rank collapse {verdict[prediction.rank_collapse]}"
        + (f"; limits {', '.join(limits)}" if limits else "")
    )
