"""Gaussian noise and blur at severities 1–5 (NumPy only: runs without torch)."""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.training.corruptions import CORRUPTIONS, SEVERITIES, corrupt


def _images() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.uniform(0.0, 1.0, (64, 1, 8, 8)) * (rng.uniform(size=(64, 1, 8, 8)) > 0.5)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_severities_are_monotone_in_their_effect(name):
    clean = _images()
    change = [np.mean((corrupt(clean, name, s, seed=1) - clean) ** 2) for s in (0, *SEVERITIES)]
    assert change[0] == 0.0
    assert np.all(np.diff(change) > 0), change


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_one_seed_one_corrupted_set(name):
    clean = _images()
    first = corrupt(clean, name, 3, seed=4)
    assert np.array_equal(first, corrupt(clean, name, 3, seed=4))
    assert np.all((first >= 0.0) & (first <= 1.0))
    assert not np.shares_memory(first, clean)


def test_noise_depends_on_the_seed_and_blur_does_not():
    clean = _images()
    assert not np.array_equal(
        corrupt(clean, "gaussian_noise", 2, seed=0), corrupt(clean, "gaussian_noise", 2, seed=1)
    )
    assert np.array_equal(
        corrupt(clean, "gaussian_blur", 2, seed=0), corrupt(clean, "gaussian_blur", 2, seed=1)
    )


def test_blur_keeps_each_image_mean():
    clean = _images()
    blurred = corrupt(clean, "gaussian_blur", 5)
    np.testing.assert_allclose(blurred.mean(axis=(2, 3)), clean.mean(axis=(2, 3)), rtol=1e-10)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("gaussian_noise", 6), "severity"),
        (("fog", 1), "corruption"),
    ],
)
def test_bad_arguments_are_refused(args, match):
    with pytest.raises(InputError, match=match):
        corrupt(_images(), *args)
    with pytest.raises(InputError, match="N×C×H×W"):
        corrupt(np.zeros((8, 8)), "gaussian_noise", 1)
