"""The figure tests' shared fixture: one quick run of every script per test session
(:mod:`tests.figures.quick`)."""

from __future__ import annotations

import pytest

from tests.figures.quick import QuickRun, run_quick


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> QuickRun:
    """``python -m oversmooth.figures --quick`` of every script, into a session folder."""
    return run_quick(tmp_path_factory.mktemp("figures-quick"))
