"""Real inputs for running a model: bundled photographs and sentences, user files, or labelled noise.

Every builder returns an :class:`Inputs`: batch-first feeds keyed by the model's graph input names,
a mask of the real (non-padding) tokens, one label per item, where the data came from and a digest
of the feed bytes. Feeds are checked against the model's graph inputs (names, ranks, fixed
dimensions, dtypes); a mismatch raises :class:`FeedError` listing what the model expects.

Public API
----------
GraphInput
    Name, dtype and shape (symbolic dims as strings) of one graph input.
graph_inputs
    The graph inputs of an ONNX model (initializers excluded).
Inputs
    Feeds plus token mask, labels, source, digest and a ``random`` flag.
bundled_inputs
    The photographs or sentences shipped with the package.
from_npz, from_images, from_text, random_inputs
    Inputs from an ``.npz`` of feeds, a folder of images, a text file (needs ``tokenizers``) or noise.
for_graph
    Rename, cast and check canonical feeds against a model's graph inputs.
check_feeds
    Check feeds against graph inputs.
load_image
    One image as an RGB ``(size, size, 3)`` uint8 array: shorter side resized, centre-cropped.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from simulator.errors import InputError, OversmoothError
from simulator.validation import as_generator, check_positive_int

__all__ = [
    "DATA_DIR",
    "IMAGE_SUFFIXES",
    "TEXT_FEEDS",
    "FeedError",
    "GraphInput",
    "Inputs",
    "MissingDependencyError",
    "bundled_inputs",
    "check_feeds",
    "feeds_digest",
    "for_graph",
    "from_images",
    "from_npz",
    "from_text",
    "graph_inputs",
    "load_image",
    "random_inputs",
]

#: Folder of the bundled inputs (images/, sentences.txt, sentences.npz, LICENSE.md).
DATA_DIR = Path(__file__).resolve().parent / "data"

#: Canonical text feed names, in the order BERT-style graphs declare them.
TEXT_FEEDS = ("input_ids", "attention_mask", "token_type_ids")
#: Canonical name of the image feed before it is mapped to the graph's input name.
IMAGE_FEED = "pixel_values"
#: File suffixes :func:`from_images` reads.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_TEXT_ALIASES = {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "type"}

Dim = int | str | None


class FeedError(InputError):
    """Feeds do not fit the model's graph inputs; the message lists what the model expects."""


class MissingDependencyError(OversmoothError, ImportError):
    """An optional dependency is needed for this input source."""


@dataclass(frozen=True)
class GraphInput:
    """One graph input of an ONNX model.

    Attributes
    ----------
    name : str
        Input name.
    dtype : numpy.dtype
        Element type.
    shape : tuple of (int or str or None)
        Fixed dims as ints, symbolic dims as their names, unknown dims as None.
    """

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    def describe(self) -> str:
        """One line: ``name: dtype [dim, ...]``."""
        dims = ", ".join("?" if dim is None else str(dim) for dim in self.shape)
        return f"{self.name}: {self.dtype} [{dims}]"


def graph_inputs(model: str | os.PathLike[str] | object) -> tuple[GraphInput, ...]:
    """Return the graph inputs of an ONNX model (a path or a ``ModelProto``), initializers excluded.

    External data is not loaded.
    """
    import onnx

    proto = (
        onnx.load(os.fspath(model), load_external_data=False)
        if isinstance(model, str | os.PathLike)
        else model
    )
    constants = {init.name for init in proto.graph.initializer}
    return tuple(
        _graph_input(value, onnx) for value in proto.graph.input if value.name not in constants
    )


def _graph_input(value: Any, onnx: Any) -> GraphInput:
    tensor = value.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    dims: list[Dim] = []
    for dim in tensor.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        else:
            dims.append(dim.dim_param or None)
    return GraphInput(value.name, dtype, tuple(dims))


def expected_inputs_text(inputs: Iterable[GraphInput]) -> str:
    """The model's inputs as one line, for error messages."""
    return "; ".join(graph_input.describe() for graph_input in inputs)


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """Return the sha256 over feed names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """A batch of model inputs with provenance.

    Attributes
    ----------
    feeds : dict of str to ndarray
        Batch-first arrays keyed by graph input name (text: ``(B, T)`` integer ids and masks;
        images: ``(B, 3, H, W)`` float32, normalised).
    token_mask : (B, T) bool ndarray or None
        True on real tokens, False on padding; None when every token is real (images).
    labels : tuple of str
        One label per batch item (file name or sentence).
    source : str
        ``"bundled-images"``, ``"bundled-text"``, ``"npz:<digest>"``, ``"images:<dir>"``,
        ``"text:<file>"`` or ``"random"``.
    digest : str
        :func:`feeds_digest` of ``feeds``.
    random : bool
        True for labelled noise rather than real data.
    """

    feeds: dict[str, np.ndarray]
    token_mask: NDArray[np.bool_] | None
    labels: tuple[str, ...]
    source: str
    digest: str = ""
    random: bool = False

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", feeds_digest(self.feeds))

    @property
    def batch_size(self) -> int:
        """Number of items."""
        return len(self.labels)

    def token_mask_for(self, n_tokens: int) -> NDArray[np.bool_]:
        """Return the ``(B, n_tokens)`` real-token mask for a hidden state with ``n_tokens`` tokens."""
        if self.token_mask is None:
            return np.ones((self.batch_size, n_tokens), dtype=bool)
        if self.token_mask.shape[1] != n_tokens:
            raise InputError(
                f"`n_tokens` must equal the input sequence length {self.token_mask.shape[1]}; "
                f"got {n_tokens}"
            )
        return self.token_mask

    def subset(self, items: slice | Sequence[int]) -> Inputs:
        """Return the items selected by ``items`` (a slice or indices) as new Inputs."""
        index = items if isinstance(items, slice) else np.asarray(items, dtype=np.intp)
        labels = np.asarray(self.labels, dtype=object)[index]
        return replace(
            self,
            feeds={name: array[index] for name, array in self.feeds.items()},
            token_mask=None if self.token_mask is None else self.token_mask[index],
            labels=tuple(str(label) for label in labels),
            digest="",
        )


# --------------------------------------------------------------------------------------------
# Checking feeds against the graph
# --------------------------------------------------------------------------------------------


def _feed_error(problem: str, expected: Sequence[GraphInput]) -> FeedError:
    return FeedError(f"{problem}; the model expects {expected_inputs_text(expected)}")


def _check_one(
    array: np.ndarray, spec: GraphInput, bound: dict[str, int], expected: Sequence[GraphInput]
) -> None:
    if array.dtype != spec.dtype:
        raise _feed_error(f"feed {spec.name!r} must be {spec.dtype}; got {array.dtype}", expected)
    if array.ndim != len(spec.shape):
        raise _feed_error(
            f"feed {spec.name!r} must have {len(spec.shape)} axes; got shape {array.shape}",
            expected,
        )
    for axis, (dim, size) in enumerate(zip(spec.shape, array.shape, strict=True)):
        if isinstance(dim, int) and dim != size:
            raise _feed_error(
                f"feed {spec.name!r} axis {axis} must be {dim}; got shape {array.shape}", expected
            )
        if isinstance(dim, str) and bound.setdefault(dim, size) != size:
            raise _feed_error(
                f"feed {spec.name!r} axis {axis} ({dim}) must be {bound[dim]} like the other "
                f"feeds; got shape {array.shape}",
                expected,
            )


def check_feeds(feeds: Mapping[str, np.ndarray], expected: Sequence[GraphInput]) -> None:
    """Check that ``feeds`` match the graph inputs exactly: names, dtypes, ranks, fixed dims.

    A symbolic dimension must take the same size in every feed that uses it.

    Raises
    ------
    FeedError
        A missing or unknown feed, a wrong dtype, rank or size; the message lists every expected
        input with its shape (symbolic dims by name) and dtype.
    """
    names = [spec.name for spec in expected]
    missing = [name for name in names if name not in feeds]
    if missing:
        raise _feed_error(f"missing feed(s) {', '.join(missing)}", expected)
    unknown = [name for name in feeds if name not in names]
    if unknown:
        raise _feed_error(f"unknown feed(s) {', '.join(unknown)}", expected)
    bound: dict[str, int] = {}
    for spec in expected:
        _check_one(np.asarray(feeds[spec.name]), spec, bound, expected)


def _text_source_for(spec: GraphInput, available: Mapping[str, np.ndarray]) -> str | None:
    if spec.name in available:
        return spec.name
    lowered = spec.name.lower()
    for canonical, alias in _TEXT_ALIASES.items():
        if canonical in available and alias in lowered:
            return canonical
    return None


def _cast(array: np.ndarray, spec: GraphInput, expected: Sequence[GraphInput]) -> np.ndarray:
    if array.dtype == spec.dtype:
        return array
    same_kind = (array.dtype.kind in "iub" and spec.dtype.kind in "iu") or (
        array.dtype.kind == "f" and spec.dtype.kind == "f"
    )
    if not same_kind:
        raise _feed_error(f"feed {spec.name!r} must be {spec.dtype}; got {array.dtype}", expected)
    return array.astype(spec.dtype)


def _map_image(inputs: Inputs, expected: Sequence[GraphInput]) -> dict[str, np.ndarray]:
    candidates = [spec for spec in expected if spec.dtype.kind == "f" and len(spec.shape) == 4]
    if len(expected) != 1 or len(candidates) != 1:
        raise _feed_error("images need a model with a single (B, 3, H, W) float input", expected)
    spec = candidates[0]
    return {spec.name: _cast(inputs.feeds[IMAGE_FEED], spec, expected)}


def _map_text(inputs: Inputs, expected: Sequence[GraphInput]) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for spec in expected:
        source = _text_source_for(spec, inputs.feeds)
        if source is None:
            raise _feed_error(f"no text feed fits graph input {spec.name!r}", expected)
        feeds[spec.name] = _cast(inputs.feeds[source], spec, expected)
    return feeds


def for_graph(inputs: Inputs, expected: Sequence[GraphInput]) -> Inputs:
    """Map canonical feeds onto a model's graph inputs, then check them.

    Text feeds (``input_ids``, ``attention_mask``, ``token_type_ids``) go to the graph inputs of the
    same name (or containing ``ids`` / ``mask`` / ``type``); those the graph lacks are dropped.
    The image feed goes to the graph's single 4-axis float input. Integer and float feeds are cast
    to the graph's integer or float dtype; other dtype changes are refused.

    Raises
    ------
    FeedError
        The feeds cannot be mapped or do not fit; the message lists the model's inputs.
    """
    if IMAGE_FEED in inputs.feeds:
        feeds = _map_image(inputs, expected)
    elif set(inputs.feeds) & set(TEXT_FEEDS):
        feeds = _map_text(inputs, expected)
    else:
        feeds = dict(inputs.feeds)
    check_feeds(feeds, expected)
    return replace(inputs, feeds=feeds, digest="")


def _maybe_for_graph(inputs: Inputs, expected: Sequence[GraphInput] | None) -> Inputs:
    return inputs if expected is None else for_graph(inputs, expected)


# --------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------


def load_image(path: str | os.PathLike[str], size: int) -> NDArray[np.uint8]:
    """Read an image as RGB, resize its shorter side to ``size`` (bicubic) and centre-crop.

    Returns
    -------
    (size, size, 3) uint8 ndarray

    Raises
    ------
    InputError
        The file cannot be read as an image (the message names the file).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError) as err:
        raise InputError(
            f"`images` must be readable image files; cannot read {path}: {err}"
        ) from err
    width, height = rgb.size
    scale = size / min(width, height)
    new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
    resized = rgb.resize(new_size, Image.Resampling.BICUBIC)
    left = (new_size[0] - size) // 2
    top = (new_size[1] - size) // 2
    cropped = resized.crop((left, top, left + size, top + size))
    return np.asarray(cropped, dtype=np.uint8)


def _normalise(
    images: NDArray[np.uint8], mean: Sequence[float], std: Sequence[float]
) -> NDArray[np.float32]:
    """(B, H, W, 3) uint8 → (B, 3, H, W) float32, ``(x / 255 - mean) / std`` per channel."""
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise InputError(
            f"`mean` and `std` must have 3 entries with std > 0; got {tuple(mean)}, {tuple(std)}"
        )
    scaled = images.astype(np.float32) / np.float32(255.0)
    normalised = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(normalised.transpose(0, 3, 1, 2), dtype=np.float32)


def _image_inputs(
    files: Sequence[Path], size: int, mean: Sequence[float], std: Sequence[float], source: str
) -> Inputs:
    pixels = np.stack([load_image(path, size) for path in files])
    return Inputs(
        feeds={IMAGE_FEED: _normalise(pixels, mean, std)},
        token_mask=None,
        labels=tuple(path.name for path in files),
        source=source,
    )


def _image_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise InputError(f"`images` must be a folder of images; got {directory}")
    files = sorted(
        path
        for path in directory.iterdir()
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise InputError(
            f"`images` must contain image files ({', '.join(IMAGE_SUFFIXES)}); got none in "
            f"{directory}"
        )
    return files


def from_images(
    directory: str | os.PathLike[str],
    *,
    size: int = 224,
    mean: Sequence[float] = _IMAGENET_MEAN,
    std: Sequence[float] = _IMAGENET_STD,
    graph: Sequence[GraphInput] | None = None,
) -> Inputs:
    """Every image in a folder (sorted by name), as one normalised NCHW float32 batch.

    Each image is converted to RGB, its shorter side resized to ``size`` and centre-cropped
    (:func:`load_image`), then normalised per channel as ``(x / 255 - mean) / std``.

    Parameters
    ----------
    directory : path-like
        Folder of ``.png``/``.jpg``/... files.
    size : int
        Output side in pixels.
    mean, std : sequence of 3 floats
        Per-channel normalisation (ImageNet by default).
    graph : sequence of GraphInput, optional
        Map and check the feed against these graph inputs.

    Returns
    -------
    Inputs
        ``feeds`` holds one ``(B, 3, size, size)`` float32 array; ``labels`` are file names.
    """
    folder = Path(directory)
    inputs = _image_inputs(_image_files(folder), size, mean, std, f"images:{folder}")
    return _maybe_for_graph(inputs, graph)


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------


def _text_inputs(
    ids: np.ndarray, mask: np.ndarray, types: np.ndarray, labels: Sequence[str], source: str
) -> Inputs:
    feeds = {
        "input_ids": np.asarray(ids, dtype=np.int64),
        "attention_mask": np.asarray(mask, dtype=np.int64),
        "token_type_ids": np.asarray(types, dtype=np.int64),
    }
    return Inputs(
        feeds=feeds,
        token_mask=feeds["attention_mask"].astype(bool),
        labels=tuple(labels),
        source=source,
    )


def _read_sentences(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"`text` must be a readable UTF-8 text file; cannot read {path}") from err
    sentences = [line.strip() for line in text.splitlines() if line.strip()]
    if not sentences:
        raise InputError(f"`text` must hold at least one non-empty line; got none in {path}")
    return sentences


def _load_tokenizer(tokenizer_json: Path, max_length: int) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise MissingDependencyError(
            "reading text files needs the `tokenizers` package; install it with "
            "`pip install 'oversmooth[text]'` (or `pip install tokenizers`)"
        ) from err
    try:
        tokenizer = Tokenizer.from_file(os.fspath(tokenizer_json))
    except Exception as err:  # tokenizers raises its own untyped exceptions
        raise InputError(
            f"`tokenizer` must be a tokenizer.json file; cannot load {tokenizer_json}: {err}"
        ) from err
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding()
    return tokenizer


def from_text(
    file: str | os.PathLike[str],
    tokenizer_json: str | os.PathLike[str],
    *,
    max_length: int = 512,
    graph: Sequence[GraphInput] | None = None,
) -> Inputs:
    """One sentence per non-empty line of ``file``, tokenized with a Hugging Face ``tokenizer.json``.

    Needs the optional ``tokenizers`` package. Sequences are padded to the longest and truncated to
    ``max_length`` tokens.

    Returns
    -------
    Inputs
        ``input_ids``, ``attention_mask``, ``token_type_ids`` as ``(B, T)`` int64; labels are the
        sentences.

    Raises
    ------
    MissingDependencyError
        ``tokenizers`` is not installed (the message names the extra to install).
    """
    path = Path(file)
    sentences = _read_sentences(path)
    tokenizer = _load_tokenizer(Path(tokenizer_json), max_length)
    encodings = tokenizer.encode_batch(sentences)
    inputs = _text_inputs(
        np.array([enc.ids for enc in encodings]),
        np.array([enc.attention_mask for enc in encodings]),
        np.array([enc.type_ids for enc in encodings]),
        sentences,
        f"text:{path}",
    )
    return _maybe_for_graph(inputs, graph)


# --------------------------------------------------------------------------------------------
# Bundled, npz, random
# --------------------------------------------------------------------------------------------


def _bundled_text() -> Inputs:
    sentences = _read_sentences(DATA_DIR / "sentences.txt")
    with np.load(DATA_DIR / "sentences.npz", allow_pickle=False) as data:
        arrays = {name: data[name] for name in TEXT_FEEDS}
    return _text_inputs(
        arrays["input_ids"],
        arrays["attention_mask"],
        arrays["token_type_ids"],
        sentences,
        "bundled-text",
    )


def bundled_inputs(
    kind: Literal["text", "image"],
    *,
    graph: Sequence[GraphInput] | None = None,
    size: int = 224,
    mean: Sequence[float] = _IMAGENET_MEAN,
    std: Sequence[float] = _IMAGENET_STD,
) -> Inputs:
    """The real inputs shipped with the package.

    ``"image"``: six CC0 / public-domain photographs (224x224 RGB PNG, see ``data/LICENSE.md``),
    normalised with ``mean``/``std`` and resized if ``size`` differs. ``"text"``: a dozen English
    sentences of 8–40 words, pre-tokenized with the BERT uncased WordPiece vocabulary
    (``[CLS] … [SEP]``, padded to the longest).

    Parameters
    ----------
    kind : {"text", "image"}
        What the model reads (``ZooModel.kind``).
    graph : sequence of GraphInput, optional
        Map and check the feeds against these graph inputs.
    size, mean, std
        Image side and normalisation (images only).
    """
    if kind == "text":
        inputs = _bundled_text()
    elif kind == "image":
        files = sorted((DATA_DIR / "images").glob("*.png"))
        inputs = _image_inputs(files, size, mean, std, "bundled-images")
    else:
        raise InputError(f"`kind` must be one of text, image; got {kind!r}")
    return _maybe_for_graph(inputs, graph)


def _npz_labels(data: Mapping[str, np.ndarray], batch: int) -> tuple[str, ...]:
    if "labels" in data:
        labels = tuple(str(label) for label in np.asarray(data["labels"]).reshape(-1))
        if len(labels) != batch:
            raise InputError(f"`labels` in the npz must have {batch} entries; got {len(labels)}")
        return labels
    return tuple(f"item-{index}" for index in range(batch))


def from_npz(path: str | os.PathLike[str], graph: Sequence[GraphInput]) -> Inputs:
    """Feeds stored in an ``.npz`` under the graph input names (plus an optional ``labels`` array).

    The token mask is taken from an ``attention_mask`` feed when there is one.

    Raises
    ------
    InputError
        The file cannot be read as an npz (message names the file).
    FeedError
        The arrays do not fit the graph inputs.
    """
    file = Path(path)
    try:
        with np.load(file, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as err:
        raise InputError(f"`inputs` must be a readable .npz file; cannot read {file}") from err
    feeds = {name: array for name, array in arrays.items() if name != "labels"}
    check_feeds(feeds, graph)
    batch = next((int(array.shape[0]) for array in feeds.values() if array.ndim), 1)
    mask_name = next((spec.name for spec in graph if "mask" in spec.name.lower()), None)
    mask = feeds[mask_name].astype(bool) if mask_name else None
    digest = feeds_digest(feeds)
    return Inputs(
        feeds=feeds,
        token_mask=mask if mask is not None and mask.ndim == 2 else None,
        labels=_npz_labels(arrays, batch),
        source=f"npz:{digest[:12]}",
        digest=digest,
    )


def _random_dim(axis: int, dim: Dim, batch: int, seq: int) -> int:
    if isinstance(dim, int):
        return dim
    return batch if axis == 0 else seq


def _random_feed(
    spec: GraphInput, shape: tuple[int, ...], rng: np.random.Generator, vocab_size: int
) -> np.ndarray:
    lowered = spec.name.lower()
    if spec.dtype.kind in "iu":
        if "mask" in lowered:
            return np.ones(shape, dtype=spec.dtype)
        if "type" in lowered or "position" in lowered:
            return np.zeros(shape, dtype=spec.dtype)
        return rng.integers(0, vocab_size, size=shape).astype(spec.dtype)
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if spec.dtype.kind == "b":
        return np.ones(shape, dtype=bool)
    raise FeedError(f"cannot make random data for {spec.describe()}")


def random_inputs(
    graph: Sequence[GraphInput],
    *,
    seed: int = 0,
    batch: int = 2,
    seq: int = 16,
    vocab_size: int = 1000,
) -> Inputs:
    """Labelled random feeds for every graph input (``random=True``; not real data).

    Axis 0 of a symbolic shape gets ``batch``, other symbolic axes ``seq``, fixed axes their size.
    Integer inputs whose name contains ``mask`` are ones, ``type``/``position`` zeros, others ids
    drawn uniformly from ``[0, vocab_size)``; float inputs are standard normal.
    """
    for value, name in ((batch, "batch"), (seq, "seq"), (vocab_size, "vocab_size")):
        check_positive_int(value, name)
    rng = as_generator(seed)
    feeds = {}
    for spec in graph:
        shape = tuple(_random_dim(axis, dim, batch, seq) for axis, dim in enumerate(spec.shape))
        feeds[spec.name] = _random_feed(spec, shape, rng, vocab_size)
    n_items = next((array.shape[0] for array in feeds.values() if array.ndim), 1)
    mask_name = next((spec.name for spec in graph if "mask" in spec.name.lower()), None)
    mask = feeds[mask_name].astype(bool) if mask_name and feeds[mask_name].ndim == 2 else None
    return Inputs(
        feeds=feeds,
        token_mask=mask,
        labels=tuple(f"random-{seed}-{index}" for index in range(n_items)),
        source="random",
        random=True,
    )
