"""``oversmooth simulate``: iterate one update rule on a fixed system and write the metrics per layer.

The system ``(A, W_V, W_proj, X0[, gamma, beta])`` comes from an ``.npz`` file (``--system``) or is
drawn from the synthetic options (``--n``, ``--d``, ``--a-kind``, ``--h-spectrum``, ``--scale``,
``--seed``, ``--gamma``). The output CSV is tidy, ``layer,metric,value``, with layer 0 = X0.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

from oversmooth.simulator.dynamics import FLOOR, Trajectory, iterate
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.output import write_tidy_csv
from oversmooth.simulator.systems import A_KINDS, System, draw_system, load_system, save_system
from oversmooth.simulator.theory import Prediction, predict
from oversmooth.simulator.updates import RULE_OPTIONS, SYSTEM_RULES, rule_from_system
from oversmooth.simulator.validation import check_choice, check_positive_int

__all__ = ["parse_rule_params", "register", "run"]

#: Defaults of the synthetic options (:func:`oversmooth.simulator.systems.draw_system`'s arguments).
SYNTHETIC_DEFAULTS: dict[str, Any] = {
    "n": 16,
    "d": 8,
    "a_kind": "symmetric",
    "h_spectrum": "negative",
    "scale": 1.0,
    "seed": 0,
    "gamma": None,
}
#: How error messages name each synthetic option.
_OPTION_NAMES = {key: f"--{key.replace('_', '-')}" for key in SYNTHETIC_DEFAULTS}


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
    parser.add_argument(
        "--force", action="store_true", help="replace existing output files that are not ours"
    )
    parser.add_argument("--no-floor", action="store_true", help="do not stop at the float64 floor")
    parser.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------
# the system: from a file or drawn
# ----------------------------------------------------------------------------------------------


def _system_from_args(args: argparse.Namespace) -> System:
    synthetic = {key: getattr(args, key) for key in SYNTHETIC_DEFAULTS}
    if args.system is not None:
        given = [_OPTION_NAMES[key] for key, value in synthetic.items() if value is not None]
        if given:
            raise InputError(
                f"`--system` and the synthetic options are exclusive; got --system with {given[0]}"
            )
        return load_system(args.system, label="--system")
    chosen = {
        key: SYNTHETIC_DEFAULTS[key] if value is None else value for key, value in synthetic.items()
    }
    return draw_system(**chosen, labels=_OPTION_NAMES)


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
        save_system(args.save_system, system, label="--save-system", force=args.force)
    # errors name the option, one line (simulator.output.atomic_output)
    write_tidy_csv(
        args.out,
        ("layer", "metric", "value"),
        trajectory.to_rows(),
        label="--out",
        replace_any=args.force,
    )
    _print_summary(args, system, trajectory, prediction, [str(w.message) for w in caught])
    return 0


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
