"""Inputs read batch by batch: the same items, digest and audit as the same inputs held in memory.

Images are decoded per batch, random items drawn per item from ``(seed, index)``, ``.npz`` members
memory-mapped (stored) or decompressed in order (deflated), a folder of shards read one at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import sources
from oversmooth.importers.inputs.feeds import Inputs, feeds_digest
from oversmooth.importers.zoo import IMAGENET_MEAN, IMAGENET_STD
from tests.importers.family_corpus import load_fixture
from tests.importers.inputs.batched import assert_batches_are_the_items

TEXT_GRAPH = (
    GraphInput("input_ids", np.dtype(np.int64), ("batch", "sequence")),
    GraphInput("attention_mask", np.dtype(np.int64), ("batch", "sequence")),
)
IMAGE_GRAPH = (GraphInput("pixel_values", np.dtype(np.float32), ("batch", 3, 32, 32)),)


def in_memory(inputs: Inputs) -> Inputs:
    """The same items held in memory."""
    return Inputs(
        feeds=inputs.feeds,
        token_mask=inputs.token_mask,
        labels=inputs.labels,
        source=inputs.source,
        random=inputs.random,
    )


# -- random ------------------------------------------------------------------------------------


def test_random_items_do_not_depend_on_the_batch_they_are_read_in(small_chunks) -> None:
    inputs = sources.random_inputs(TEXT_GRAPH, seed=3, batch=10, seq=6, vocab_size=50)
    assert not inputs.in_memory
    whole = inputs.feeds
    for size in (1, 3, 10):
        assert_batches_are_the_items(inputs, size)
    assert np.array_equal(inputs.read(4, 7).feeds["input_ids"], whole["input_ids"][4:7])
    assert np.array_equal(inputs.subset([7, 2]).feeds["input_ids"], whole["input_ids"][[7, 2]])
    assert inputs.digest == feeds_digest(whole)
    longer = sources.random_inputs(TEXT_GRAPH, seed=3, batch=20, seq=6, vocab_size=50)
    assert np.array_equal(longer.read(0, 10).feeds["input_ids"], whole["input_ids"])


def test_random_inputs_ignore_a_fixed_batch_size_of_the_graph() -> None:
    graph = (GraphInput("x", np.dtype(np.float32), (1, 4, 8)),)
    inputs = sources.random_inputs(graph, batch=5)
    assert inputs.feeds["x"].shape == (5, 4, 8)


# -- images -----------------------------------------------------------------------------------


def _image_folder(folder: Path, count: int) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for index in range(count):
        pixels = rng.integers(0, 256, size=(20 + index, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{index:03d}.png")
    return folder


def test_images_are_decoded_only_when_read(tmp_path, monkeypatch, small_chunks) -> None:
    folder = _image_folder(tmp_path / "images", 5)
    decoded: list[str] = []
    original = sources.load_image

    def counting(path, size):
        decoded.append(Path(path).name)
        return original(path, size)

    monkeypatch.setattr(sources, "load_image", counting)
    inputs = sources.from_images(folder, size=32, graph=IMAGE_GRAPH)
    assert len(decoded) == 1  # the first image, to check the feeds against the graph
    eager = np.stack([original(path, 32) for path in sorted(folder.iterdir())]) / np.float32(255)
    normalised = (eager - np.float32(IMAGENET_MEAN)) / np.float32(IMAGENET_STD)
    expected = np.ascontiguousarray(normalised.transpose(0, 3, 1, 2), dtype=np.float32)
    assert_batches_are_the_items(inputs, 2)
    assert np.array_equal(inputs.feeds["pixel_values"], expected)
    assert inputs.digest == feeds_digest({"pixel_values": expected})


def test_an_image_that_fails_to_decode_late_is_named(tmp_path: Path) -> None:
    folder = _image_folder(tmp_path / "images", 2)
    data = (folder / "001.png").read_bytes()
    (folder / "001.png").write_bytes(data[: len(data) // 2])  # the header is intact
    inputs = sources.from_images(folder, size=32)
    with pytest.raises(ImporterInputError, match=r"cannot read .*001\.png"):
        inputs.read(1, 2)


def test_an_audit_reading_per_batch_equals_one_held_in_memory() -> None:
    vit = load_fixture("vit/legacy_eager.onnx.xz")
    lazy = sources.random_inputs(vit.inputs, seed=5, batch=5)
    memory = in_memory(lazy)
    first = audit(vit, lazy, provider="cpu", batch_size=2)
    second = audit(vit, memory, provider="cpu", batch_size=2)
    for name, values in first.metrics.items():
        assert np.array_equal(values, second.metrics[name], equal_nan=True), name
    assert first.dominance == second.dominance
    assert first.inputs.digest == second.inputs.digest
