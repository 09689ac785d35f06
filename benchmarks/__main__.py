"""``python -m benchmarks [NAME [ARGS...]]``: run every benchmark, or the one called NAME.

Each benchmark is a module with a ``main(argv=None)`` function; register a new one by adding its
name and module to :data:`BENCHMARKS`. Modules are imported only when run, so a benchmark's heavy
dependencies (onnxruntime, for instance) cost nothing to the others. An error a user can cause (a
model name not in the zoo, a file that is not a model) prints as one line with the status the
``oversmooth`` command gives it, never a traceback.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Sequence

from oversmooth.simulator.errors import OversmoothError, one_line

#: Benchmark name -> module with a ``main(argv=None)``.
BENCHMARKS: dict[str, str] = {
    "simulator": "benchmarks.bench_simulator",
    "importer": "benchmarks.bench_importer",
    "runner": "benchmarks.bench_runner",
    "ops": "benchmarks.bench_ops",
    "audit": "benchmarks.bench_audit",
    "scheduler": "benchmarks.bench_scheduler",
    "memory": "benchmarks.bench_memory",
    "operator": "benchmarks.bench_operator",
    "device": "benchmarks.bench_device",
    "gram": "benchmarks.bench_gram",
    "train": "benchmarks.bench_train",
}


def _run(name: str, argv: Sequence[str]) -> None:
    module = importlib.import_module(BENCHMARKS[name])
    try:
        if inspect.signature(module.main).parameters:
            module.main(list(argv))
        else:
            module.main()
    except OversmoothError as err:
        print(f"python -m benchmarks {name}: error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the named benchmark with the remaining arguments, or every benchmark without arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"benchmarks: {', '.join(BENCHMARKS)}")
        return 0
    if args:
        name = args[0]
        if name not in BENCHMARKS:
            print(
                f"python -m benchmarks: error: unknown benchmark {name!r}; "
                f"choose from {', '.join(BENCHMARKS)}",
                file=sys.stderr,
            )
            return 2
        _run(name, args[1:])
        return 0
    for name in BENCHMARKS:
        print(f"== {name} ==")
        _run(name, [])
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
