"""``python -m benchmarks train [--epochs N] [--device cpu|cuda]``: time per training run and epoch.

One run of each variant (standard, ⁺, ⁻) of the default small ViT (2×2 patches, d_model 64, 4
heads, 6 blocks) on scikit-learn's digits at the full training fraction, one torch thread, seed 0:
the wall seconds of the run (training, the clean and corrupted test accuracies, the head spectra)
and its seconds per epoch, on the CPU or, with ``--device cuda`` on a lent GPU, the device named.
Needs the ``train`` extra; without torch it says so in one line.

The ⁺/⁻ variants pay for a QR per head and step; the line prints their time relative to the
standard model's, measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from collections.abc import Sequence

from oversmooth.commands.common import positive_int

#: The variants timed, the standard one first (the others are reported relative to it).
VARIANTS = ("standard", "plus", "minus")


@dataclasses.dataclass(frozen=True)
class RunTiming:
    """One variant's run: wall seconds, epochs, the device it ran on."""

    variant: str
    seconds: float
    epochs: int
    device: str

    @property
    def per_epoch(self) -> float:
        return self.seconds / self.epochs


def time_runs(
    epochs: int, device: str = "cpu", variants: Sequence[str] = VARIANTS
) -> list[RunTiming]:
    """Train each variant once for ``epochs`` epochs on the digits and time it (one thread)."""
    from oversmooth.training.data import load_data
    from oversmooth.training.model import ViTConfig
    from oversmooth.training.train import TrainConfig, set_threads, train_run

    set_threads(1)
    data = load_data("digits")
    timings = []
    for variant in variants:
        run = train_run(
            data,
            ViTConfig(variant=variant),
            TrainConfig(epochs=epochs, device=device),
        )
        timings.append(RunTiming(variant, run.record.seconds, epochs, run.record.device))
    return timings


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks train", description=__doc__)
    parser.add_argument("--epochs", type=positive_int, default=5)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("torch") is None:
        print("train: skipped (needs the train extra: pip install 'oversmooth[train]')")
        return
    timings = time_runs(args.epochs, args.device)
    base = timings[0].per_epoch
    for timing in timings:
        print(
            f"train {timing.variant:8s} on {timing.device}: {timing.seconds:6.2f} s per run of "
            f"{timing.epochs} epochs, {timing.per_epoch:.3f} s per epoch "
            f"({timing.per_epoch / base:.2f}× the standard model)"
        )
