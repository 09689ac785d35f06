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
from oversmooth.importers.errors import FeedError, ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import feeds as feeds_module
from oversmooth.importers.inputs import sources
from oversmooth.importers.inputs.feeds import Inputs, feeds_digest
from oversmooth.importers.zoo import IMAGENET_MEAN, IMAGENET_STD
from tests.importers.family_corpus import load_fixture

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


def assert_batches_are_the_items(inputs: Inputs, size: int) -> None:
    whole = inputs.feeds
    parts = list(inputs.batches(size))
    assert sum(part.batch_size for part in parts) == inputs.batch_size
    for name, array in whole.items():
        assert np.array_equal(np.concatenate([part.feeds[name] for part in parts]), array)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests streamed in pieces of one item or so."""
    monkeypatch.setattr(feeds_module, "DIGEST_CHUNK_BYTES", 64)


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


# -- npz --------------------------------------------------------------------------------------


def _text_feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, size=(n, 7))
    mask = (np.arange(7) < rng.integers(2, 8, size=n)[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
def test_npz_members_are_read_per_batch(tmp_path, small_chunks, save, fortran) -> None:
    feeds = _text_feeds(9)
    if fortran:
        feeds = {name: np.asfortranarray(array) for name, array in feeds.items()}
    save(tmp_path / "x.npz", **feeds)
    inputs = sources.from_npz(tmp_path / "x.npz", TEXT_GRAPH)
    assert not inputs.in_memory
    assert inputs.digest == feeds_digest(feeds)
    for size in (1, 4, 9):
        assert_batches_are_the_items(inputs, size)
    assert np.array_equal(inputs.read(6, 9).feeds["input_ids"], feeds["input_ids"][6:])
    assert np.array_equal(inputs.read(2, 4).feeds["input_ids"], feeds["input_ids"][2:4])  # back
    assert np.array_equal(inputs.read(2, 4).token_mask, feeds["attention_mask"][2:4] == 1)


def test_a_folder_of_npz_shards_is_one_sequence(tmp_path: Path, small_chunks) -> None:
    feeds = _text_feeds(10)
    folder = tmp_path / "shards"
    folder.mkdir()
    for index, (start, stop) in enumerate([(0, 4), (4, 5), (5, 10)]):
        part = {name: array[start:stop] for name, array in feeds.items()}
        save = np.savez_compressed if index % 2 else np.savez
        save(folder / f"part-{index}.npz", labels=[f"s{i}" for i in range(start, stop)], **part)
    inputs = sources.from_npz(folder, TEXT_GRAPH)
    assert inputs.batch_size == 10
    assert inputs.labels == tuple(f"s{i}" for i in range(10))
    assert inputs.digest == feeds_digest(feeds)
    assert inputs.source == f"npz:{feeds_digest(feeds)[:12]}"
    for size in (3, 4, 10):
        assert_batches_are_the_items(inputs, size)


def test_npz_shards_that_disagree_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    np.savez(folder / "a.npz", **_text_feeds(3))
    wider = {name: np.pad(array, ((0, 0), (0, 1))) for name, array in _text_feeds(2).items()}
    np.savez(folder / "b.npz", **wider)
    with pytest.raises(FeedError, match=r"b\.npz's 'input_ids' is int64 \(8,\) per item") as info:
        sources.from_npz(folder, TEXT_GRAPH)
    assert "\n" not in str(info.value)


def test_npz_token_values_are_checked_while_the_digest_is_read(tmp_path: Path) -> None:
    feeds = _text_feeds(4)
    feeds["input_ids"][3, 2] = -1
    np.savez_compressed(tmp_path / "x.npz", **feeds)
    with pytest.raises(FeedError, match="non-negative token ids"):
        sources.from_npz(tmp_path / "x.npz", TEXT_GRAPH)


def test_npz_items_can_exceed_the_element_limit_of_one_array(tmp_path, monkeypatch) -> None:
    # The limit guards allocations: only a batch is ever allocated, so 10 items of 7 tokens pass
    # a limit of 40 elements (one item: 7).
    np.savez(tmp_path / "x.npz", **_text_feeds(10))
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "40")
    inputs = sources.from_npz(tmp_path / "x.npz", TEXT_GRAPH)
    assert inputs.read(0, 4).feeds["input_ids"].shape == (4, 7)


def test_a_damaged_deflated_npz_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    np.savez_compressed(path, **_text_feeds(50))
    data = bytearray(path.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 16] = bytes(16)  # inside the first member's stream
    path.write_bytes(bytes(data))
    with pytest.raises(ImporterInputError, match=r"cannot read .*x\.npz") as info:
        sources.from_npz(path, TEXT_GRAPH)
    assert "\n" not in str(info.value)
