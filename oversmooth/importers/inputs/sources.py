"""Where a model's inputs come from: bundled photographs and sentences, user files, or labelled noise.

Every source returns an :class:`~oversmooth.importers.inputs.feeds.Inputs`; given the model's graph inputs it maps
the canonical feeds onto them and checks them (:func:`~oversmooth.importers.inputs.feeds.for_graph`).

Public API
----------
bundled_inputs
    The photographs or sentences shipped with the package.
default_inputs
    The bundled inputs that suit a model (its zoo entry, else its graph inputs).
from_npz, from_images, from_text, random_inputs
    Inputs from an ``.npz`` of feeds (:mod:`oversmooth.importers.inputs.npz`), a folder of images, a text file
    (needs ``tokenizers``) or noise. Images, noise and ``.npz`` are read batch by batch.
load_image
    One image as an RGB ``(size, size, 3)`` uint8 array: shorter side resized, centre-cropped.
DATA_DIR, IMAGE_SUFFIXES
    The bundled data folder; the image file suffixes read.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from oversmooth.importers.defaults import RANDOM_SEQ_LEN, RANDOM_VOCAB_SIZE
from oversmooth.importers.errors import FeedError, ImporterInputError, MissingDependencyError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs.decoder_feeds import takes_positions, token_mask_input
from oversmooth.importers.inputs.feeds import (
    IMAGE_FEED,
    TEXT_FEEDS,
    Inputs,
    for_graph,
    streamed_digest,
)
from oversmooth.importers.inputs.npz import from_npz
from oversmooth.importers.zoo import IMAGENET_MEAN, IMAGENET_STD, ZooModel
from oversmooth.simulator.errors import one_line
from oversmooth.simulator.limits import check_elements, check_size
from oversmooth.simulator.validation import as_generator, check_positive_int, regular_file

__all__ = [
    "DATA_DIR",
    "IMAGE_SUFFIXES",
    "bundled_inputs",
    "default_inputs",
    "from_images",
    "from_npz",
    "from_text",
    "load_image",
    "random_draws_token_ids",
    "random_inputs",
    "random_sizes_open_axes",
]

#: Folder of the bundled inputs (images/, sentences.txt, sentences.npz, LICENSE.md).
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
#: File suffixes :func:`from_images` reads.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _maybe_for_graph(inputs: Inputs, expected: Sequence[GraphInput] | None) -> Inputs:
    return inputs if expected is None else for_graph(inputs, expected)


def _check_pixels(dims: tuple[int, int], path: str | os.PathLike[str]) -> None:
    check_elements((*dims, 4), f"image {Path(path).name!r}", error=ImporterInputError)


def _resized(width: int, height: int, size: int, path: str | os.PathLike[str]) -> tuple[int, int]:
    """The size an image of ``width`` x ``height`` is resized to (shorter side ``size``), checked."""
    _check_pixels((width, height), path)  # before decoding: a bomb allocates nothing
    scale = size / min(width, height)
    new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
    check_elements(
        (*new_size, 3),
        f"image {Path(path).name!r} resized to side {size}",
        error=ImporterInputError,
    )
    return new_size


def _check_image_size(size: int) -> int:
    return check_size(
        check_positive_int(size, "image size", error=ImporterInputError),
        "image size",
        "max_image_side",
        error=ImporterInputError,
    )


@contextlib.contextmanager
def _opened(path: str | os.PathLike[str]) -> Iterator[Any]:
    """``PIL.Image.open(path)``; what an unreadable image raises becomes one line naming the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                yield image
    except (
        OSError,
        UnidentifiedImageError,
        ValueError,
        Image.DecompressionBombWarning,
        Image.DecompressionBombError,
    ) as err:
        if isinstance(err, ImporterInputError):
            raise
        raise ImporterInputError(
            f"`images` must be readable image files; cannot read {path}: {one_line(err)}"
        ) from None


def load_image(path: str | os.PathLike[str], size: int) -> NDArray[np.uint8]:
    """Read an image as RGB, resize its shorter side to ``size`` (bicubic) and centre-crop.

    Returns
    -------
    (size, size, 3) uint8 ndarray

    Raises
    ------
    ImporterInputError
        The file cannot be read as an image (the message names the file).
    """
    from PIL import Image

    size = _check_image_size(size)
    with _opened(path) as image:
        width, height = image.size
        new_size = _resized(width, height, size, path)
        rgb = image.convert("RGB")
    resized = rgb.resize(new_size, Image.Resampling.BICUBIC)
    left = (new_size[0] - size) // 2
    top = (new_size[1] - size) // 2
    cropped = resized.crop((left, top, left + size, top + size))
    return np.asarray(cropped, dtype=np.uint8)


def _check_image_header(path: Path, size: int) -> None:
    """Read the image's header only (not its pixels) and check what decoding it would allocate."""
    with _opened(path) as image:
        width, height = image.size
        _resized(width, height, size, path)


def _check_normalisation(mean: Sequence[float], std: Sequence[float]) -> None:
    """Three finite means and three finite positive stds, with every normalised pixel
    ``(x - mean) / std`` (x in [0, 1]) finite in float32."""
    values = np.asarray([*mean, *std], dtype=np.float64)
    if len(mean) != 3 or len(std) != 3 or not np.all(np.isfinite(values)) or min(std) <= 0:
        raise ImporterInputError(
            f"`mean` and `std` must have 3 finite entries each, with std > 0; got {tuple(mean)}, "
            f"{tuple(std)}"
        )
    m, s = values[:3], values[3:]
    with np.errstate(over="ignore"):
        extreme = np.maximum(np.abs(m), np.abs(1.0 - m)) / s
    if np.any(extreme > np.finfo(np.float32).max):
        raise ImporterInputError(
            f"`mean` and `std` must keep the normalised pixels (x - mean) / std finite in float32; "
            f"got {tuple(mean)}, {tuple(std)}"
        )


def _normalise(
    images: NDArray[np.uint8], mean: Sequence[float], std: Sequence[float]
) -> NDArray[np.float32]:
    """(B, H, W, 3) uint8 → (B, 3, H, W) float32, ``(x / 255 - mean) / std`` per channel."""
    _check_normalisation(mean, std)
    scaled = images.astype(np.float32) / np.float32(255.0)
    normalised = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(normalised.transpose(0, 3, 1, 2), dtype=np.float32)


class _ImageReader:
    """Decodes, resizes and normalises the images of items ``[start, stop)`` when asked."""

    def __init__(
        self, files: Sequence[Path], size: int, mean: Sequence[float], std: Sequence[float]
    ) -> None:
        self.files = list(files)
        self.size = size
        self.mean = tuple(mean)
        self.std = tuple(std)
        self.n_items = len(self.files)

    def read(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], None]:
        pixels = [load_image(path, self.size) for path in self.files[start:stop]]
        stacked = np.stack(pixels) if pixels else np.zeros((0, self.size, self.size, 3), np.uint8)
        return {IMAGE_FEED: _normalise(stacked, self.mean, self.std)}, None

    def digest(self) -> str:
        return streamed_digest(lambda start, stop: self.read(start, stop)[0], self.n_items)


def _image_inputs(
    files: Sequence[Path], size: int, mean: Sequence[float], std: Sequence[float], source: str
) -> Inputs:
    """Images read per batch; every file's header is checked now, its pixels decoded when read."""
    size = _check_image_size(size)
    _check_normalisation(mean, std)
    for path in files:
        _check_image_header(path, size)
    reader = _ImageReader(files, size, mean, std)
    return Inputs(reader=reader, labels=tuple(path.name for path in files), source=source)


def _image_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise ImporterInputError(f"`images` must be a folder of images; got {directory}")
    files = sorted(
        path
        for path in directory.iterdir()
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise ImporterInputError(
            f"`images` must contain image files ({', '.join(IMAGE_SUFFIXES)}); got none in "
            f"{directory}"
        )
    return files


#: The image side when neither the caller, the zoo entry nor the graph gives one.
DEFAULT_IMAGE_SIZE = 224


def image_settings(
    graph: Sequence[GraphInput] | None = None,
    entry: ZooModel | None = None,
    *,
    size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> tuple[int, Sequence[float], Sequence[float]]:
    """The side, mean and std for a model's images: each as given, else the zoo entry's, else
    (the side) the graph's fixed image side, else :data:`DEFAULT_IMAGE_SIZE` and ImageNet's."""
    if size is None and entry is not None:
        size = entry.image_size or DEFAULT_IMAGE_SIZE
    if size is None:
        sides = [spec.shape[-1] for spec in graph or () if len(spec.shape) == 4]
        size = sides[0] if sides and isinstance(sides[0], int) else DEFAULT_IMAGE_SIZE
    mean = mean or (entry.mean if entry is not None and entry.mean else None) or IMAGENET_MEAN
    std = std or (entry.std if entry is not None and entry.std else None) or IMAGENET_STD
    return size, mean, std


def from_images(
    directory: str | os.PathLike[str],
    *,
    size: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    graph: Sequence[GraphInput] | None = None,
    entry: ZooModel | None = None,
) -> Inputs:
    """Every image in a folder (sorted by name), as normalised NCHW float32 inputs.

    Each image is converted to RGB, its shorter side resized to ``size`` and centre-cropped
    (:func:`load_image`), then normalised per channel as ``(x / 255 - mean) / std``. Only the files'
    headers are read now; the pixels are decoded batch by batch when the inputs are read, so any
    number of images fits in memory.

    Parameters
    ----------
    directory : path-like
        Folder of ``.png``/``.jpg``/... files.
    size : int, optional
        Output side in pixels (default :func:`image_settings`: the zoo entry's, the graph's
        fixed side, else 224).
    mean, std : sequence of 3 floats, optional
        Per-channel normalisation (default: the zoo entry's, else ImageNet's).
    graph : sequence of GraphInput, optional
        Map and check the feed against these graph inputs.
    entry : ZooModel, optional
        The zoo entry of the model the images are for (its preprocessing).

    Returns
    -------
    Inputs
        Read per batch: ``feeds`` of ``(B, 3, size, size)`` float32; ``labels`` are file names.
    """
    folder = Path(directory)
    size, mean, std = image_settings(graph, entry, size=size, mean=mean, std=std)
    inputs = _image_inputs(_image_files(folder), size, mean, std, f"images:{folder}")
    return _maybe_for_graph(inputs, graph)


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
        file = regular_file(path, "text", error=ImporterInputError)
        check_size(
            file.stat().st_size,
            f"text file {str(path)!r}",
            "max_text_bytes",
            error=ImporterInputError,
        )
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ImporterInputError(
            f"`text` must be a readable UTF-8 text file; cannot read {path}"
        ) from err
    sentences = [line.strip() for line in text.splitlines() if line.strip()]
    if not sentences:
        raise ImporterInputError(
            f"`text` must hold at least one non-empty line; got none in {path}"
        )
    return sentences


def _load_tokenizer(tokenizer_json: Path, max_length: int) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as err:
        raise MissingDependencyError(
            "reading text files needs the `tokenizers` package; install it with "
            "`pip install 'oversmooth[text]'` (or `pip install tokenizers`)"
        ) from err
    file = regular_file(tokenizer_json, "tokenizer", error=ImporterInputError)
    try:
        tokenizer = Tokenizer.from_file(os.fspath(file))
    except Exception as err:  # tokenizers raises its own untyped exceptions
        raise ImporterInputError(
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
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
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
        inputs = inputs.read(0, inputs.batch_size)  # six photographs: held in memory
    else:
        raise ImporterInputError(f"`kind` must be one of text, image; got {kind!r}")
    return _maybe_for_graph(inputs, graph)


def random_sizes_open_axes(graph: Sequence[GraphInput]) -> bool:
    """Whether :func:`random_inputs`' ``seq`` sizes anything: an axis after the first left open."""
    return any(not isinstance(dim, int) for spec in graph for dim in spec.shape[1:])


def random_draws_token_ids(graph: Sequence[GraphInput]) -> bool:
    """Whether :func:`random_inputs`' ``vocab_size`` bounds anything: an input of token ids."""
    return any(_takes_token_ids(spec) for spec in graph)


def _takes_token_ids(spec: GraphInput) -> bool:
    """Integer inputs other than masks, token types and positions get random token ids."""
    lowered = spec.name.lower()
    return spec.dtype.kind in "iu" and not any(
        word in lowered for word in ("mask", "type", "position")
    )


def _random_row(spec: GraphInput, seq: int) -> tuple[int, ...]:
    """One item's shape: fixed axes their size, symbolic ones ``seq`` (axis 0 is the item axis),
    the past axis of a key/value cache 0 (the audit runs the model without a cache)."""
    return tuple(
        0 if axis == spec.past_axis else dim if isinstance(dim, int) else seq
        for axis, dim in enumerate(spec.shape[1:], start=1)
    )


def _random_feed(
    spec: GraphInput, shape: tuple[int, ...], rng: np.random.Generator, vocab_size: int
) -> np.ndarray:
    if _takes_token_ids(spec):
        return rng.integers(0, vocab_size, size=shape).astype(spec.dtype)
    if takes_positions(spec) and shape:
        return np.broadcast_to(np.arange(shape[-1], dtype=spec.dtype), shape).copy()
    if spec.dtype.kind in "iu":  # a mask is ones, token types zeros
        return (np.ones if "mask" in spec.name.lower() else np.zeros)(shape, dtype=spec.dtype)
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if spec.dtype.kind == "b":
        return np.ones(shape, dtype=bool)
    raise FeedError(f"cannot make random data for {spec.describe()}")


class _RandomReader:
    """Draws items ``[start, stop)``: item ``i`` from its own generator, seeded ``(seed, i)``.

    So an item is the same whatever batch it is read in. A feed without axes (no item axis) is
    drawn once, seeded ``(seed,)``.
    """

    def __init__(
        self, graph: Sequence[GraphInput], seed: int, n_items: int, seq: int, vocab_size: int
    ) -> None:
        self.specs = [spec for spec in graph if spec.shape]
        self.rows = {spec.name: _random_row(spec, seq) for spec in self.specs}
        rng = np.random.default_rng((seed,))
        self.scalars = {
            spec.name: _random_feed(spec, (), rng, vocab_size) for spec in graph if not spec.shape
        }
        self.seed = seed
        self.n_items = n_items
        self.vocab_size = vocab_size
        self.mask_name = token_mask_input(self.specs)

    def _item(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng((self.seed, index))
        return {
            spec.name: _random_feed(spec, self.rows[spec.name], rng, self.vocab_size)
            for spec in self.specs
        }

    def read(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        items = [self._item(index) for index in range(start, min(stop, self.n_items))]
        feeds = {
            spec.name: np.stack([item[spec.name] for item in items])
            if items
            else np.zeros((0, *self.rows[spec.name]), spec.dtype)
            for spec in self.specs
        }
        mask = feeds.get(self.mask_name) if self.mask_name else None
        return {**feeds, **self.scalars}, (
            mask.astype(bool) if mask is not None and mask.ndim == 2 else None
        )

    def digest(self) -> str:
        return streamed_digest(lambda start, stop: self.read(start, stop)[0], self.n_items)


def random_inputs(
    graph: Sequence[GraphInput],
    *,
    seed: int = 0,
    batch: int = 2,
    seq: int = RANDOM_SEQ_LEN,
    vocab_size: int = RANDOM_VOCAB_SIZE,
) -> Inputs:
    """``batch`` labelled random items for the graph inputs (``random=True``; not real data).

    Axis 0 is the item axis (a batch size the graph fixes is met by the runner, which fills its
    batches), other symbolic axes get ``seq``, fixed axes their size, and the past axis of a
    key/value cache input 0 (the model without a cache). Integer inputs whose name contains
    ``mask`` are ones, ``type`` zeros, ``position`` the positions 0, 1, ... along their last axis,
    others ids drawn uniformly from ``[0, vocab_size)``; float inputs are standard normal. Item ``i`` is drawn from its own
    generator seeded ``(seed, i)``, when it is read: the same item whatever the batch it is read
    in, and memory does not grow with ``batch``.
    """
    for value, name in ((batch, "batch"), (seq, "seq"), (vocab_size, "vocab_size")):
        check_positive_int(value, name, error=ImporterInputError)
    for value, name in ((batch, "batch"), (seq, "seq")):  # even where the graph fixes the axis
        check_size(value, name, "max_elements", error=ImporterInputError)
    as_generator(seed, error=ImporterInputError)  # checks the seed
    for spec in graph:  # one onnxruntime call: the rows the graph fixes, or one item
        rows = spec.shape[0] if spec.shape and isinstance(spec.shape[0], int) else 1
        row = _random_row(spec, seq) if spec.shape else ()
        check_elements((rows, *row), f"random feed {spec.name!r}", error=ImporterInputError)
    reader = _RandomReader(graph, int(seed), batch, seq, vocab_size)
    return Inputs(
        reader=reader,
        labels=tuple(f"random-{seed}-{index}" for index in range(batch)),
        source="random",
        random=True,
    )


def default_inputs(graph: Sequence[GraphInput], entry: ZooModel | None = None) -> Inputs:
    """The bundled photographs or sentences that suit a model, mapped onto its graph inputs.

    A zoo entry says what the model reads and how to preprocess images; without one, a single
    4-axis float input means images (at the graph's side when it is fixed, else 224), anything else
    text; key/value cache inputs (4-axis float, fed empty) are not images.
    """
    if entry is not None:
        if entry.kind == "image":
            return bundled_inputs(
                "image",
                graph=graph,
                size=entry.image_size or 224,
                mean=entry.mean or IMAGENET_MEAN,
                std=entry.std or IMAGENET_STD,
            )
        return bundled_inputs("text", graph=graph)
    image = [g for g in graph if g.dtype.kind == "f" and len(g.shape) == 4 and g.past_axis is None]
    if image:
        side = image[0].shape[-1]
        return bundled_inputs("image", graph=graph, size=side if isinstance(side, int) else 224)
    return bundled_inputs("text", graph=graph)
