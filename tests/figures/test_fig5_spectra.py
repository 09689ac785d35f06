"""Fig. 5's per-layer normalisation: each layer's eigenvalues on one axis, signs kept."""

from __future__ import annotations

import numpy as np
from numpy.testing import assert_array_equal

from oversmooth.figures.fig5_spectra import per_layer_normalised


def test_each_layer_is_divided_by_its_own_largest_modulus() -> None:
    # two layers 1000× apart in scale, as DINOv2's LayerScale makes them
    real = np.array([-2.0, 1.0, 0.5, -0.004, 0.001, 0.002])
    blocks = np.array([0, 0, 0, 1, 1, 1])
    normalised = per_layer_normalised(real, blocks)
    assert_array_equal(normalised, [-1.0, 0.5, 0.25, -1.0, 0.25, 0.5])
    assert_array_equal(np.sign(normalised), np.sign(real))


def test_a_layer_of_zeros_stays_zero() -> None:
    normalised = per_layer_normalised(np.array([0.0, 0.0, 3.0]), np.array([2, 2, 5]))
    assert_array_equal(normalised, [0.0, 0.0, 1.0])
