"""Image classification data: sklearn's 8×8 digits or a user ``.npz``; stratified fractions.

Images are float64 arrays of shape (N, C, H, W) scaled to [0, 1] (digits: pixel/16; uint8 .npz
images: pixel/255; float images are kept as given), labels int64 in [0, classes).

- :func:`load_digits_split`: sklearn's digits (1,797 images; scikit-learn comes with the ``train``
  extra), a stratified split of ``test_size`` images (default 500) by a fixed seed. It is bundled
  with scikit-learn: nothing is downloaded.
- :func:`load_npz`: a user file with ``x_train, y_train, x_test, y_test`` (images N×H×W or
  N×H×W×C); anything else is one :class:`~oversmooth.simulator.errors.InputError` line. No
  download, no pickles.
- :func:`stratified_fraction`: a seeded subset of a training set keeping each class's share.

Nothing here imports torch.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oversmooth.simulator.errors import InputError

__all__ = ["KEYS", "Dataset", "load_data", "load_digits_split", "load_npz", "stratified_fraction"]

KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class Dataset:
    """Train and test images (N, C, H, W) float64 in [0, 1] as given, labels int64, a name."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    name: str

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    @property
    def image_size(self) -> tuple[int, int]:
        return (int(self.x_train.shape[2]), int(self.x_train.shape[3]))

    @property
    def channels(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def value_range(self) -> tuple[float, float]:
        """(min, max) of the training images: the range corruptions are scaled to and clipped to
        (a constant training set gives (v, v + 1))."""
        lo, hi = float(self.x_train.min()), float(self.x_train.max())
        return (lo, hi) if hi > lo else (lo, lo + 1.0)


def _stratified_indices(labels: np.ndarray, keep: int, rng: np.random.Generator) -> np.ndarray:
    """``keep`` indices with each class's share kept (largest remainders; at least one per class
    when ``keep`` allows), sorted."""
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * keep / labels.size
    quota = np.floor(exact).astype(int)
    if keep >= classes.size:
        quota = np.maximum(quota, 1)
    order = np.argsort(-(exact - np.floor(exact)), kind="stable")
    position = 0
    while quota.sum() < keep:
        cls = order[position % classes.size]
        if quota[cls] < counts[cls]:
            quota[cls] += 1
        position += 1
    while quota.sum() > keep:
        quota[np.argmax(quota)] -= 1
    chosen = [
        rng.permutation(np.flatnonzero(labels == cls))[:q]
        for cls, q in zip(classes, quota, strict=True)
    ]
    return np.sort(np.concatenate(chosen))


def stratified_fraction(data: Dataset, fraction: float, seed: int) -> Dataset:
    """``data`` with a stratified ``fraction`` of its training set (seeded); the test set as is."""
    if not (0.0 < fraction <= 1.0):
        raise InputError(f"--fraction must be in (0, 1]; got {fraction}")
    if fraction == 1.0:
        return data
    keep = max(1, round(fraction * data.y_train.size))
    index = _stratified_indices(data.y_train, keep, np.random.default_rng([seed, 1]))
    return Dataset(data.x_train[index], data.y_train[index], data.x_test, data.y_test, data.name)


def load_digits_split(test_size: int = 500, seed: int = 0) -> Dataset:
    """sklearn's 8×8 digits, pixels/16, a stratified train/test split (1,297/500 by default)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise InputError(
            "--data digits needs scikit-learn: install the train extra, pip install 'oversmooth[train]'"
        ) from None
    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)[:, None] / 16.0
    labels = np.asarray(bunch.target, dtype=np.int64)
    test = _stratified_indices(labels, test_size, np.random.default_rng([seed, 0]))
    train = np.setdiff1d(np.arange(labels.size), test)
    return Dataset(images[train], labels[train], images[test], labels[test], "digits")


def _images(name: str, x: np.ndarray) -> np.ndarray:
    if x.dtype == np.bool_ or not (
        np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)
    ):
        raise InputError(f"{name} must hold real numbers (integers or floats); got dtype {x.dtype}")
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or min(x.shape) < 1:
        raise InputError(f"{name} must have shape N×H×W or N×H×W×C; got {x.shape}")
    scale = 255.0 if x.dtype == np.uint8 else 1.0
    images = np.moveaxis(x.astype(np.float64) / scale, -1, 1)
    if not np.all(np.isfinite(images)):
        raise InputError(f"{name} has non-finite values (NaN or infinity)")
    return np.ascontiguousarray(images)


def _labels(name: str, y: np.ndarray, n: int) -> np.ndarray:
    if not np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        raise InputError(f"{name} must hold integer class labels; got dtype {y.dtype}")
    if y.shape != (n,):
        raise InputError(f"{name} must have shape ({n},) to match the images; got {y.shape}")
    if y.size and y.min() < 0:
        raise InputError(f"{name} has a negative label {int(y.min())}; labels are 0 … classes−1")
    return y.astype(np.int64)


def load_npz(path: str | Path) -> Dataset:
    """A user ``.npz`` with ``x_train, y_train, x_test, y_test`` (see the module docstring).

    Test labels must be classes seen in training (``0 … max(y_train)``), train and test images
    must have one shape, and every image value must be finite.
    """
    path = Path(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise InputError(f"--data {str(path)!r} is not a readable .npz file: {err}") from None
    with archive:
        missing = [key for key in KEYS if key not in archive.files]
        if missing:
            raise InputError(
                f"--data {str(path)!r} lacks {', '.join(missing)}; it needs {', '.join(KEYS)}"
            )
        try:
            arrays = {key: np.asarray(archive[key]) for key in KEYS}
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise InputError(f"--data {str(path)!r}: an array cannot be read: {err}") from None
    x_train = _images("x_train", arrays["x_train"])
    x_test = _images("x_test", arrays["x_test"])
    if x_train.shape[1:] != x_test.shape[1:]:
        raise InputError(
            f"x_train and x_test images differ in shape: {x_train.shape[1:]} and {x_test.shape[1:]}"
        )
    y_train = _labels("y_train", arrays["y_train"], x_train.shape[0])
    y_test = _labels("y_test", arrays["y_test"], x_test.shape[0])
    if y_test.size and y_test.max() > y_train.max():
        raise InputError(
            f"y_test has label {int(y_test.max())}, a class y_train never shows (max {int(y_train.max())})"
        )
    return Dataset(x_train, y_train, x_test, y_test, path.name)


def load_data(source: str, *, seed: int = 0) -> Dataset:
    """``digits`` or a path to an ``.npz`` file."""
    if source == "digits":
        return load_digits_split(seed=seed)
    if not source.endswith(".npz"):
        raise InputError(f"--data must be digits or a path ending in .npz; got {source!r}")
    return load_npz(source)
