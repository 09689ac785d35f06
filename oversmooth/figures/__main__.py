"""``python -m oversmooth.figures [--quick] [--only NAME ...] --out DIR``: regenerate every figure and table."""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from oversmooth.figures import ON_DEMAND, SCRIPTS


def main(argv: Sequence[str] | None = None) -> int:
    """Run every script (or those named by ``--only``) into ``--out``; exit 1 if any failed."""
    parser = argparse.ArgumentParser(
        prog="python -m oversmooth.figures", description=__doc__.split(":")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (for tests)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scripts")
    parser.add_argument("--out", type=Path, default=Path("figures-out"), help="output folder")
    args = parser.parse_args(argv)
    names = args.only or list(SCRIPTS)
    known = (*SCRIPTS, *ON_DEMAND)
    for name in names:
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            parser.error(f"unknown figure {name!r}{suggestion} (known: {', '.join(known)})")
    if not args.only:
        for name in ON_DEMAND:
            print(
                f"{name}: skipped (on demand: it reads `oversmooth train` results; "
                f"run python -m oversmooth.figures --only {name})"
            )
    failed = []
    for name in names:
        module = importlib.import_module(f"oversmooth.figures.{name}")
        flags = ["--out", str(args.out)] + (["--quick"] if args.quick else [])
        try:
            module.main(flags)
        except Exception as err:  # report every failing script, then fail as a whole
            print(f"{name}: FAILED: {type(err).__name__}: {err}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(
            f"{len(failed)} of {len(names)} figure scripts failed: {', '.join(failed)}",
            file=sys.stderr,
        )
        return 1
    print(f"{len(names)} figure scripts written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
