"""``oversmooth verify``: run the paper's checkable claims (:mod:`oversmooth.simulator.checks`) and report.

Prints one row per check (name, claim, cases, passed, worst margin, statement), or with ``--json``
a JSON array of objects with ``name``, ``claim``, ``statement``, ``cases``, ``passed``,
``worst_margin`` (null when not finite), ``failing_seed``, ``seconds``, ``error``, ``unit`` and
``counterexample``. Exit status 0 when every check passed, 1 when one failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import time
from types import ModuleType
from typing import TYPE_CHECKING

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.limits import check_size

if TYPE_CHECKING:
    from oversmooth.simulator import checks


def _checks() -> ModuleType:
    """The checks module, imported on first use so building the CLI parser stays cheap (no SciPy)."""
    from oversmooth.simulator import checks

    return checks


_COLUMNS = ("name", "claim", "cases", "passed", "worst margin", "statement")
_WIDTHS = (36, 5, 6, 6, 12)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` subcommand to the ``oversmooth`` dispatcher."""
    parser = subparsers.add_parser(
        "verify",
        help="check the paper's claims 1-30 and 34-35 on random instances",
        description=(
            "Run every checkable claim of the paper (or those named by --only) on --examples "
            "random instances each. A check passes when every instance has margin >= 0."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    parser.add_argument(
        "--examples",
        type=int,
        default=None,
        metavar="N",
        help="random instances per check (default: simulator.checks.DEFAULT_EXAMPLES)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the whole run (default 0)"
    )
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="run only these checks (see --list)"
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.set_defaults(func=run)


def _validated_names(only: list[str] | None) -> list[str]:
    known = _checks().check_names()
    if only is None:
        return list(known)
    for name in only:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else " (see --list)"
            raise InputError(
                f"`--only` must name checks of `oversmooth verify`; got {name!r}{hint}"
            )
    return list(dict.fromkeys(only))


def _validate(args: argparse.Namespace) -> list[str]:
    if args.examples is None:
        args.examples = _checks().DEFAULT_EXAMPLES
    if args.examples <= 0:
        raise InputError(f"`--examples` must be a positive integer; got {args.examples}")
    check_size(args.examples, "--examples", "max_examples")
    if args.seed < 0:
        raise InputError(f"`--seed` must be a non-negative integer; got {args.seed}")
    return _validated_names(args.only)


def _format_margin(margin: float) -> str:
    return f"{margin:.3g}" if math.isfinite(margin) else str(margin)


def _row(values: tuple[object, ...]) -> str:
    cells = [str(v).ljust(w) for v, w in zip(values[:-1], _WIDTHS, strict=True)]
    return " ".join([*cells, str(values[-1])])


def _table_row(result: checks.CheckResult) -> str:
    passed = "yes" if result.passed else "NO"
    return _row(
        (
            result.name,
            result.claim,
            result.cases,
            passed,
            _format_margin(result.worst_margin),
            result.statement,
        )
    )


def _failure_lines(result: checks.CheckResult) -> list[str]:
    lines = [f"  {result.name}: worst margin {_format_margin(result.worst_margin)}"]
    if result.failing_seed is not None:
        lines[0] += (
            f" at seed {result.failing_seed} (reproduce with "
            f"oversmooth.simulator.checks.run_case(check, {result.failing_seed}))"
        )
    if result.error:
        lines.append(f"    raised {result.error}")
    return lines


def _print_list() -> None:
    for check in _checks().CHECKS:
        tag = " [counterexample]" if check.counterexample else ""
        print(f"{check.name:36s} claim {check.claim:2d}{tag}: {check.statement}")


def _json_records(results: list[checks.CheckResult]) -> list[dict[str, object]]:
    by_name = {check.name: check for check in _checks().CHECKS}
    return [
        {
            **result.as_dict(),
            "unit": by_name[result.name].unit,
            "counterexample": by_name[result.name].counterexample,
        }
        for result in results
    ]


def _run_table(names: list[str], examples: int, seed: int) -> list[checks.CheckResult]:
    print(_row(_COLUMNS))
    results = []
    for name in names:
        (result,) = _checks().verify(examples=examples, seed=seed, names=[name])
        print(_table_row(result), flush=True)
        results.append(result)
    return results


def run(args: argparse.Namespace) -> int:
    """Run the selected checks; 0 when all passed, 1 otherwise."""
    names = _validate(args)
    if args.list:
        _print_list()
        return 0
    start = time.perf_counter()
    if args.json:
        results = _checks().verify(examples=args.examples, seed=args.seed, names=names)
        print(json.dumps(_json_records(results), indent=2, allow_nan=False))
    else:
        results = _run_table(names, args.examples, args.seed)
        failed = [r for r in results if not r.passed]
        passed = len(results) - len(failed)
        seconds = time.perf_counter() - start
        print(
            f"{passed} of {len(results)} checks passed in {seconds:.1f} s "
            f"(examples={args.examples}, seed={args.seed})"
        )
        for result in failed:
            print("\n".join(_failure_lines(result)))
    return 0 if all(r.passed for r in results) else 1
