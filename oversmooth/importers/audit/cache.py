"""The audit's per-user cache of input-independent results, keyed by the model file's digest.

What an audit computes from the weights alone (the value spectra of W_V W_O per head and layer,
which the dominance step reuses) is the same on every run of the same model. It is stored once per
model under ``cache_dir()/audit`` (:func:`oversmooth.importers.zoo.cache_dir`: ``$OVERSMOOTH_CACHE``, else
``$XDG_CACHE_HOME/oversmooth``, else ``~/.cache/oversmooth``), one ``.npz`` file per entry.

Keys and trust
--------------
An entry's file name is a digest of its key: the model file's sha256, the entry's name,
:data:`CACHE_FORMAT` and the entry's options (for the value spectra: a digest of the weights they
are computed from, so a change of the weight extraction never reuses stale numbers). The key is
also stored inside the file and compared on load. Files are read with ``allow_pickle=False``; a
file that cannot be read, holds another key, or fails the caller's shape check is ignored (and
replaced by the next save). Files are written atomically (a temporary file in the same folder,
then ``os.replace``); a cache folder that cannot be written costs the time, never the audit.

Public API
----------
CACHE_FORMAT
    Bump when an entry's layout or meaning changes.
cache_folder, entry_path
    Where entries live.
load_entry, save_entry
    Read and write one entry's arrays.
weights_digest
    The sha256 of the arrays the value spectra depend on.
cached_value_spectra
    :func:`oversmooth.importers.value_spectra.blocks_spectra`, from the cache when it holds them.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oversmooth.importers.value_spectra import BlockSpectra, blocks_spectra
from oversmooth.importers.weights import FACTOR_KEYS, BlockWeights
from oversmooth.importers.zoo import cache_dir

__all__ = [
    "CACHE_FORMAT",
    "cache_folder",
    "cached_value_spectra",
    "entry_path",
    "load_entry",
    "save_entry",
    "weights_digest",
]

#: Version of the entries' layout; part of every key.
CACHE_FORMAT = 2
_KEY = "__key__"
_VALUE_SPECTRA = "value-spectra"
Options = Mapping[str, str | int | float | bool]
Arrays = dict[str, np.ndarray]


def cache_folder() -> Path:
    """The folder of the audit's entries (not created)."""
    return cache_dir() / "audit"


def _key(model_sha256: str, entry: str, options: Options) -> str:
    fields = {"model": model_sha256, "entry": entry, "format": CACHE_FORMAT, "options": options}
    return json.dumps(fields, sort_keys=True)


def entry_path(model_sha256: str, entry: str, options: Options) -> Path:
    """The file of one entry: ``cache_folder()/ENTRY-DIGEST.npz``, DIGEST hashing the whole key."""
    digest = hashlib.sha256(_key(model_sha256, entry, options).encode()).hexdigest()
    return cache_folder() / f"{entry}-{digest}.npz"


def load_entry(
    model_sha256: str,
    entry: str,
    options: Options,
    valid: Callable[[Arrays], bool] = lambda arrays: True,
) -> Arrays | None:
    """The arrays of an entry, or None when it is missing, unreadable, another key's, or not ``valid``."""
    path = entry_path(model_sha256, entry, options)
    try:  # the file is opened here: np.load leaks its own handle when the zip is broken
        with path.open("rb") as handle, np.load(handle, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error):
        return None
    key = arrays.pop(_KEY, None)
    if key is None or key.shape != () or str(key) != _key(model_sha256, entry, options):
        return None
    try:
        return arrays if valid(arrays) else None
    except (KeyError, ValueError, TypeError, IndexError):
        return None


def save_entry(model_sha256: str, entry: str, options: Options, arrays: Arrays) -> bool:
    """Write an entry atomically; False (and nothing left behind) when the folder is not writable."""
    path = entry_path(model_sha256, entry, options)
    key = np.array(_key(model_sha256, entry, options))
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=f".{path.stem}-", suffix=".npz", delete=False
        ) as handle:
            temporary = Path(handle.name)
            payload: dict[str, Any] = {**arrays, _KEY: key}
            np.savez(handle, **payload)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        return False
    return True


def weights_digest(blocks: Sequence[BlockWeights]) -> str:
    """sha256 of what the value spectra depend on: every block's layout, W_V, W_O and the
    effective H's factors."""
    digest = hashlib.sha256()
    for block in blocks:
        layout = (block.index, block.n_heads, block.n_kv_heads, block.d_head, block.norm)
        digest.update(repr((*layout, block.norm_kind)).encode())
        factors = block.h_factors()
        for array in (block.W_V, block.W_O, *(factors[key] for key in FACTOR_KEYS)):
            digest.update(b"-" if array is None else np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _spectra_arrays(spectra: Sequence[BlockSpectra]) -> Arrays:
    arrays: Arrays = {}
    for block in spectra:
        kinds = {"head": block.head, "layer": block.layer}
        kinds |= {"head_effective": block.head_effective, "layer_effective": block.layer_effective}
        arrays |= {f"{block.index}.{k}": v for k, v in kinds.items()}
    return arrays


def _expected_shapes(block: BlockWeights) -> dict[str, tuple[int, ...]]:
    shapes = {"head": (block.n_heads, block.d_head), "layer": (block.d_model,)}
    shapes |= {"head_effective": shapes["head"], "layer_effective": shapes["layer"]}
    return {f"{block.index}.{kind}": shape for kind, shape in shapes.items()}


def _valid_spectra(arrays: Arrays, blocks: Sequence[BlockWeights]) -> bool:
    expected: dict[str, tuple[int, ...]] = {}
    for block in blocks:
        expected |= _expected_shapes(block)
    return arrays.keys() == expected.keys() and all(
        arrays[name].dtype == np.complex128
        and arrays[name].shape == shape
        and bool(np.isfinite(arrays[name]).all())
        for name, shape in expected.items()
    )


def _spectra_from_arrays(arrays: Arrays, blocks: Sequence[BlockWeights]) -> list[BlockSpectra]:
    kinds = ("head", "layer", "head_effective", "layer_effective")
    return [
        BlockSpectra(block.index, *(arrays[f"{block.index}.{kind}"] for kind in kinds))
        for block in blocks
    ]


def cached_value_spectra(
    blocks: Sequence[BlockWeights], model_sha256: str, *, use_cache: bool = True
) -> list[BlockSpectra]:
    """Every block's value spectra, from the cache when it holds them for these weights.

    Computed with one BLAS thread (:func:`oversmooth.importers.value_spectra.blocks_spectra`) and stored
    when missing; ``use_cache=False`` neither reads nor writes the cache.
    """
    options = {"weights": weights_digest(blocks)} if use_cache else {}
    if use_cache:
        arrays = load_entry(
            model_sha256, _VALUE_SPECTRA, options, lambda found: _valid_spectra(found, blocks)
        )
        if arrays is not None:
            return _spectra_from_arrays(arrays, blocks)
    spectra = blocks_spectra(blocks)
    if use_cache:
        save_entry(model_sha256, _VALUE_SPECTRA, options, _spectra_arrays(spectra))
    return spectra
