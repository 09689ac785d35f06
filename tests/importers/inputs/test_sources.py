"""Model inputs: bundled data, user files, random feeds, and checks against graph inputs."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from PIL import Image

from oversmooth.importers import errors, zoo
from oversmooth.importers.graph import GraphInput, load_model
from oversmooth.importers.inputs import sources
from oversmooth.importers.inputs.feeds import check_feeds, feeds_digest
from oversmooth.importers.zoo import IMAGENET_MEAN, IMAGENET_STD
from oversmooth.simulator import tolerances as tol
from oversmooth.simulator.errors import InputError
from tests.realmodels import require_real_model

TEXT_GRAPH = (
    GraphInput("input_ids", np.dtype(np.int64), ("batch", "sequence")),
    GraphInput("attention_mask", np.dtype(np.int64), ("batch", "sequence")),
)
IMAGE_GRAPH = (GraphInput("input_image", np.dtype(np.float32), ("batch_size", 3, 224, 224)),)
CLS_ID, SEP_ID, PAD_ID = 101, 102, 0


def _save(path: Path, pixels: np.ndarray, mode: str = "RGB") -> Path:
    Image.fromarray(pixels, mode=mode).save(path)
    return path


def _unnormalise(pixels: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    return pixels * np.asarray(std)[:, None, None] + np.asarray(mean)[:, None, None]


# --- bundled data --------------------------------------------------------------------------


def test_bundled_text_is_cls_sep_wrapped_and_padded() -> None:
    batch = sources.bundled_inputs("text")
    ids = batch.feeds["input_ids"]
    mask = batch.feeds["attention_mask"]
    lengths = mask.sum(axis=1)
    assert batch.source == "bundled-text"
    assert not batch.random
    assert batch.batch_size == len(batch.labels) == ids.shape[0] == 12
    assert ids.dtype == np.int64
    assert lengths.max() == ids.shape[1]
    assert np.all(ids[:, 0] == CLS_ID)
    assert np.all(ids[np.arange(len(ids)), lengths - 1] == SEP_ID)
    # The mask is a prefix of ones, padding ids are [PAD], and there is no SEP inside a sentence.
    assert np.array_equal(mask, (np.arange(ids.shape[1]) < lengths[:, None]).astype(np.int64))
    assert np.all(ids[mask == 0] == PAD_ID)
    assert np.count_nonzero(ids == SEP_ID) == len(ids)
    assert np.array_equal(batch.token_mask, mask.astype(bool))
    assert np.all(batch.feeds["token_type_ids"] == 0)


def test_bundled_sentences_are_plain_english_of_varied_length() -> None:
    batch = sources.bundled_inputs("text")
    lines = (sources.DATA_DIR / "sentences.txt").read_text(encoding="utf-8").splitlines()
    assert batch.labels == tuple(lines)
    words = [len(sentence.split()) for sentence in batch.labels]
    assert min(words) >= 8
    assert max(words) <= 40
    assert max(words) - min(words) >= 20
    assert len(set(batch.labels)) == len(batch.labels)
    # Every whitespace word yields at least one word piece, plus [CLS] and [SEP].
    assert np.all(batch.feeds["attention_mask"].sum(axis=1) >= np.asarray(words) + 2)


def test_bundled_images_are_normalised_rgb_nchw() -> None:
    batch = sources.bundled_inputs("image")
    pixels = batch.feeds["pixel_values"]
    assert batch.source == "bundled-images"
    assert pixels.shape == (6, 3, 224, 224)
    assert pixels.dtype == np.float32
    assert batch.token_mask is None
    raw = _unnormalise(pixels.astype(np.float64))
    assert raw.min() >= -tol.FLOAT32_ATOL
    assert raw.max() <= 1 + tol.FLOAT32_ATOL
    assert raw.std() > 0.1
    levels = np.rint(raw * 255)
    np.testing.assert_allclose(raw * 255, levels, atol=255 * tol.FLOAT32_ATOL)
    gray = levels[batch.labels.index("camera.png")]
    assert np.array_equal(gray[0], gray[1])
    assert np.array_equal(gray[1], gray[2])


def test_bundled_images_are_documented_in_licence_note() -> None:
    licence = (sources.DATA_DIR / "LICENSE.md").read_text(encoding="utf-8")
    files = sorted(path.name for path in (sources.DATA_DIR / "images").glob("*.png"))
    assert 5 <= len(files) <= 6
    for name in files:
        assert f"images/{name}" in licence
        with Image.open(sources.DATA_DIR / "images" / name) as image:
            assert image.size == (224, 224)
            assert image.mode == "RGB"


def test_bundled_inputs_rejects_unknown_kind() -> None:
    with pytest.raises(InputError, match=r"`kind` must be one of text, image; got 'audio'"):
        sources.bundled_inputs("audio")  # type: ignore[arg-type]


# --- mapping onto graph inputs ----------------------------------------------------------------


@pytest.mark.realmodel
@pytest.mark.parametrize("name", [model.name for model in zoo.models()])
def test_bundled_inputs_fit_each_zoo_model(name: str) -> None:
    model = zoo.get_model(name)
    graph = load_model(require_real_model(name)).inputs
    batch = sources.bundled_inputs(model.kind, graph=graph)
    assert list(batch.feeds) == [spec.name for spec in graph]
    check_feeds(batch.feeds, graph)
    assert batch.digest == feeds_digest(batch.feeds)


def test_for_graph_maps_image_to_the_single_float_input() -> None:
    mapped = sources.bundled_inputs("image", graph=IMAGE_GRAPH)
    assert list(mapped.feeds) == ["input_image"]


def test_image_of_wrong_size_lists_the_expected_inputs() -> None:
    with pytest.raises(errors.FeedError) as info:
        sources.bundled_inputs("image", size=112, graph=IMAGE_GRAPH)
    message = str(info.value)
    assert "axis 2 must be 224" in message
    assert "input_image: float32 [batch_size, 3, 224, 224]" in message


def test_text_into_image_model_is_refused() -> None:
    with pytest.raises(errors.FeedError, match="no text feed fits graph input 'input_image'"):
        sources.bundled_inputs("text", graph=IMAGE_GRAPH)


# --- images -----------------------------------------------------------------------------------


def test_from_images_resizes_shorter_side_and_centre_crops(tmp_path: Path) -> None:
    wide = np.zeros((60, 180, 3), np.uint8)
    wide[:, :] = (255, 0, 0)
    wide[:, 60:120] = (0, 255, 0)  # the centre square is green
    _save(tmp_path / "b_wide.png", wide)
    tall_gray = np.full((90, 30), 128, np.uint8)
    _save(tmp_path / "a_tall.png", tall_gray, mode="L")
    rgba = np.full((40, 40, 4), 200, np.uint8)
    _save(tmp_path / "c_rgba.png", rgba, mode="RGBA")
    (tmp_path / "notes.txt").write_text("not an image")
    batch = sources.from_images(tmp_path, size=30, mean=(0, 0, 0), std=(1, 1, 1))
    pixels = batch.feeds["pixel_values"]
    assert batch.labels == ("a_tall.png", "b_wide.png", "c_rgba.png")
    assert batch.source == f"images:{tmp_path}"
    assert pixels.shape == (3, 3, 30, 30)
    inner = pixels[1][:, :, 2:-2]  # bicubic resampling blends the outermost columns
    np.testing.assert_allclose(inner[1], 1.0, atol=tol.PIXEL_ATOL)
    np.testing.assert_allclose(inner[0], 0.0, atol=tol.PIXEL_ATOL)
    np.testing.assert_allclose(inner[2], 0.0, atol=tol.PIXEL_ATOL)
    np.testing.assert_allclose(pixels[0], 128 / 255, atol=tol.PIXEL_ATOL)
    np.testing.assert_allclose(pixels[2], 200 / 255, atol=tol.PIXEL_ATOL)


def test_from_images_unreadable_file_is_named(tmp_path: Path) -> None:
    _save(tmp_path / "good.png", np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "broken.jpg").write_bytes(b"definitely not a jpeg")
    with pytest.raises(InputError, match=r"cannot read .*broken\.jpg"):
        sources.from_images(tmp_path, size=8)


def test_from_images_empty_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="must contain image files"):
        sources.from_images(tmp_path)
    with pytest.raises(InputError, match="must be a folder of images"):
        sources.from_images(tmp_path / "absent")


# --- npz, text, random ------------------------------------------------------------------------


def test_from_text_without_tokenizers_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "s.txt"
    file.write_text("one sentence\n")
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(errors.MissingDependencyError, match=r"oversmooth\[text\]"):
        sources.from_text(file, tmp_path / "tokenizer.json")


class _FakeEncoding:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.attention_mask = [1 if token else 0 for token in ids]
        self.type_ids = [0] * len(ids)


class _FakeTokenizer:
    """Stands in for ``tokenizers.Tokenizer``: one id per word, padded with 0 to the longest."""

    loaded: ClassVar[list[str]] = []

    @classmethod
    def from_file(cls, path: str) -> _FakeTokenizer:
        cls.loaded.append(path)
        return cls()

    def enable_truncation(self, max_length: int) -> None:
        self.max_length = max_length

    def enable_padding(self) -> None:
        pass

    def encode_batch(self, texts: list[str]) -> list[_FakeEncoding]:
        ids = [[101, *(len(word) + 1000 for word in text.split()), 102] for text in texts]
        width = max(len(row) for row in ids)
        return [_FakeEncoding(row + [0] * (width - len(row))) for row in ids]


def test_from_text_maps_tokenizer_output_to_graph_feeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    fake = types.ModuleType("tokenizers")
    fake.Tokenizer = _FakeTokenizer
    monkeypatch.setitem(sys.modules, "tokenizers", fake)
    file = tmp_path / "s.txt"
    file.write_text("two words\n\n  three words here  \n", encoding="utf-8")
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    batch = sources.from_text(file, tmp_path / "tokenizer.json", graph=TEXT_GRAPH)
    assert batch.labels == ("two words", "three words here")
    assert batch.source == f"text:{file}"
    assert set(batch.feeds) == {"input_ids", "attention_mask"}
    assert batch.feeds["input_ids"].shape == (2, 5)
    assert batch.feeds["input_ids"].dtype == np.int64
    assert batch.token_mask.sum(axis=1).tolist() == [4, 5]
    assert _FakeTokenizer.loaded[-1] == os.fspath(tmp_path / "tokenizer.json")


def test_from_text_empty_file_is_named(tmp_path: Path) -> None:
    file = tmp_path / "empty.txt"
    file.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(InputError, match="at least one non-empty line"):
        sources.from_text(file, tmp_path / "tokenizer.json")


def test_random_inputs_are_labelled_reproducible_and_shaped() -> None:
    graph = (*TEXT_GRAPH, GraphInput("token_type_ids", np.dtype(np.int64), ("batch", "sequence")))
    first = sources.random_inputs(graph, seed=3, batch=4, seq=9, vocab_size=50)
    again = sources.random_inputs(graph, seed=3, batch=4, seq=9, vocab_size=50)
    other = sources.random_inputs(graph, seed=4, batch=4, seq=9, vocab_size=50)
    assert first.random
    assert first.source == "random"
    assert first.labels == tuple(f"random-3-{index}" for index in range(4))
    assert first.digest == again.digest != other.digest
    assert first.feeds["input_ids"].shape == (4, 9)
    assert first.feeds["input_ids"].max() < 50
    assert np.all(first.feeds["attention_mask"] == 1)
    assert np.all(first.feeds["token_type_ids"] == 0)
    assert first.token_mask.all()
    check_feeds(first.feeds, graph)


def test_random_inputs_keep_fixed_dims() -> None:
    batch = sources.random_inputs(IMAGE_GRAPH, seed=0, batch=2)
    assert batch.feeds["input_image"].shape == (2, 3, 224, 224)
    assert batch.feeds["input_image"].dtype == np.float32
    assert batch.token_mask is None


# --- the regeneration script's tokenizer ------------------------------------------------------


def _script():
    path = Path(__file__).resolve().parents[3] / "scripts" / "make_bundled_inputs.py"
    spec = importlib.util.spec_from_file_location("make_bundled_inputs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_wordpiece_is_greedy_longest_match() -> None:
    script = _script()
    vocab = {
        tok: i for i, tok in enumerate(["[PAD]", "[UNK]", "un", "##aff", "##able", "a", "##b"])
    }
    assert script.wordpiece("unaffable", vocab) == ["un", "##aff", "##able"]
    assert script.wordpiece("abb", vocab) == ["a", "##b", "##b"]
    assert script.wordpiece("xyz", vocab) == ["[UNK]"]
    assert script.basic_tokenize("Héllo, World!") == ["hello", ",", "world", "!"]
