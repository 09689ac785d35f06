"""Test configuration: hypothesis profiles, the deep marker, and strict floating point."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

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
