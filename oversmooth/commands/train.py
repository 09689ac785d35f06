"""``oversmooth train --out DIR``: train small ViTs (standard, ⁺, ⁻) and measure them.

Every (variant, fraction, seed) trains one model (:mod:`oversmooth.training`) and measures its
clean test accuracy, its accuracy under Gaussian noise and blur at severities 1–5, and the signs
of its heads' stored and effective value spectra. One seed gives every variant the same training
subset, the same batch order, the same shifts and the same corrupted test sets, so variants can be
compared pair by pair (``python -m oversmooth.figures.table23_training --results DIR``).

The folder (written whole or not at all):

``results.csv``
    One row per (variant, fraction, seed, corruption, severity): ``accuracy`` in [0, 1];
    ``corruption`` is ``clean`` (severity 0) or a corruption's name.
``results.json``
    Every run's record (configuration, per-epoch loss, seconds, spectra signs), the command line,
    versions.
``models/VARIANT-fFRACTION-sSEED.onnx``
    With ``--export-onnx``: each trained model, for ``oversmooth audit``/``spectra``.
``inputs.npz``
    With ``--export-onnx``: the audit's inputs, ``images`` (N, C, H, W) float32 in the exported
    graph's input layout and scale (what the models were tested on) and ``labels`` naming each
    (``test-INDEX-class-LABEL``): the first :data:`AUDIT_IMAGES` images of the data's *test* split
    (digits: all 500 of the fixed stratified split, none seen in training), clean. So
    ``oversmooth audit DIR/models/X.onnx --inputs DIR/inputs.npz`` audits a model on held-out
    data, and ``python -m oversmooth.figures.trained_audit --results DIR`` every model.

Needs the ``train`` extra (torch and scikit-learn): ``pip install 'oversmooth[train]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from oversmooth.commands.common import positive_int

__all__ = ["AUDIT_IMAGES", "INPUTS_FILE", "RESULT_COLUMNS", "RESULT_FILES", "register", "run"]

RESULT_FILES = ("results.csv", "results.json")
RESULT_COLUMNS = (
    "variant",
    "fraction",
    "seed",
    "data",
    "corruption",
    "severity",
    "accuracy",
    "n_train",
    "epochs",
    "seconds",
)
#: The audit's inputs written beside the exported models, and how many test images at most.
INPUTS_FILE = "inputs.npz"
AUDIT_IMAGES = 500
_PACKAGES = ("oversmooth", "numpy", "scipy", "torch", "scikit-learn", "onnx")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1]; got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1]; got {text!r}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number; got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train small ViTs (standard, ⁺, ⁻): data efficiency, corruption robustness, spectra",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--variant",
        choices=("standard", "plus", "minus", "all"),
        default="all",
        help="which model(s) to train (default: all three)",
    )
    p.add_argument(
        "--fraction",
        type=_fraction,
        nargs="+",
        action="extend",
        metavar="F",
        help="share(s) of the training set kept, stratified (repeatable; default 1.0)",
    )
    p.add_argument("--seeds", type=positive_int, default=3, help="seeds 0 … N−1 (default 3)")
    p.add_argument(
        "--data", default="digits", metavar="digits|PATH.npz", help="the data (default: digits)"
    )
    p.add_argument("--depth", type=positive_int, help="blocks (default 6; quick 2)")
    p.add_argument("--width", type=positive_int, help="d_model (default 64; quick 32)")
    p.add_argument("--heads", type=positive_int, help="heads (default 4; quick 2)")
    p.add_argument("--patch", type=positive_int, help="patch side in pixels (default 2)")
    p.add_argument("--epochs", type=positive_int, help="epochs (default 30; quick 5)")
    p.add_argument("--norm", choices=("pre", "post"), help="LayerNorm placement (default pre)")
    p.add_argument("--psi-init", type=_finite, help="ψ's starting value, ⁺/⁻ (default 0.6)")
    p.add_argument("--quick", action="store_true", help="a small model, a few epochs (seconds)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to train (default cpu)"
    )
    p.add_argument(
        "--threads", type=positive_int, default=1, help="CPU threads for torch (default 1)"
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the output folder")
    p.add_argument(
        "--force", action="store_true", help="replace a non-empty --out folder of another kind"
    )
    p.add_argument(
        "--export-onnx", action="store_true", help="also write every model to DIR/models/*.onnx"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _is_results_folder(folder: Path) -> bool:
    return all((folder / name).is_file() for name in RESULT_FILES)


def _configs(args: argparse.Namespace, data: Any) -> tuple[Any, Any]:
    from oversmooth.training.model import ViTConfig
    from oversmooth.training.train import QUICK_MODEL, QUICK_TRAIN, TrainConfig

    model = QUICK_MODEL if args.quick else ViTConfig()
    train = QUICK_TRAIN if args.quick else TrainConfig()
    chosen = {
        "depth": args.depth,
        "width": args.width,
        "heads": args.heads,
        "patch": args.patch,
        "norm": args.norm,
        "psi_init": args.psi_init,
    }
    model = replace(
        model,
        image_size=data.image_size,
        channels=data.channels,
        classes=max(data.classes, 2),
        **{key: value for key, value in chosen.items() if value is not None},
    )
    if args.epochs is not None:
        train = replace(train, epochs=args.epochs)
    return model, replace(train, device=args.device)


def _rows(record: Any) -> list[dict[str, Any]]:
    common = {
        "variant": record.variant,
        "fraction": record.fraction,
        "seed": record.seed,
        "data": record.data,
        "n_train": record.n_train,
        "epochs": record.train["epochs"],
        "seconds": record.seconds,
    }
    rows = [{**common, "corruption": "clean", "severity": 0, "accuracy": record.clean_accuracy}]
    for key, accuracy in record.corrupted.items():
        name, severity = key.split(":")
        rows.append({**common, "corruption": name, "severity": int(severity), "accuracy": accuracy})
    return rows


def run(args: argparse.Namespace) -> int:
    """Check everything, train every run, write the folder, print a summary."""
    from oversmooth.simulator.errors import InputError
    from oversmooth.training import MISSING_TORCH

    if importlib.util.find_spec("torch") is None:
        raise InputError(MISSING_TORCH)
    from oversmooth.executor import progress_bar
    from oversmooth.simulator.output import (
        atomic_directory,
        check_output_folder,
        package_versions,
        write_json,
        write_tidy_csv,
    )
    from oversmooth.training.data import load_data, stratified_fraction
    from oversmooth.training.export import export_onnx
    from oversmooth.training.model import VARIANTS
    from oversmooth.training.train import set_threads, train_run

    ours = (lambda _folder: True) if args.force else _is_results_folder
    check_output_folder(args.out, ours=ours, label="--out")
    data = load_data(args.data)
    model_config, train_config = _configs(args, data)
    variants = VARIANTS if args.variant == "all" else (args.variant,)
    fractions = list(dict.fromkeys(args.fraction or [1.0]))
    set_threads(args.threads)
    plan = [(f, s, v) for f in fractions for s in range(args.seeds) for v in variants]
    runs = []
    enabled = not args.no_progress and sys.stderr.isatty()
    with progress_bar(len(plan) * train_config.epochs, "epoch", enabled=enabled) as advance:
        for fraction, seed, variant in plan:
            subset = stratified_fraction(data, fraction, seed)
            runs.append(
                train_run(
                    subset,
                    replace(model_config, variant=variant),
                    replace(train_config, seed=seed),
                    fraction=fraction,
                    progress=lambda _epoch, _loss: advance(1),
                )
            )
    record = {
        "command": ["oversmooth", *sys.argv[1:]] if sys.argv else [],
        "data": {
            "source": args.data,
            "n_train": int(data.y_train.size),
            "n_test": int(data.y_test.size),
        },
        "variants": list(variants),
        "fractions": fractions,
        "seeds": list(range(args.seeds)),
        "threads": args.threads,
        "python": platform.python_version(),
        "versions": package_versions(_PACKAGES),
        "runs": [run.record for run in runs],
    }
    with atomic_directory(args.out, ours=ours, label="--out") as staging:
        write_tidy_csv(
            staging / RESULT_FILES[0],
            RESULT_COLUMNS,
            (row for run in runs for row in _rows(run.record)),
        )
        write_json(staging / RESULT_FILES[1], record)
        if args.export_onnx:
            for item in runs:
                r = item.record
                export_onnx(
                    item.model, staging / "models" / f"{r.variant}-f{r.fraction:g}-s{r.seed}.onnx"
                )
            write_audit_inputs(staging / INPUTS_FILE, data)
    print(_summary([run.record for run in runs], args.out, export=args.export_onnx))
    return 0


def write_audit_inputs(path: Path, data: Any) -> Path:
    """``inputs.npz`` (see the module docstring): the first :data:`AUDIT_IMAGES` clean test images
    as the exported graph's ``images`` input, float32 (N, C, H, W), with their labels."""
    import numpy as np

    images = np.ascontiguousarray(data.x_test[:AUDIT_IMAGES], dtype=np.float32)
    classes = data.y_test[:AUDIT_IMAGES]
    labels = np.array([f"test-{i}-class-{int(y)}" for i, y in enumerate(classes)])
    with path.open("wb") as handle:
        np.savez(handle, images=images, labels=labels)
    return path


def _summary(records: Sequence[Any], out: Path, *, export: bool) -> str:
    lines = [f"train: {len(records)} run(s), {sum(r.seconds for r in records):.1f} s of training"]
    lines.append(
        f"{'variant':<9} {'fraction':>8} {'runs':>5} {'clean':>7} {'noise5':>7} {'blur5':>7}"
    )
    groups: dict[tuple[str, float], list[Any]] = {}
    for r in records:
        groups.setdefault((r.variant, r.fraction), []).append(r)
    for (variant, fraction), group in groups.items():
        n = len(group)
        clean = 100 * sum(r.clean_accuracy for r in group) / n
        noise = 100 * sum(r.corrupted["gaussian_noise:5"] for r in group) / n
        blur = 100 * sum(r.corrupted["gaussian_blur:5"] for r in group) / n
        lines.append(f"{variant:<9} {fraction:>8g} {n:>5} {clean:>7.2f} {noise:>7.2f} {blur:>7.2f}")
    files = [out / name for name in RESULT_FILES]
    files += [out / "models", out / INPUTS_FILE] if export else []
    lines.append("wrote " + ", ".join(str(f) for f in files))
    return "\n".join(lines)
