"""Test configuration: a private home for every cache, hypothesis profiles, the deep marker, and
strict floating point.

Hermetic by construction: before any test module is imported, the oversmooth model cache
(``OVERSMOOTH_CACHE``), matplotlib's config/cache folder (``MPLCONFIGDIR``) and the XDG cache folder
that onnxruntime writes to (``XDG_CACHE_HOME``) point into one
temporary folder per test session, removed at the end; CLI subprocesses inherit them. Nothing is
written into the user's home folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

#: The session's private folder for caches (see the module docstring).
SESSION_HOME = Path(tempfile.mkdtemp(prefix="oversmooth-tests-"))
os.environ["OVERSMOOTH_CACHE"] = str(SESSION_HOME / "cache")
os.environ["MPLCONFIGDIR"] = str(SESSION_HOME / "matplotlib")
# Everything else that caches by the XDG convention (onnxruntime writes a device id and a telemetry
# database under $XDG_CACHE_HOME/Microsoft, else ~/.cache/Microsoft).
os.environ["XDG_CACHE_HOME"] = str(SESSION_HOME / "xdg-cache")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(SESSION_HOME, ignore_errors=True)


settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=40,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60)
settings.register_profile(
    "deep", deadline=None, max_examples=2000, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-deep", action="store_true", help="run the long `deep` tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-deep"):
        return
    skip = pytest.mark.skip(reason="deep test: run with --run-deep")
    for item in items:
        if "deep" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, fixed-seed generator per test."""
    return np.random.default_rng(20240109)


@pytest.fixture
def strict_fp():
    """Turn floating-point overflow, invalid and divide warnings into errors inside a test."""
    with np.errstate(all="raise"):
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the builder models one test module saves (``tests/importers/audited.py``)."""
    return tmp_path_factory.mktemp("models")
