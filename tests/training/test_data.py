"""Digits and user .npz files: validation in one line, stratified fractions (no torch needed)."""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.training.data import Dataset, load_data, load_npz, stratified_fraction


def _arrays(n_train: int = 40, n_test: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.integers(0, 256, (n_train, 6, 6), dtype=np.uint8),
        "y_train": np.arange(n_train) % 4,
        "x_test": rng.integers(0, 256, (n_test, 6, 6), dtype=np.uint8),
        "y_test": np.arange(n_test) % 4,
    }


def _save(tmp_path, **changes) -> str:
    arrays = {**_arrays(), **changes}
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return str(path)


def test_a_good_npz_loads_as_channels_first_in_unit_range(tmp_path):
    data = load_data(_save(tmp_path))
    assert data.x_train.shape == (40, 1, 6, 6)
    assert data.x_train.dtype == np.float64
    assert 0.0 <= data.x_train.min()
    assert data.x_train.max() <= 1.0
    assert data.classes == 4
    assert data.image_size == (6, 6)
    assert data.channels == 1
    colour = load_npz(
        _save(tmp_path, x_train=np.zeros((40, 6, 6, 3)), x_test=np.ones((10, 6, 6, 3)))
    )
    assert colour.x_test.shape == (10, 3, 6, 6)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"y_test": None}, "lacks y_test"),
        ({"x_train": np.zeros((40, 36))}, "N×H×W or N×H×W×C"),
        ({"x_train": np.array(["a"] * 40)}, "real numbers"),
        ({"x_test": np.full((10, 6, 6), np.nan)}, "non-finite"),
        ({"x_test": np.zeros((10, 5, 6))}, "differ in shape"),
        ({"y_train": np.arange(40) * 0.5}, "integer class labels"),
        ({"y_train": np.arange(39)}, r"shape \(40,\)"),
        ({"y_train": np.arange(40) - 1}, "negative label"),
        ({"y_test": np.full(10, 7)}, "never shows"),
    ],
)
def test_a_bad_npz_is_refused_in_one_line(tmp_path, changes, match):
    with pytest.raises(InputError, match=match) as info:
        load_npz(_save(tmp_path, **changes))
    assert "\n" not in str(info.value)


def test_not_an_npz_is_refused(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"not a readable \.npz"):
        load_data(str(path))
    with pytest.raises(InputError, match="digits or a path"):
        load_data("cifar")


def test_a_fraction_keeps_class_shares_and_depends_on_its_seed():
    labels = np.repeat(np.arange(5), [40, 30, 20, 6, 4])
    data = Dataset(np.zeros((100, 1, 2, 2)), labels, np.zeros((5, 1, 2, 2)), np.arange(5), "t")
    half = stratified_fraction(data, 0.5, seed=0)
    assert half.y_train.size == 50
    assert np.array_equal(np.bincount(half.y_train), [20, 15, 10, 3, 2])
    tenth = stratified_fraction(data, 0.1, seed=0)
    assert tenth.y_train.size == 10
    assert set(tenth.y_train) == set(range(5))
    other = stratified_fraction(
        Dataset(np.arange(100.0).reshape(100, 1, 1, 1), labels, data.x_test, data.y_test, "t"),
        0.5,
        seed=1,
    )
    again = stratified_fraction(
        Dataset(np.arange(100.0).reshape(100, 1, 1, 1), labels, data.x_test, data.y_test, "t"),
        0.5,
        seed=0,
    )
    assert not np.array_equal(other.x_train, again.x_train)
    assert stratified_fraction(data, 1.0, seed=0) is data
    with pytest.raises(InputError, match="fraction"):
        stratified_fraction(data, 0.0, seed=0)


def test_digits_split_is_stratified_and_fixed():
    pytest.importorskip("sklearn", reason="needs the train extra: pip install 'oversmooth[train]'")
    data = load_data("digits")
    assert (data.y_train.size, data.y_test.size) == (1297, 500)
    assert data.x_train.shape[1:] == (1, 8, 8)
    assert data.x_train.max() == 1.0
    everything = np.bincount(np.concatenate([data.y_train, data.y_test]))
    assert np.all(np.abs(np.bincount(data.y_test) - everything * 500 / 1797) < 1)
    assert np.array_equal(load_data("digits").y_test, data.y_test)


def test_value_range_is_the_training_images_range():
    x = np.linspace(0.0, 255.0, 16).reshape(1, 1, 4, 4)
    data = Dataset(x, np.zeros(1, dtype=np.int64), x, np.zeros(1, dtype=np.int64), "t")
    assert data.value_range == (0.0, 255.0)
    flat = Dataset(np.zeros((1, 1, 2, 2)), np.zeros(1, dtype=np.int64), x, np.zeros(1), "t")
    assert flat.value_range == (0.0, 1.0)
