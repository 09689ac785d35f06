"""Non-finite values never reach LAPACK: each is refused in one line naming where it came from.

Non-finite inputs (NaN or infinite feeds, a ``--mean``/``--std`` that is not finite or overflows the
normalised pixels) are bad input (exit 2), named by feed and input; non-finite weights (a NaN γ, a
W_Q of inf) are a bad model file (exit 2), named by block and weight, before any eigensolver;
finite inputs that the model itself turns non-finite (a W_V near float32's maximum) exit 1,
naming the input and the first layer that went non-finite. Before these checks each case ended
in ``LinAlgError: Eigenvalues did not converge`` (a traceback) or, for ``--std inf``, in a report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from oversmooth.cli import main
from oversmooth.importers.errors import ExtractionError
from oversmooth.importers.graph import load_model, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.value_spectra import block_spectra
from oversmooth.importers.weights import extract
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.theory import value_spectrum
from tests.importers.builders import assemble, poisoned
from tests.importers.family_corpus import fixture_bytes

SEED = 3
VIT = "vit_prenorm_layerscale"
F32_MAX = float(np.finfo(np.float32).max)


def _model(folder: Path, proto: onnx.ModelProto, name: str = "model.onnx") -> Path:
    onnx.save(proto, folder / name)
    return folder / name


def _embeddings(value: float, item: int = 1, **extra: np.ndarray) -> Callable[[Path], list[str]]:
    """``audit`` of the ViT builder on an .npz whose item ``item`` holds one ``value``."""

    def build(folder: Path) -> list[str]:
        feeds = assemble(VIT, SEED).built.inputs["embeddings"].copy()
        feeds[item, 2, 3] = value
        np.savez(folder / "x.npz", embeddings=feeds, **extra)
        model = _model(folder, assemble(VIT, SEED).built.model)
        return ["audit", str(model), "--inputs", str(folder / "x.npz")]

    return build


def _images(*options: str) -> Callable[[Path], list[str]]:
    """``audit`` of the ViT image fixture on one picture, with ``options``."""

    def build(folder: Path) -> list[str]:
        (folder / "img").mkdir()
        Image.new("RGB", (32, 32), (10, 200, 30)).save(folder / "img" / "a.png")
        (folder / "vit.onnx").write_bytes(fixture_bytes("vit/legacy_eager.onnx.xz"))
        return ["audit", str(folder / "vit.onnx"), "--images", str(folder / "img"), *options]

    return build


def _poisoned(command: str, tensor: str, value: float, *options: str, count: int = 1):
    def build(folder: Path) -> list[str]:
        model = _model(folder, poisoned(VIT, SEED, tensor, value, count=count))
        extra = ["--random", "2"] if command == "audit" else []
        return [command, str(model), *extra, *options]

    return build


OUT = {"audit": "report", "weights": "w.npz", "spectra": "s.csv", "transform": "t.onnx"}
#: id -> (argv builder, exit status, fragments of the one line).
CASES: dict[str, tuple[Callable[[Path], list[str]], int, tuple[str, ...]]] = {
    "npz-nan": (_embeddings(np.nan), 2, ("feed 'embeddings'", "'item-1' (item 1)", "NaN")),
    "npz-inf": (_embeddings(np.inf, item=0), 2, ("feed 'embeddings'", "(item 0)", "inf")),
    "npz-nan-labelled": (
        _embeddings(-np.inf, labels=np.array(["cat", "dog"])),
        2,
        ("input 'dog' (item 1)",),
    ),
    "std-inf": (_images("--std", "inf", "inf", "inf"), 2, ("`std`", "finite")),
    "std-nan": (_images("--std", "nan", "1", "1"), 2, ("`std`", "finite")),
    "mean-nan": (_images("--mean", "nan", "1", "1"), 2, ("`mean`", "finite")),
    "pixels-overflow": (
        _images("--mean", "1e38", "1", "1", "--std", "1e-38", "1", "1"),
        2,
        ("finite in float32",),
    ),
    "audit-gamma-nan": (
        _poisoned("audit", "encoder.layer.1.norm1.weight", np.nan),
        2,
        ("block 1's gamma", "'encoder.layer.1.norm1.weight'", "NaN"),
    ),
    "audit-wq-inf": (_poisoned("audit", "0.q", np.inf, count=-1), 2, ("block 0's W_Q", "+inf")),
    "weights-gamma-nan": (
        _poisoned("weights", "encoder.layer.0.norm1.weight", np.nan),
        2,
        ("block 0's gamma",),
    ),
    "spectra-wq-inf": (_poisoned("spectra", "1.q", np.inf), 2, ("block 1's W_Q",)),
    "transform-wo-minus-inf": (
        _poisoned("transform", "0.o", -np.inf, "--reparam", "minus", count=-1),
        2,
        ("block 0's W_O", "-inf"),
    ),
    "transform-gamma-too-small-to-absorb": (
        _poisoned("transform", "encoder.layer.0.norm1.weight", 1e-40, "--reparam", "minus"),
        2,
        ("block 0's reparameterised W_V", "would not be finite in float32"),
    ),
    "audit-wv-near-float32-max": (
        _poisoned("audit", "0.v", F32_MAX / 2, count=-1),
        1,
        ("from finite input 'random-0-0' (item 0)", "first at", "block 0"),
    ),
    "audit-wv-near-float32-max-no-dominance": (
        _poisoned("audit", "0.v", F32_MAX / 2, "--dominance", "none", count=-1),
        1,
        ("from finite input", "block 0"),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_non_finite_values_are_one_line_naming_their_source(tmp_path, capsys, name) -> None:
    build, status, fragments = CASES[name]
    argv = build(tmp_path)
    out = tmp_path / OUT[argv[0]]
    code = main([*argv, "--out", str(out), *(["--no-progress"] if argv[0] == "audit" else [])])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == status, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert "Warning" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not out.exists()


def test_a_value_product_that_overflows_float64_never_reaches_eig() -> None:
    with pytest.raises(InputError, match="overflows") as info:
        value_spectrum(np.full((4, 2), 1e200), np.full((2, 4), 1e200))
    assert "\n" not in str(info.value)
    block = extract(model_from_proto(assemble(VIT, SEED).built.model))[1]
    huge = replace(block, W_V=np.full_like(block.W_V, 1e200), W_O=np.full_like(block.W_O, 1e200))
    with pytest.raises(ExtractionError, match=r"block 1's value product: .*overflows"):
        block_spectra(huge)


def test_attention_is_checked_on_the_real_tokens_only() -> None:
    from oversmooth.importers.audit.dominance import nonfinite_attention

    probs = np.full((2, 3, 4, 4), 0.25, np.float32)
    mask = np.ones((2, 4), dtype=bool)
    mask[1, 3] = False
    inputs = Inputs(
        feeds={"ids": np.zeros((2, 4), np.int64)}, token_mask=mask, labels=("a", "b"), source="t"
    )
    probs[1, 0, 3, :] = np.nan  # a padding row: never read
    assert not nonfinite_attention(probs, "p", 3, inputs).any()
    probs[1, 2, 0, 1] = np.inf
    assert nonfinite_attention(probs, "p", 3, inputs).tolist() == [False, True]
    probs[0, 0, 0, 0] = np.nan
    assert nonfinite_attention(probs, "p", 3, inputs).tolist() == [True, True]


@pytest.mark.parametrize("masked", [False, True])
def test_half_precision_attention_is_summed_without_overflowing(masked: bool) -> None:
    """The check sums in float32 at least: 90,000 float16 ones (a sum past float16's 65,504) are
    finite, and a -inf among them is still found."""
    from oversmooth.importers.audit.dominance import nonfinite_attention

    probs = np.ones((1, 1, 300, 300), np.float16)
    mask = np.arange(300)[None] < 299 if masked else None  # one padding token: item by item
    inputs = Inputs(
        feeds={"ids": np.zeros((1, 300), np.int64)}, token_mask=mask, labels=("a",), source="t"
    )
    assert not nonfinite_attention(probs, "p", 1, inputs).any()
    probs[0, 0, 7, 9] = -np.inf
    assert nonfinite_attention(probs, "p", 1, inputs).tolist() == [True]


def test_load_model_keeps_finite_weights_unchanged(tmp_path) -> None:
    """The weight check refuses only non-finite entries: a W_V near float32's maximum is read."""
    path = _model(tmp_path, poisoned(VIT, SEED, "0.v", F32_MAX / 2, count=-1))
    blocks = extract(load_model(path))
    assert np.all(blocks[0].W_V == np.float32(F32_MAX / 2))
