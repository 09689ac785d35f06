"""One deterministic training run of a small ViT and its typed record.

:func:`train_run` trains a :class:`~oversmooth.training.model.ViT` on a
:class:`~oversmooth.training.data.Dataset` with AdamW (no weight decay on biases, norms, the CLS
token, the positions, Θ and ψ), a linear warm-up then a cosine learning-rate schedule, random
shifts of up to ``shift`` pixels (zero padding) as the only augmentation, and cross-entropy. Then
it measures the clean test accuracy, the accuracy under every corruption and severity of
:mod:`oversmooth.training.corruptions`, scaled to the training images' range (one corrupted test
set per seed, the same for every variant: paired comparisons), and the signs of every head's stored and effective value spectrum
(:mod:`oversmooth.training.effective`).

Determinism: the model's initialisation, the batch order and the shifts come from ``seed`` alone
(``torch.Generator`` and NumPy generators, never the global state), and the run holds
``torch.use_deterministic_algorithms(True)`` (restored afterwards). On the CPU two runs with one
seed give identical weights and accuracies; on CUDA (``device="cuda"``) the same holds on one
machine with ``CUBLAS_WORKSPACE_CONFIG`` set (set here when absent).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import cast

import numpy as np
import torch
from torch import nn

from oversmooth.simulator.errors import InputError
from oversmooth.training.corruptions import CORRUPTIONS, SEVERITIES, corrupt
from oversmooth.training.data import Dataset
from oversmooth.training.effective import (
    effective_head_eigenvalues,
    sign_shares,
    stored_head_eigenvalues,
)
from oversmooth.training.model import Block, ViT, ViTConfig, build_model

__all__ = [
    "QUICK_MODEL",
    "QUICK_TRAIN",
    "RunRecord",
    "TrainConfig",
    "TrainedRun",
    "head_spectra",
    "random_shifts",
    "set_threads",
    "train_run",
]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation: epochs, batch size, peak learning rate, weight decay, warm-up epochs, the
    largest shift in pixels, the seed and the device (``cpu`` or ``cuda``)."""

    epochs: int = 30
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: int = 2
    shift: int = 1
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise InputError("epochs and batch size must be positive integers")
        if not (self.lr > 0 and math.isfinite(self.lr)) or self.weight_decay < 0:
            raise InputError("the learning rate must be positive and the weight decay ≥ 0")
        if self.shift < 0 or self.warmup_epochs < 0:
            raise InputError("shift and warm-up epochs must be ≥ 0")
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"device must be cpu or cuda; got {self.device!r}")

    def to_dict(self) -> dict:
        return asdict(self)


#: A configuration that trains in a few seconds on one CPU thread (tests, ``--quick``).
QUICK_MODEL = ViTConfig(width=32, heads=2, depth=2, mlp_ratio=2.0)
QUICK_TRAIN = TrainConfig(epochs=5, batch_size=32, lr=1e-2, warmup_epochs=1)


@dataclass(frozen=True)
class RunRecord:
    """What one run measured. Accuracies are fractions in [0, 1].

    ``corrupted`` maps ``"corruption:severity"`` to accuracy; ``epoch_loss`` is the mean training
    loss per epoch; ``spectra`` holds the sign shares (:func:`~oversmooth.training.effective.sign_shares`)
    of every head's ``stored`` and ``effective`` value eigenvalues over all blocks.
    """

    variant: str
    fraction: float
    seed: int
    data: str
    n_train: int
    n_test: int
    clean_accuracy: float
    corrupted: dict[str, float]
    epoch_loss: list[float]
    seconds: float
    device: str
    spectra: dict[str, dict[str, float]]
    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainedRun:
    """A run's record and its trained model (on the CPU, in eval mode)."""

    record: RunRecord
    model: ViT


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay: list[nn.Parameter] = []
    keep: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        plain = name.endswith((".theta", ".psi")) or name in ("cls", "positions")
        (keep if param.ndim < 2 or plain else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def random_shifts(images: torch.Tensor, shift: int, generator: torch.Generator) -> torch.Tensor:
    """Every image moved by its own random offset in [−shift, shift]² (zero padding)."""
    if shift == 0:
        return images
    batch, _, height, width = images.shape
    padded = nn.functional.pad(images, (shift, shift, shift, shift))
    dy = torch.randint(0, 2 * shift + 1, (batch,), generator=generator).to(images.device)
    dx = torch.randint(0, 2 * shift + 1, (batch,), generator=generator).to(images.device)
    rows = (torch.arange(height, device=images.device)[None, :] + dy[:, None])[:, :, None]
    cols = (torch.arange(width, device=images.device)[None, :] + dx[:, None])[:, None, :]
    picked = padded[torch.arange(batch, device=images.device)[:, None, None], :, rows, cols]
    return picked.permute(0, 3, 1, 2)


def _accuracy(model: ViT, images: np.ndarray, labels: np.ndarray, device: torch.device) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, labels.size, 500):
            x = torch.as_tensor(images[start : start + 500], dtype=torch.float32, device=device)
            predicted = model(x).argmax(dim=1).cpu().numpy()
            correct += int(np.sum(predicted == labels[start : start + 500]))
    return correct / max(labels.size, 1)


def head_spectra(model: ViT) -> dict[str, np.ndarray]:
    """Every head's stored and effective value eigenvalues, (depth, heads, d_head) complex."""
    stored, effective = [], []
    config = model.config
    with torch.no_grad():
        for module in model.blocks:
            block = cast(Block, module)
            W_V, W_O = (w.detach().cpu().double().numpy() for w in block.attention.value_output())
            stored.append(stored_head_eigenvalues(W_V, W_O, config.heads))
            if config.norm == "pre":
                gamma = block.norm1.weight.detach().cpu().double().numpy()
                effective.append(effective_head_eigenvalues(W_V, W_O, config.heads, gamma))
            else:
                effective.append(stored[-1])
    return {"stored": np.array(stored), "effective": np.array(effective)}


def _device(name: str) -> torch.device:
    if name == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda: torch sees no CUDA device here")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return torch.device(name)


def train_run(
    data: Dataset,
    model_config: ViTConfig,
    train_config: TrainConfig,
    *,
    fraction: float = 1.0,
    progress: Callable[[int, float], None] | None = None,
) -> TrainedRun:
    """Train one model and measure it (see the module docstring).

    Parameters
    ----------
    data : Dataset
        Already reduced to the training fraction (``fraction`` is only recorded).
    model_config, train_config : ViTConfig, TrainConfig
        The image shape, channels and classes of ``model_config`` must match ``data``.
    progress : callable, optional
        ``progress(epoch, mean_loss)`` after every epoch (the command drives a progress bar).
    """
    if (model_config.image_size, model_config.channels) != (data.image_size, data.channels):
        raise InputError(
            f"the model expects {model_config.channels}×{model_config.image_size} images; the data "
            f"has {data.channels}×{data.image_size}"
        )
    if model_config.classes < data.classes:
        raise InputError(f"the model has {model_config.classes} classes; the data {data.classes}")
    device = _device(train_config.device)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(data, model_config, train_config, fraction, progress, device)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)


def _train(
    data: Dataset,
    model_config: ViTConfig,
    config: TrainConfig,
    fraction: float,
    progress: Callable[[int, float], None] | None,
    device: torch.device,
) -> TrainedRun:
    start = time.perf_counter()
    model = build_model(model_config, config.seed).to(device)
    optimiser = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr)
    steps_per_epoch = math.ceil(data.y_train.size / config.batch_size)
    total = config.epochs * steps_per_epoch
    warmup = min(config.warmup_epochs * steps_per_epoch, total - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, factor)
    generator = torch.Generator().manual_seed(config.seed)
    x_all = torch.as_tensor(data.x_train, dtype=torch.float32)
    y_all = torch.as_tensor(data.y_train, dtype=torch.int64)
    losses: list[float] = []
    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(y_all.numel(), generator=generator)
        total_loss = 0.0
        for begin in range(0, order.numel(), config.batch_size):
            index = order[begin : begin + config.batch_size]
            images = random_shifts(x_all[index], config.shift, generator).to(device)
            loss = nn.functional.cross_entropy(model(images), y_all[index].to(device))
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            total_loss += float(loss.detach()) * index.numel()
        losses.append(total_loss / y_all.numel())
        if not math.isfinite(losses[-1]):
            raise InputError(f"training diverged: the loss is {losses[-1]} after epoch {epoch + 1}")
        if progress is not None:
            progress(epoch + 1, losses[-1])
    clean = _accuracy(model, data.x_test, data.y_test, device)
    corrupted = {
        f"{name}:{severity}": _accuracy(
            model,
            corrupt(data.x_test, name, severity, seed=config.seed, value_range=data.value_range),
            data.y_test,
            device,
        )
        for name in CORRUPTIONS
        for severity in SEVERITIES
    }
    model = model.cpu().eval()
    spectra = head_spectra(model)
    tol = 1e-9
    record = RunRecord(
        variant=model_config.variant,
        fraction=float(fraction),
        seed=config.seed,
        data=data.name,
        n_train=int(data.y_train.size),
        n_test=int(data.y_test.size),
        clean_accuracy=clean,
        corrupted=corrupted,
        epoch_loss=losses,
        seconds=time.perf_counter() - start,
        device=str(device),
        spectra={kind: sign_shares(values, tol=tol) for kind, values in spectra.items()},
        model=model_config.to_dict(),
        train=config.to_dict(),
    )
    return TrainedRun(record, model)


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads for torch's operators (the application's choice, not a default:
    training small models on a shared machine is fastest and fairest with one)."""
    torch.set_num_threads(threads)
