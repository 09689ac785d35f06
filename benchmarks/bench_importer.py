"""How long ``oversmooth inspect`` takes on each installed real model.

Two numbers per model: the library work (``load_model`` + ``find_attention_blocks``, median of
several runs in this process) and the whole command in a fresh interpreter (start-up, imports, zoo
resolution with its sha256 check, parsing, matching, printing; median of a few runs). The target
is under 2 s for the 97 MB DINOv2 ViT-S/14 on 2 cores.

Run with ``python -m benchmarks importer [--repeats N]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from oversmooth.commands.common import positive_int
from oversmooth.importers import zoo
from oversmooth.importers.graph import load_model
from oversmooth.importers.match import find_attention_blocks
from oversmooth.simulator.errors import OversmoothError

__all__ = ["main"]


def library_seconds(path: str, repeats: int) -> tuple[float, int]:
    """Median seconds of load + match, and the number of blocks found."""
    times, blocks = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        blocks = len(find_attention_blocks(load_model(path)).blocks)
        times.append(time.perf_counter() - start)
    return statistics.median(times), blocks


def command_seconds(argument: str, repeats: int) -> float:
    """Median wall seconds of ``oversmooth inspect ARGUMENT`` in a fresh interpreter."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "oversmooth.cli", "inspect", argument],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the inspect timings of every installed zoo model."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks importer")
    parser.add_argument(
        "--repeats", type=positive_int, default=5, help="runs per measurement (default 5)"
    )
    args = parser.parse_args(argv)
    print("inspect timings (median seconds)")
    for model in zoo.models():
        try:
            path = str(zoo.installed_model_path(model.name))
        except OversmoothError as err:
            print(f"  {model.name}: skipped ({err})")
            continue
        library, blocks = library_seconds(path, args.repeats)
        by_path = command_seconds(path, max(3, args.repeats // 2))
        by_name = command_seconds(model.name, max(3, args.repeats // 2))
        print(
            f"  {model.name:<16} {blocks:>2} blocks  load+match {library:6.3f} s  "
            f"`oversmooth inspect PATH` {by_path:6.3f} s  `oversmooth inspect {model.name}` "
            f"{by_name:6.3f} s"
        )


if __name__ == "__main__":
    main()
