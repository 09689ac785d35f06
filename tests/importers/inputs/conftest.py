"""Fixtures of the input tests (tests/importers/inputs/)."""

from __future__ import annotations

import pytest

from oversmooth.importers.inputs import feeds as feeds_module


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests streamed in pieces of one item or so."""
    monkeypatch.setattr(feeds_module, "DIGEST_CHUNK_BYTES", 64)
