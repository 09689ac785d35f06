"""Declared sizes are checked against simulator.limits before anything is allocated."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oversmooth.importers.errors import ImporterInputError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import sources

TEXT_GRAPH = (
    GraphInput("input_ids", np.dtype(np.int64), ("batch", "seq")),
    GraphInput("attention_mask", np.dtype(np.int64), ("batch", "seq")),
)


def _npz_declaring(path: Path, shape: tuple[int, ...]) -> Path:
    """An .npz whose single member's header declares ``shape`` but holds 8 bytes of data."""
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\0" * 8
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("input_ids.npy", npy)
    return path


def test_an_npz_header_declaring_two_to_the_forty_elements_allocates_nothing(tmp_path):
    # Members are read per batch, so the whole array's size is not limited; a header declaring
    # more than the member holds is refused before anything is read.
    path = _npz_declaring(tmp_path / "bomb.npz", (2**20, 2**20))
    with pytest.raises(ImporterInputError, match=r"declares shape .* but holds 8 bytes") as info:
        sources.from_npz(path, TEXT_GRAPH)
    assert "\n" not in str(info.value)


def test_an_npz_item_beyond_the_element_limit_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "wide.npz"
    np.savez(path, input_ids=np.zeros((2, 16), np.int64), attention_mask=np.ones((2, 16), np.int64))
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "10")
    with pytest.raises(ImporterInputError, match=r"one item of array .* at most 10 ") as info:
        sources.from_npz(path, TEXT_GRAPH)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"", b"PK\x03\x04 truncated", b"garbage" * 10, b"\x93NUMPY\x01\x00plain npy"],
    ids=["empty", "truncated", "garbage", "npy"],
)
def test_unreadable_npz_files_are_one_line(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(ImporterInputError, match=r"must be a readable \.npz") as info:
        sources.from_npz(path, TEXT_GRAPH)
    assert "\n" not in str(info.value)


def test_random_inputs_refuse_a_fixed_batch_of_two_to_the_forty():
    graph = (GraphInput("input_ids", np.dtype(np.int64), (2**40, 8)),)
    with pytest.raises(ImporterInputError, match="random feed 'input_ids'"):
        sources.random_inputs(graph)


def test_random_inputs_refuse_a_huge_sequence():
    with pytest.raises(ImporterInputError, match="OVERSMOOTH_MAX_ELEMENTS"):
        sources.random_inputs(TEXT_GRAPH, batch=4, seq=10**12)


def _png(path: Path, size: tuple[int, int]) -> Path:
    Image.new("RGB", size, (10, 20, 30)).save(path)
    return path


def test_an_image_size_beyond_the_limit_is_refused(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    _png(folder / "a.png", (8, 8))
    with pytest.raises(ImporterInputError, match="at most 4,096"):
        sources.from_images(folder, size=100_000)
    with pytest.raises(ImporterInputError, match="positive integer"):
        sources.from_images(folder, size=0)


def test_an_extreme_aspect_ratio_is_refused_before_resizing(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    _png(folder / "strip.png", (10_000, 1))
    with pytest.raises(ImporterInputError, match="resized to side 224"):
        sources.from_images(folder, size=224)


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path, monkeypatch):
    folder = tmp_path / "images"
    folder.mkdir()
    _png(folder / "big.png", (300, 300))
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "100000")
    with pytest.raises(ImporterInputError, match=r"image 'big\.png'"):
        sources.from_images(folder, size=16)


def test_a_text_file_beyond_the_limit_is_refused(tmp_path, monkeypatch):
    text = tmp_path / "lines.txt"
    text.write_text("a sentence\n" * 100, encoding="utf-8")
    monkeypatch.setenv("OVERSMOOTH_MAX_TEXT_BYTES", "64")
    with pytest.raises(ImporterInputError, match="OVERSMOOTH_MAX_TEXT_BYTES"):
        sources.from_text(text, tmp_path / "tokenizer.json")


def test_a_pipe_given_as_inputs_is_refused_without_blocking(tmp_path):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("needs named pipes")
    fifo = tmp_path / "feeds.npz"
    os.mkfifo(fifo)
    with pytest.raises(ImporterInputError, match="regular file"):
        sources.from_npz(fifo, TEXT_GRAPH)
    with pytest.raises(ImporterInputError, match="regular file"):
        sources.from_text(fifo, tmp_path / "tokenizer.json")
