"""Checks shared by the input tests: inputs read batch by batch are the items they hold."""

from __future__ import annotations

import numpy as np

from oversmooth.importers.inputs.feeds import Inputs

__all__ = ["assert_batches_are_the_items"]


def assert_batches_are_the_items(inputs: Inputs, size: int) -> None:
    """Every batch of ``size`` items, concatenated, is the whole of ``inputs.feeds``."""
    whole = inputs.feeds
    parts = list(inputs.batches(size))
    assert sum(part.batch_size for part in parts) == inputs.batch_size
    for name, array in whole.items():
        assert np.array_equal(np.concatenate([part.feeds[name] for part in parts]), array)
