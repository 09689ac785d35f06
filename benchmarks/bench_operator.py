"""``python -m benchmarks operator``: the cost of the exact operator dominance in an audit.

For a zoo model (default DINOv2 on its bundled photographs), times in one process, one after the
other on the same inputs: the audit with the per-head dominance (``--dominance head``), and with
the operator dominance on the first 1 and 2 inputs (``--dominance operator``). The operator's cost
per (input, block) is the difference divided by its cases; the ratio to the per-head audit is
measured in the same run, so it is comparable across machines, the seconds are not.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

from benchmarks.bench_audit import load_average
from oversmooth.commands.common import positive_int


def main(argv: Sequence[str] | None = None) -> None:
    """Print the per-head audit's time, the operator audits' times, and the cost per case."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks operator")
    parser.add_argument("--model", default="dinov2-vits14")
    parser.add_argument("--inputs", type=positive_int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)

    from oversmooth.importers.audit.pipeline import audit

    print(f"operator dominance on {args.model}, {os.cpu_count()} cores ({load_average()})")
    start = time.perf_counter()
    base = audit(args.model, provider="cpu", dominance="head")
    head_seconds = time.perf_counter() - start
    print(f"  per-head audit: {head_seconds:.1f} s ({base.inputs.n_inputs} inputs)")
    for count in args.inputs:
        start = time.perf_counter()
        result = audit(args.model, provider="cpu", dominance="operator", operator_inputs=count)
        seconds = time.perf_counter() - start
        cases = len(result.operator)
        iterations = sum(case.iterations for case in result.operator) / max(cases, 1)
        per_case = (seconds - head_seconds) / max(cases, 1)
        print(
            f"  operator on {count} input(s): {seconds:.1f} s, {seconds / head_seconds:.2f}x the "
            f"per-head audit; {cases} (input, block) cases, {per_case:.2f} s and "
            f"{iterations:.0f} applications of the operator each"
        )
