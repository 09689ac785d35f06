"""Quick training runs: determinism, the signs training keeps, the record, the ONNX export."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="needs the train extra: pip install 'oversmooth[train]'"
)
pytest.importorskip("sklearn", reason="needs the train extra: pip install 'oversmooth[train]'")

from oversmooth.simulator.errors import InputError  # noqa: E402
from oversmooth.training.corruptions import CORRUPTIONS, SEVERITIES  # noqa: E402
from oversmooth.training.data import load_digits_split, stratified_fraction  # noqa: E402
from oversmooth.training.model import ViTConfig  # noqa: E402
from oversmooth.training.train import (  # noqa: E402
    QUICK_MODEL,
    QUICK_TRAIN,
    head_spectra,
    random_shifts,
    train_run,
)

torch.set_num_threads(1)
#: Two epochs on a fifth of the digits: enough steps to move every weight, about a second.
FAST = replace(QUICK_TRAIN, epochs=2)


@pytest.fixture(scope="module")
def digits():
    return stratified_fraction(load_digits_split(), 0.2, seed=0)


@pytest.fixture(scope="module")
def trained(digits):
    return {
        variant: train_run(digits, replace(QUICK_MODEL, variant=variant), FAST)
        for variant in ("standard", "plus", "minus")
    }


def test_one_seed_gives_identical_runs(digits, trained):
    again = train_run(digits, replace(QUICK_MODEL, variant="plus"), FAST)
    first = trained["plus"]
    assert again.record.epoch_loss == first.record.epoch_loss
    assert again.record.clean_accuracy == first.record.clean_accuracy
    assert again.record.corrupted == first.record.corrupted
    state = first.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in again.model.state_dict().items())
    other = train_run(digits, replace(QUICK_MODEL, variant="plus"), replace(FAST, seed=1))
    assert other.record.epoch_loss != first.record.epoch_loss


@pytest.mark.parametrize(("variant", "sign"), [("plus", 1.0), ("minus", -1.0)])
def test_trained_heads_keep_their_sign(trained, variant, sign):
    """After training, every ⁺ head's W_V^h W_O^h has strictly positive eigenvalues, every ⁻ head's
    strictly negative ones, all real; training moved ψ away from its start."""
    model = trained[variant].model
    spectra = head_spectra(model)
    assert np.all(sign * spectra["stored"].real > 1e-6)
    assert np.max(np.abs(spectra["stored"].imag)) < 1e-6
    psi = torch.cat([a.psi.detach().flatten() for a in model.attentions()])
    assert not torch.allclose(psi, torch.full_like(psi, QUICK_MODEL.psi_init))
    assert trained[variant].record.spectra["stored"][
        "positive" if sign > 0 else "negative"
    ] == pytest.approx(1.0)


def test_the_standard_model_has_no_sign(trained):
    stored = head_spectra(trained["standard"].model)["stored"].real
    assert np.any(stored > 0)
    assert np.any(stored < 0)


def test_the_record_holds_every_measurement(trained, digits):
    record = trained["minus"].record
    assert record.variant == "minus"
    assert record.n_train == digits.y_train.size
    assert set(record.corrupted) == {f"{c}:{s}" for c in CORRUPTIONS for s in SEVERITIES}
    assert len(record.epoch_loss) == FAST.epochs
    assert record.seconds > 0
    assert 0.0 <= record.clean_accuracy <= 1.0
    assert record.model["variant"] == "minus"
    assert record.train["epochs"] == FAST.epochs


def test_a_model_that_does_not_fit_the_data_is_refused(digits):
    with pytest.raises(InputError, match="expects"):
        train_run(digits, ViTConfig(image_size=(6, 6), patch=2), FAST)
    with pytest.raises(InputError, match="patch"):
        ViTConfig(patch=3)
    with pytest.raises(InputError, match="variant"):
        ViTConfig(variant="sideways")


def test_a_post_ln_model_has_its_stored_product_as_effective_h(digits):
    """Post-LN: no norm inside the branch, so the effective H is W_V^h W_O^h itself."""
    run = train_run(digits, replace(QUICK_MODEL, variant="minus", norm="post", depth=1), FAST)
    spectra = head_spectra(run.model)
    np.testing.assert_array_equal(spectra["effective"], spectra["stored"])
    assert np.all(spectra["stored"].real < 0)


def test_shifts_translate_each_image_by_at_most_the_shift():
    images = torch.arange(3 * 2 * 5 * 5, dtype=torch.float32).reshape(3, 2, 5, 5) + 1
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(random_shifts(images, 0, generator), images)
    moved = random_shifts(images, 1, generator)
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1))
    for index in range(3):
        windows = [padded[index, :, dy : dy + 5, dx : dx + 5] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(moved[index], window) for window in windows)
    assert not all(torch.equal(moved[i], images[i]) for i in range(3))
