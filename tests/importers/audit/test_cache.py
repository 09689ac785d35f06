"""The audit's cache of input-independent results (oversmooth.importers.audit.cache).

Entries are read back instead of recomputed, keyed by the model digest, the entry, the format and
the options; a corrupt, foreign or mis-shaped entry is recomputed and replaced, never trusted;
``use_cache=False`` neither reads nor writes; an unwritable cache costs only time; and an audit
writes nothing outside the cache folder it is given.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from oversmooth.importers.audit import cache
from oversmooth.importers.audit.cache import (
    cache_folder,
    cached_value_spectra,
    entry_path,
    load_entry,
    save_entry,
    weights_digest,
)
from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.graph import load_model
from oversmooth.importers.value_spectra import (
    BlockSpectra,
    blocks_spectra,
    model_spectra,
    spectrum_rows,
)
from oversmooth.importers.weights import BlockWeights, extract
from oversmooth.importers.zoo import file_sha256
from tests.importers.audited import builder_inputs
from tests.importers.builders import assemble

SEED = 5
#: Pre-LN with γ: every kind of spectrum, γ-folded ones included.
MODEL = "vit_prenorm_layerscale"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache folder and home for one test."""
    monkeypatch.setenv("OVERSMOOTH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture
def model(home: Path) -> Path:
    path = home / "models" / f"{MODEL}.onnx"
    path.parent.mkdir()
    onnx.save(assemble(MODEL, SEED).built.model, path)
    return path


def blocks_of(path: Path) -> list[BlockWeights]:
    return extract(load_model(path))


def assert_same_spectra(found: list[BlockSpectra], expected: list[BlockSpectra]) -> None:
    assert spectrum_rows(found) == spectrum_rows(expected)


def only_entry() -> Path:
    entries = sorted(cache_folder().iterdir())
    assert len(entries) == 1, entries
    return entries[0]


def test_value_spectra_are_computed_once_then_read_back(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = blocks_of(model)
    first = cached_value_spectra(blocks, file_sha256(model))
    entry = only_entry()
    assert entry.suffix == ".npz"
    assert not entry.name.startswith(".")

    def fail(blocks: list[BlockWeights]) -> list[BlockSpectra]:
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(cache, "blocks_spectra", fail)
    again = cached_value_spectra(blocks, file_sha256(model))
    assert_same_spectra(again, first)
    assert spectrum_rows(first) == model_spectra(blocks)
    assert any(
        not np.array_equal(block.head_effective, block.head) for block in again
    )  # the model folds factors: its effective spectra differ from the stored ones


def _garbage(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.write_bytes(b"not a zip file at all")


def _truncated(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _foreign_key(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **{**arrays, "__key__": np.array('{"model": "another"}')})


def _wrong_shape(path: Path, arrays: dict[str, np.ndarray]) -> None:
    name = next(name for name in arrays if name.endswith(".head"))
    np.savez(path, **{**arrays, name: arrays[name][:, :-1]})


def _real_dtype(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **{name: a if name == "__key__" else a.real for name, a in arrays.items()})


def _missing_kind(path: Path, arrays: dict[str, np.ndarray]) -> None:
    name = next(name for name in arrays if name.endswith(".layer_effective"))
    np.savez(path, **{key: value for key, value in arrays.items() if key != name})


def _not_finite(path: Path, arrays: dict[str, np.ndarray]) -> None:
    name = next(name for name in arrays if name.endswith(".layer"))
    np.savez(path, **{**arrays, name: np.full_like(arrays[name], np.nan)})


def _pickled(path: Path, arrays: dict[str, np.ndarray]) -> None:
    np.savez(path, **arrays, extra=np.array([object()], dtype=object))


@pytest.mark.parametrize(
    "corrupt",
    [
        _garbage,
        _truncated,
        _foreign_key,
        _wrong_shape,
        _real_dtype,
        _missing_kind,
        _not_finite,
        _pickled,
    ],
)
def test_a_bad_entry_is_recomputed_and_replaced(model: Path, corrupt) -> None:
    blocks = blocks_of(model)
    expected = cached_value_spectra(blocks, file_sha256(model))
    entry = only_entry()
    with np.load(entry, allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files}
    corrupt(entry, arrays)
    assert_same_spectra(cached_value_spectra(blocks, file_sha256(model)), expected)
    assert only_entry() == entry
    options = {"weights": weights_digest(blocks)}
    assert load_entry(file_sha256(model), "value-spectra", options) is not None


def test_keys_differ_by_model_entry_options_and_format(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = {
        entry_path("a" * 64, "value-spectra", {"weights": "x"}),
        entry_path("b" * 64, "value-spectra", {"weights": "x"}),
        entry_path("a" * 64, "other", {"weights": "x"}),
        entry_path("a" * 64, "value-spectra", {"weights": "y"}),
        entry_path("a" * 64, "value-spectra", {"weights": "x", "gamma": True}),
    }
    monkeypatch.setattr(cache, "CACHE_FORMAT", cache.CACHE_FORMAT + 1)
    paths.add(entry_path("a" * 64, "value-spectra", {"weights": "x"}))
    assert len(paths) == 6
    assert all(path.parent == home / "cache" / "audit" for path in paths)


def test_an_entry_is_found_only_under_its_own_key(home: Path) -> None:
    arrays = {"x": np.arange(3.0)}
    assert save_entry("a" * 64, "test", {"k": 1}, arrays)
    found = load_entry("a" * 64, "test", {"k": 1})
    assert found is not None
    assert found.keys() == {"x"}
    np.testing.assert_array_equal(found["x"], arrays["x"])
    assert load_entry("a" * 64, "test", {"k": 2}) is None
    assert load_entry("a" * 64, "test", {"k": 1}, lambda stored: stored["x"].shape == (4,)) is None
    assert not [path for path in cache_folder().iterdir() if path.name.startswith(".")]


def test_the_weights_digest_follows_every_weight_the_spectra_read(model: Path) -> None:
    blocks = blocks_of(model)
    digest = weights_digest(blocks)
    assert weights_digest(blocks_of(model)) == digest
    for field in ("W_V", "W_O", "gamma", "layer_scale"):
        array = getattr(blocks[-1], field).copy()
        array.flat[0] += 1e-12
        changed = [*blocks[:-1], dataclasses.replace(blocks[-1], **{field: array})]
        assert weights_digest(changed) != digest, field


def test_no_cache_neither_reads_nor_writes(model: Path) -> None:
    blocks = blocks_of(model)
    expected = blocks_spectra(blocks)
    assert_same_spectra(cached_value_spectra(blocks, file_sha256(model), use_cache=False), expected)
    assert not cache_folder().exists()
    # A valid-looking entry with other numbers: read with the cache, ignored without it.
    poisoned = [dataclasses.replace(block, head=block.head + 1.0) for block in expected]
    options = {"weights": weights_digest(blocks)}
    save_entry(file_sha256(model), "value-spectra", options, cache._spectra_arrays(poisoned))
    assert_same_spectra(cached_value_spectra(blocks, file_sha256(model)), poisoned)
    assert_same_spectra(cached_value_spectra(blocks, file_sha256(model), use_cache=False), expected)


def test_an_unwritable_cache_costs_only_time(
    model: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = home / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("OVERSMOOTH_CACHE", str(blocker))
    blocks = blocks_of(model)
    assert not save_entry(file_sha256(model), "value-spectra", {}, {"x": np.zeros(1)})
    spectra = cached_value_spectra(blocks, file_sha256(model))
    assert_same_spectra(spectra, blocks_spectra(blocks))
    assert blocker.read_text() == "a file where the cache folder should be"


def test_an_audit_writes_only_into_its_cache_and_equals_the_uncached_one(
    model: Path, home: Path
) -> None:
    inputs = builder_inputs(assemble(MODEL, SEED))
    before = set(home.rglob("*"))
    cold = audit(model, inputs, provider="cpu")
    written = set(home.rglob("*")) - before
    assert written == {home / "cache", home / "cache" / "audit", only_entry()}
    warm = audit(model, inputs, provider="cpu")
    fresh = audit(model, inputs, provider="cpu", cache=False)
    for result in (warm, fresh):
        assert result.spectra == cold.spectra
        assert result.dominance == cold.dominance
    assert not (home / "home").exists()
    assert os.environ["OVERSMOOTH_CACHE"] == str(home / "cache")
