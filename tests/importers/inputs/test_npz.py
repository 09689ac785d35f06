"""Feeds stored in ``.npz`` files (importers.inputs.npz): read batch by batch, stored or deflated,
C or Fortran order, one file or a folder of shards; labels; and every way a file or a folder is
refused, in one line. (Garbage member headers: test_npz_headers.py; declared sizes against the
limits: tests/importers/test_limits.py; cache inputs left out: tests/importers/test_kv_cache.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oversmooth.importers import errors
from oversmooth.importers.errors import FeedError, ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import sources
from oversmooth.importers.inputs.feeds import feeds_digest, for_graph
from oversmooth.importers.inputs.npz import from_npz
from oversmooth.simulator.errors import InputError
from tests.importers.inputs.batched import assert_batches_are_the_items

TEXT_GRAPH = (
    GraphInput("input_ids", np.dtype(np.int64), ("batch", "sequence")),
    GraphInput("attention_mask", np.dtype(np.int64), ("batch", "sequence")),
)


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


def test_from_npz_round_trip_with_labels(tmp_path: Path) -> None:
    text = for_graph(sources.bundled_inputs("text"), TEXT_GRAPH)
    path = tmp_path / "feeds.npz"
    np.savez(path, labels=np.asarray(text.labels), **text.feeds)
    loaded = sources.from_npz(path, TEXT_GRAPH)
    assert loaded.digest == text.digest
    assert loaded.source == f"npz:{text.digest[:12]}"
    assert loaded.labels == text.labels
    assert np.array_equal(loaded.token_mask, text.token_mask)


def test_from_npz_bad_file_and_bad_feeds(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"no zip here")
    with pytest.raises(InputError, match=r"cannot read .*junk\.npz"):
        sources.from_npz(junk, TEXT_GRAPH)
    short = tmp_path / "short.npz"
    np.savez(short, input_ids=np.zeros((2, 4), np.int64))
    with pytest.raises(errors.FeedError, match="missing feed"):
        sources.from_npz(short, TEXT_GRAPH)


def test_items_without_labels_are_numbered_across_shards(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    feeds = _text_feeds(5)
    np.savez(folder / "a.npz", **{name: array[:2] for name, array in feeds.items()})
    np.savez(folder / "b.npz", **{name: array[2:] for name, array in feeds.items()})
    assert from_npz(folder, TEXT_GRAPH).labels == tuple(f"item-{i}" for i in range(5))


def test_labels_must_name_every_item(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", labels=["a", "b"], **_text_feeds(3))
    with pytest.raises(ImporterInputError, match="`labels` in the npz must have 3 entries; got 2"):
        from_npz(tmp_path / "x.npz", TEXT_GRAPH)


def test_shards_holding_different_arrays_are_refused(tmp_path: Path) -> None:
    """Labels in one shard but not the next: the items would be named half by the file."""
    folder = tmp_path / "shards"
    folder.mkdir()
    np.savez(folder / "a.npz", labels=["x", "y"], **_text_feeds(2))
    np.savez(folder / "b.npz", **_text_feeds(2))
    with pytest.raises(FeedError) as info:
        from_npz(folder, TEXT_GRAPH)
    assert str(info.value) == (
        "every shard of `inputs` must hold the same arrays; b.npz holds attention_mask, "
        "input_ids, the first shard attention_mask, input_ids, labels"
    )


def test_a_folder_without_npz_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not feeds", encoding="utf-8")
    with pytest.raises(
        ImporterInputError, match=r"must be an \.npz file or a folder of them; got none"
    ):
        from_npz(tmp_path, TEXT_GRAPH)
