"""Image corruptions at severities 1–5, in the style of CIFAR-100-C, in NumPy (no torch).

Two corruptions, each deterministic given (images, severity, seed):

- ``gaussian_noise``: ``clip(x + σ·r·ε, lo, hi)`` with ε ~ N(0, 1) per pixel, r = hi − lo the
  image range and σ = 0.08, 0.12, 0.18, 0.26, 0.38 for severities 1–5 (the ImageNet-C values;
  CIFAR-C's 0.04–0.10 barely touch 8×8 digits).
- ``gaussian_blur``: a Gaussian filter over the two pixel axes with standard deviation 0.4, 0.6,
  0.8, 1.0, 1.3 pixels (reflecting borders), channels apart. These are in pixels, not scaled to
  the image size: on 8×8 images CIFAR-C's blur scaled by 8/32 would change almost nothing.

``lo, hi`` default to 0 and 1 (the range :mod:`oversmooth.training.data` scales images to).
Severity 0 is the clean image.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from oversmooth.simulator.errors import InputError

__all__ = ["BLUR_SIGMA", "CORRUPTIONS", "NOISE_SIGMA", "SEVERITIES", "corrupt"]

SEVERITIES = (1, 2, 3, 4, 5)
#: Noise standard deviation per severity, as a fraction of the image range.
NOISE_SIGMA = (0.08, 0.12, 0.18, 0.26, 0.38)
#: Blur standard deviation per severity, in pixels.
BLUR_SIGMA = (0.4, 0.6, 0.8, 1.0, 1.3)
CORRUPTIONS = ("gaussian_noise", "gaussian_blur")


def corrupt(
    images: np.ndarray,
    corruption: str,
    severity: int,
    *,
    seed: int = 0,
    value_range: tuple[float, float] = (0.0, 1.0),
) -> np.ndarray:
    """``images`` (N, C, H, W) corrupted at ``severity`` (0 … 5); a new float64 array.

    The noise is drawn from ``numpy.random.default_rng([seed, severity])``: one seed gives one
    corrupted test set, the same for every model evaluated on it (paired comparisons).
    """
    x = np.asarray(images, dtype=np.float64)
    if x.ndim != 4:
        raise InputError(f"images must have shape N×C×H×W; got {x.shape}")
    if corruption not in CORRUPTIONS:
        raise InputError(f"corruption must be one of {', '.join(CORRUPTIONS)}; got {corruption!r}")
    if severity not in (0, *SEVERITIES):
        raise InputError(f"severity must be 0 … 5; got {severity}")
    if severity == 0:
        return x.copy()
    lo, hi = value_range
    if corruption == "gaussian_noise":
        rng = np.random.default_rng([seed, severity])
        noisy = x + NOISE_SIGMA[severity - 1] * (hi - lo) * rng.standard_normal(x.shape)
        return np.clip(noisy, lo, hi)
    sigma = BLUR_SIGMA[severity - 1]
    return ndimage.gaussian_filter(x, sigma=(0.0, 0.0, sigma, sigma), mode="reflect")
