"""``oversmooth doctor``: what onnxruntime can really run here, the GPU, the CUDA libraries loaded,
and, when CUDA cannot be used, the one reason in plain words with the command that fixes it.

Exit status 0 whatever it finds (it is a report); ``--json`` prints the same as one document.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``doctor`` to the dispatcher."""
    parser = subparsers.add_parser(
        "doctor",
        help="which onnxruntime providers work here (CPU, CUDA) and why CUDA does not",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from oversmooth.importers.runtime.doctor import diagnose
    from oversmooth.simulator.output import to_json

    found = diagnose()
    if args.json:
        print(to_json(asdict(found)))
        return 0
    print(f"onnxruntime {found.onnxruntime}; providers listed: {', '.join(found.listed)}")
    for provider, state in found.usable.items():
        print(f"  {provider}: {'usable' if state == 'ok' else 'not usable: ' + state}")
    if found.gpus:
        for gpu in found.gpus:
            print(f"GPU: {gpu['name']} (driver {gpu['driver']}, {gpu['memory']})")
    else:
        print("GPU: none visible (no nvidia-smi)")
    if found.libraries:
        for name, path in sorted(found.libraries.items()):
            print(f"loaded {name} from {path}")
    else:
        print("CUDA libraries loaded: none")
    if found.cuda_reason is None:
        print("CUDA: usable; `oversmooth audit --provider cuda` runs on the GPU")
    else:
        print(f"CUDA: not usable: {found.cuda_reason}")
        if found.fix:
            print(f"fix: {found.fix}")
    print(f"device arrays: {found.device_arrays}")
    return 0
