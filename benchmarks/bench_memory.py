"""Peak memory of ``oversmooth audit`` against the number of inputs: it should not grow.

Inputs are read batch by batch (:class:`~importers.run.feeds.Inputs` with a reader) and only one
batch of outputs is alive at a time, so the peak resident set of an audit of 1024 random inputs
should be within 10 % of one of 64 (what remains per input: the metric arrays, O(inputs x layers),
and the dominance cases, about 280 bytes per (input, layer, head)). Each audit runs in a fresh
interpreter; its peak RSS is the child's ``ru_maxrss`` from ``os.wait4``.

Run with ``python -m benchmarks.bench_memory [--models NAME ...] [--counts N ...]
[--dominance head|layer|none]``. DINOv2 on 1024 inputs takes long on a few cores (its dominance step
solves 72 eigenproblems of 257 x 257 per input): ``--dominance none`` leaves that step out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_audit import audit_command

__all__ = ["Peak", "audit_peak", "main"]

DEFAULT_MODELS = ("minilm-l3", "dinov2-vits14")
DEFAULT_COUNTS = (64, 1024)
#: Allowed growth of the peak RSS from the smallest to the largest count.
GROWTH_TARGET = 0.10


@dataclass(frozen=True)
class Peak:
    """One audit in a fresh interpreter: its peak resident set and wall time."""

    model: str
    n_inputs: int
    dominance: str
    peak_mib: float
    wall_s: float


def audit_peak(model: str, n_inputs: int, dominance: str = "head") -> Peak:
    """Run ``oversmooth audit MODEL --random N`` in a fresh interpreter; return its peak RSS.

    Raises
    ------
    RuntimeError
        The audit exited with a non-zero status (its last output line is in the message).
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report"
        command = audit_command(model, out, "--random", str(n_inputs), "--dominance", dominance)
        start = time.perf_counter()
        with subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        ) as child:
            _, status, usage = os.wait4(child.pid, 0)
            child.returncode = os.waitstatus_to_exitcode(status)
            errors = child.stderr.read() if child.stderr else ""
        wall = time.perf_counter() - start
    if child.returncode != 0:
        last = errors.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"oversmooth audit {model} exited with {child.returncode}: {last[0]}")
    return Peak(model, n_inputs, dominance, usage.ru_maxrss / 1024, wall)


def _print_model(model: str, counts: Sequence[int], dominance: str) -> None:
    base = None
    for count in counts:
        peak = audit_peak(model, count, dominance)
        base = base or peak.peak_mib
        growth = peak.peak_mib / base - 1
        flag = "" if growth <= GROWTH_TARGET else f"  (above the {GROWTH_TARGET:.0%} target)"
        print(
            f"{model:<16}{peak.n_inputs:>7}  {dominance:<6}{peak.peak_mib:>9.0f} MiB"
            f"{growth:>+8.1%}{peak.wall_s:>9.1f} s{flag}",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Print the peak RSS of audits of each model on each number of random inputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--counts", nargs="+", type=int, default=list(DEFAULT_COUNTS))
    parser.add_argument("--dominance", choices=("head", "layer", "none"), default="head")
    args = parser.parse_args(argv)
    counts = sorted(set(args.counts))
    print(f"peak RSS of `oversmooth audit MODEL --random N` (growth against N = {counts[0]})")
    print(f"{'model':<16}{'inputs':>7}  {'dom.':<6}{'peak':>13}{'growth':>8}{'wall':>11}")
    for model in args.models:
        _print_model(model, counts, args.dominance)


if __name__ == "__main__":
    main()
