"""``oversmooth audit`` through the dispatcher: the report folder, the summary, and bad input.

Bad input exits 2 with one line on stderr that names the problem (and, for feeds, lists what the
model expects) and leaves no output folder; a well-formed model without attention exits 1.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from oversmooth.cli import main
from oversmooth.importers.graph import load_model
from oversmooth.importers.inputs.feeds import expected_inputs_text
from oversmooth.importers.inputs.sources import bundled_inputs
from tests.importers.builders import assemble
from tests.importers.head_split_blocks import windowed_decoder
from tests.realmodels import require_real_model

SEED = 5
FILES = ("audit.json", "layers.csv", "spectra.csv", "dominance.csv", "report.md")
FIGURES = ("layers.png", "spectra.png", "dominance.png")
_CPU = "CPUExecutionProvider"


def write_builder(folder: Path, name: str) -> Path:
    path = folder / f"{name}.onnx"
    onnx.save(assemble(name, SEED).built.model, path)
    return path


@pytest.fixture
def text_model(tmp_path: Path) -> Path:
    """A small post-LN BERT reading input_ids and attention_mask ([batch, 6] int64)."""
    return write_builder(tmp_path, "bert_legacy")


@pytest.fixture
def feeds_npz(tmp_path: Path) -> Path:
    """Two valid inputs of ``text_model`` (the second one padded) in ``x.npz``."""
    np.savez(tmp_path / "x.npz", **assemble("bert_legacy", SEED).built.inputs)
    return tmp_path / "x.npz"


def cnn_model(path: Path) -> Path:
    """Conv → Relu → GlobalAveragePool: a well-formed model without any attention."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["pixel_values", "w"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["relu"]),
            helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
        ],
        "cnn",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 4, 1, 1])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def run_audit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``oversmooth audit ARGV`` (argparse's refusals included)."""
    try:
        code = main(["audit", *argv, "--no-progress"])
    except SystemExit as exit_:  # argparse exits while reading the command line
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("oversmooth audit: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def assert_no_output(folder: Path, keep: set[str]) -> None:
    """Nothing but the test's own input files in ``folder`` (no report, no staging folder)."""
    assert {path.name for path in folder.iterdir()} == keep


# -- the happy path ---------------------------------------------------------------------------------


@pytest.mark.realmodel
def test_audit_of_minilm_l3_writes_the_report_and_prints_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_real_model("minilm-l3")
    out = tmp_path / "report"
    code, stdout, _ = run_audit(["minilm-l3", "--out", str(out), "--provider", "cpu"], capsys)
    assert code == 0
    names = {path.name for path in out.iterdir()}
    assert set(FILES) | set(FIGURES) <= names
    report = (out / "report.md").read_text(encoding="utf-8")
    for figure in FIGURES:
        assert f"]({figure})" in report
    doc = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    assert doc["n_inputs"] == bundled_inputs("text").batch_size
    assert len(doc["blocks"]) == 3
    assert doc["provider"]["used"] == [_CPU]
    fractions = ("perron", "non_perron", "contracting")
    assert sum(doc["dominance"][name] for name in fractions) == pytest.approx(1.0)
    lines = stdout.splitlines()
    assert lines[0].startswith("model minilm-l3 (3 blocks)")
    table = lines[lines.index("layer  hfc_lfc   cosine  sigma_ratio") + 1 :]
    assert [int(line.split()[0]) for line in table[:4]] == [0, 1, 2, 3]
    assert any(line.startswith("dominating eigenvalue over 432") for line in lines)
    assert lines[-1] == f"report: {out / 'report.md'}"
    assert_no_output(tmp_path, {"report"})


def test_audit_replaces_an_earlier_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_builder(tmp_path, "vit_prenorm_layerscale")
    out = tmp_path / "report"
    digests = []
    for seed in ("1", "2"):
        code, _, _ = run_audit(
            [str(model), "--random", "2", "--seed", seed, "--out", str(out)], capsys
        )
        assert code == 0
        digests.append(json.loads((out / "audit.json").read_text(encoding="utf-8"))["inputs"])
    assert digests[0]["digest"] != digests[1]["digest"]
    assert_no_output(tmp_path, {model.name, "report"})


def test_random_inputs_are_labelled_random(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model = write_builder(tmp_path, "vit_prenorm_layerscale")
    out = tmp_path / "report"
    code, stdout, _ = run_audit([str(model), "--random", "2", "--out", str(out)], capsys)
    assert code == 0
    assert "[RANDOM]" in stdout.splitlines()[0]
    assert "RANDOM" in (out / "report.md").read_text(encoding="utf-8")
    assert json.loads((out / "audit.json").read_text(encoding="utf-8"))["inputs"]["random"]


def test_no_cache_leaves_the_value_spectra_cache_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_builder(tmp_path, "vit_prenorm_layerscale")
    monkeypatch.setenv("OVERSMOOTH_CACHE", str(tmp_path / "cache"))
    argv = [str(model), "--random", "2", "--out", str(tmp_path / "report")]
    assert run_audit([*argv, "--no-cache"], capsys)[0] == 0
    assert not (tmp_path / "cache").exists()
    assert run_audit(argv, capsys)[0] == 0
    assert len(list((tmp_path / "cache" / "audit").glob("value-spectra-*.npz"))) == 1


def test_random_token_ids_stay_below_the_vocab_size(
    text_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The builders' vocabulary is small: ids drawn below the default 1000 would be out of range."""
    out = tmp_path / "report"
    code, _, err = run_audit(
        [
            str(text_model),
            "--random",
            "2",
            "--vocab-size",
            "10",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads((out / "audit.json").read_text(encoding="utf-8"))["n_inputs"] == 2


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        (["--seq-len", "8"], "`--seq-len` sizes the open axes after the first of random inputs"),
        (["--vocab-size", "10"], "`--vocab-size` bounds random token ids; no input"),
    ],
)
def test_a_random_option_the_model_leaves_nothing_to_set_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str], fragment: str
) -> None:
    """The ViT builder reads float embeddings [batch, 5, 24]: no open axis, no token ids."""
    model = write_builder(tmp_path, "vit_prenorm_layerscale")
    argv = [str(model), "--random", "2", *option, "--out", str(tmp_path / "report")]
    code, _, err = run_audit(argv, capsys)
    assert code == 2
    assert_one_line_error(err, fragment, "embeddings: float32 [batch, 5, 24]")
    assert_no_output(tmp_path, {model.name})


def test_npz_inputs_and_cpu_provider_are_recorded(
    tmp_path: Path, text_model: Path, feeds_npz: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    argv = [str(text_model), "--inputs", str(feeds_npz), "--provider", "cpu"]
    code, _, _ = run_audit([*argv, "--out", str(out), "--exclude-prefix"], capsys)
    assert code == 0
    doc = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    assert doc["provider"]["used"] == [_CPU]
    assert doc["provider"]["requested"] == "cpu"
    assert doc["n_inputs"] == 2
    assert doc["inputs"]["source"].startswith("npz:")
    assert doc["config"]["exclude_prefix"] == 1


def test_a_block_attending_in_windows_is_skipped_by_design(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The middle of three blocks folds 4 windows into its Softmax's leading axis: windowed
    attention is outside the theory, so without ``--partial`` the two blocks around it are
    audited (no window is ever read as an input), and the summary, ``audit.json`` and
    ``report.md`` name the skipped block and why; layer 1 is block 0's output, the windowed
    layer after it outside every layer (noted)."""
    model = tmp_path / "windows.onnx"
    onnx.save(windowed_decoder(), model)
    out = tmp_path / "report"
    code, summary, err = run_audit([str(model), "--random", "2", "--out", str(out)], capsys)
    assert code == 0, err
    doc = json.loads((out / "audit.json").read_text(encoding="utf-8"))
    assert len(doc["blocks"]) == 2
    (skipped,) = doc["skipped"]
    assert skipped["code"] == "windowed_attention"
    assert "within 4 windows of 4 tokens" in skipped["reason"]
    assert doc["notes"][0].startswith("SKIPPED by design: 1 of 3 attention blocks")
    assert any("outside every layer" in note for note in doc["notes"])
    assert not any(note.startswith("PARTIAL") for note in doc["notes"])
    report = (out / "report.md").read_text(encoding="utf-8")
    assert skipped["softmax"] in report.splitlines()[2]
    assert summary.startswith("SKIPPED by design")
    assert skipped["softmax"] in summary.splitlines()[0]
    with (out / "dominance.csv").open(encoding="utf-8", newline="") as handle:
        assert {row["block"] for row in csv.DictReader(handle)} == {"0", "1"}


# -- bad input ---------------------------------------------------------------------------------------


def _feeds_missing_the_mask(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"input_ids": feeds["input_ids"]}


def _feeds_too_short(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value[:, :-1] for name, value in feeds.items()}


def _feeds_int32(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: value.astype(np.int32) for name, value in feeds.items()}


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (_feeds_missing_the_mask, "missing feed(s) attention_mask"),
        (_feeds_too_short, "axis 1 must be 6"),
        (_feeds_int32, "must be int64; got int32"),
    ],
)
def test_npz_that_does_not_fit_the_model_lists_what_it_expects(
    tmp_path: Path, text_model: Path, capsys: pytest.CaptureFixture[str], make, problem: str
) -> None:
    np.savez(tmp_path / "x.npz", **make(assemble("bert_legacy", SEED).built.inputs))
    out = tmp_path / "report"
    code, stdout, err = run_audit(
        [str(text_model), "--inputs", str(tmp_path / "x.npz"), "--out", str(out)], capsys
    )
    assert code == 2
    assert stdout == ""
    assert_one_line_error(err, problem, expected_inputs_text(load_model(text_model).inputs))
    assert_no_output(tmp_path, {text_model.name, "x.npz"})


def test_an_unreadable_image_is_named(
    tmp_path: Path, text_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(images / "good.png")
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n but not an image")
    code, _, err = run_audit(
        [str(text_model), "--images", str(images), "--out", str(tmp_path / "report")], capsys
    )
    assert code == 2
    assert_one_line_error(err, "broken.png")
    assert_no_output(tmp_path, {text_model.name, "images"})


def test_a_file_that_is_not_onnx_gets_the_importers_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "notes.onnx"
    model.write_text("these are notes, not a model\n", encoding="utf-8")
    code, _, err = run_audit([str(model), "--out", str(tmp_path / "report")], capsys)
    assert code == 2
    assert_one_line_error(err, "notes.onnx", "does not parse")
    assert_no_output(tmp_path, {model.name})


def test_a_missing_model_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_audit(
        [str(tmp_path / "absent.onnx"), "--out", str(tmp_path / "report")], capsys
    )
    assert code == 2
    assert_one_line_error(err, "absent.onnx")
    assert_no_output(tmp_path, set())


@pytest.mark.parametrize("source", [[], ["--random", "2"]])
def test_a_model_without_attention_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: list[str]
) -> None:
    model = cnn_model(tmp_path / "cnn.onnx")
    code, _, err = run_audit([str(model), *source, "--out", str(tmp_path / "report")], capsys)
    assert code == 1
    assert_one_line_error(err, "no attention block")
    assert_no_output(tmp_path, {model.name})


def _cuda_runs(model: Path) -> bool:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    providers = ["CUDAExecutionProvider", _CPU]
    session = ort.InferenceSession(os.fspath(model), options, providers=providers)
    return session.get_providers()[0] == "CUDAExecutionProvider"


def test_provider_cuda_without_a_usable_gpu_is_bad_input(
    tmp_path: Path, text_model: Path, feeds_npz: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if _cuda_runs(text_model):
        pytest.skip("CUDA works on this machine; the refusal cannot be observed")
    argv = [str(text_model), "--inputs", str(feeds_npz), "--provider", "cuda"]
    code, _, err = run_audit([*argv, "--out", str(tmp_path / "report")], capsys)
    assert code == 2
    assert_one_line_error(err, "`provider` cuda")
    assert_no_output(tmp_path, {text_model.name, feeds_npz.name})


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--exclude-prefix", "-3"], "`exclude_prefix`"),
        (
            ["--exclude-prefix", "1000"],
            "input 'item-0' keeps 0 token(s) for the metrics once padding and the `exclude_prefix`",
        ),
        (["--text", "sentences.txt"], "--tokenizer"),
        (["--h", "folded"], "argument --h: invalid choice"),
        (["--dominance-inputs", "0"], "must be a positive integer, 'all' or 'auto'"),
        (["--operator-inputs", "3", "--dominance", "none"], "`--operator-inputs` applies to the"),
        (["--spectral-hfc", "--no-spectral"], "`spectral_norm` needs the Gram matrices"),
    ],
)
def test_bad_options_are_named(
    tmp_path: Path,
    text_model: Path,
    feeds_npz: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    fragment: str,
) -> None:
    inputs = [] if "--text" in argv else ["--inputs", str(feeds_npz)]
    code, _, err = run_audit(
        [str(text_model), *inputs, *argv, "--out", str(tmp_path / "report")], capsys
    )
    assert code == 2
    assert_one_line_error(err, fragment)
    assert_no_output(tmp_path, {text_model.name, feeds_npz.name})


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a model or starting a cluster fails the test: options are checked before both."""

    def started(*_: object, **__: object) -> None:
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr("oversmooth.importers.graph.load_model", started)
    monkeypatch.setattr("oversmooth.executor.open_executor", started)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        # counts below 1, refused while argparse reads them
        (["--batch-size", "0"], "argument --batch-size: must be a positive integer; got '0'"),
        (["--threads", "0"], "argument --threads"),
        (["--threads", "-2", "--scheduler", "local"], "argument --threads"),
        (["--batch-size", "0", "--scheduler", "local"], "argument --batch-size"),
        (["--workers", "0", "--scheduler", "local"], "argument --workers"),
        (["--random", "0"], "argument --random"),
        (["--random", "2", "--seq-len", "0"], "argument --seq-len"),
        (["--random", "2", "--vocab-size", "-1"], "argument --vocab-size"),
        (["--image-size", "0"], "argument --image-size"),
        (["--image-size", "x"], "argument --image-size: must be a positive integer; got 'x'"),
        # an option of another input source: ignoring it would audit other inputs than asked for
        (["--image-size", "64"], "`--image-size` applies to `--images` inputs; got no `--images`"),
        (["--mean", "0.5", "0.5", "0.5"], "`--mean` applies to `--images`"),
        (["--random", "2", "--std", "1", "1", "1"], "`--std` applies to `--images`"),
        (["--seq-len", "8"], "`--seq-len` applies to `--random`"),
        (["--vocab-size", "40"], "`--vocab-size` applies to `--random`"),
        (["--seed", "3"], "`--seed` applies to `--random`"),
        (["--random", "2", "--tokenizer", "tok.json"], "`--tokenizer` applies to `--text`"),
    ],
)
def test_bad_options_are_refused_before_any_work(
    tmp_path: Path,
    text_model: Path,
    capsys: pytest.CaptureFixture[str],
    no_work: None,
    argv: list[str],
    fragment: str,
) -> None:
    """Refused naming the option, before a model is read or a cluster started."""
    code, _, err = run_audit([str(text_model), *argv, "--out", str(tmp_path / "report")], capsys)
    assert code == 2
    assert_one_line_error(err, fragment)
    assert_no_output(tmp_path, {text_model.name})


def test_audit_refuses_a_foreign_folder_unless_forced(text_model, tmp_path, capsys):
    folder = tmp_path / "thesis"
    folder.mkdir()
    (folder / "chapter.tex").write_text("precious", encoding="utf-8")
    argv = ["audit", str(text_model), "--random", "1", "--vocab-size", "40", "--out", str(folder)]
    assert main([*argv, "--no-progress"]) == 2
    assert "not an earlier output" in capsys.readouterr().err
    assert [p.name for p in folder.iterdir()] == ["chapter.tex"]
    assert main([*argv, "--no-progress", "--force"]) == 0
    assert (folder / "audit.json").is_file()
    assert not (folder / "chapter.tex").exists()
