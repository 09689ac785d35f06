"""A trained ⁺/⁻ ViT exported to ONNX is what the project's importer reads: one attention block
per layer, and the per-head value spectra it audits have the signs the parametrisation chose."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="needs the train extra: pip install 'oversmooth[train]'"
)
pytest.importorskip("sklearn", reason="needs the train extra: pip install 'oversmooth[train]'")

from oversmooth.importers.graph import load_model  # noqa: E402
from oversmooth.importers.match import find_attention_blocks  # noqa: E402
from oversmooth.importers.value_spectra import blocks_spectra  # noqa: E402
from oversmooth.importers.weights import extract  # noqa: E402
from oversmooth.training.data import load_digits_split, stratified_fraction  # noqa: E402
from oversmooth.training.export import export_onnx  # noqa: E402
from oversmooth.training.train import QUICK_MODEL, QUICK_TRAIN, head_spectra, train_run  # noqa: E402

torch.set_num_threads(1)
DEPTH = 3


@pytest.fixture(scope="module", params=[("plus", 1.0), ("minus", -1.0)], ids=["plus", "minus"])
def exported(request, tmp_path_factory):
    variant, sign = request.param
    data = stratified_fraction(load_digits_split(), 0.2, seed=0)
    run = train_run(
        data, replace(QUICK_MODEL, variant=variant, depth=DEPTH), replace(QUICK_TRAIN, epochs=2)
    )
    path = export_onnx(run.model, tmp_path_factory.mktemp("onnx") / f"{variant}.onnx")
    return run, path, sign


def test_the_matcher_finds_one_block_per_layer(exported):
    _run, path, _ = exported
    report = find_attention_blocks(load_model(path))
    assert len(report.blocks) == DEPTH
    assert not report.failures
    assert all(b.n_heads == QUICK_MODEL.heads for b in report.blocks)


def test_onnxruntime_gives_the_model_s_logits(exported):
    import onnxruntime as ort

    run, path, _ = exported
    images = np.random.default_rng(0).uniform(size=(3, 1, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": images})
    with torch.no_grad():
        expected = run.model(torch.as_tensor(images)).numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_audited_head_spectra_have_the_chosen_sign(exported):
    """Stored W_V^h W_O^h: the sign holds exactly (by construction). Effective C diag(γ) W_V^h W_O^h:
    the sign is guaranteed only for a uniform γ (docs/theory.md); here, after short training, γ is
    near 𝟙 and the audited effective spectra keep it too, and equal the training library's own."""
    run, path, sign = exported
    spectra = blocks_spectra(extract(load_model(path)))
    ours = head_spectra(run.model)
    for index, block in enumerate(spectra):
        assert np.all(sign * block.head.real > 1e-6)
        assert np.all(sign * block.head_effective.real > 0)
        audited = np.sort_complex(np.asarray(block.head_effective).ravel())
        mine = np.sort_complex(ours["effective"][index].ravel())
        np.testing.assert_allclose(audited, mine, atol=1e-4)


def test_oversmooth_audit_reads_the_export(exported, tmp_path):
    """The whole audit on real digits: a ⁺ model is Perron-type (smoothing) in every (input,
    block, head) case, a ⁻ model in none (its heads' ranges contract: §6.10)."""
    import json

    from oversmooth.cli import main

    _run, path, sign = exported
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, images=load_digits_split().x_test[:4].astype(np.float32))
    out = tmp_path / "audit"
    assert (
        main(["audit", str(path), "--inputs", str(feeds), "--out", str(out), "--no-progress"]) == 0
    )
    dominance = json.loads((out / "audit.json").read_text(encoding="utf-8"))["dominance"]
    assert dominance["cases"] == 4 * DEPTH * QUICK_MODEL.heads
    assert dominance["perron"] == (1.0 if sign > 0 else 0.0)
