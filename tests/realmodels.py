"""The pinned real models in tests: a missing or changed model fails in CI and skips elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oversmooth.simulator.errors import OversmoothError


def require_real_model(name: str) -> Path:
    """The installed, hash-checked zoo model ``name``; ``pytest.fail`` in CI, ``pytest.skip`` elsewhere.

    The message names the package, its pin and the expected sha256 (from :mod:`oversmooth.importers.zoo`).
    """
    from oversmooth.importers.zoo import installed_model_path

    try:
        return installed_model_path(name)
    except OversmoothError as err:
        if os.environ.get("CI"):
            pytest.fail(str(err))
        pytest.skip(str(err))
