"""Fig. 3 (:mod:`oversmooth.figures.fig3_reparam`): its variants and its plot, on made-up rows
(the audits themselves run in the quick run of ``test_figures.py``)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from oversmooth.figures import _models, fig3_reparam
from oversmooth.figures.audit_report import LAYER_PANELS


def test_the_keys_are_every_model_as_trained_and_reparameterised() -> None:
    assert len(fig3_reparam.KEYS) == len(fig3_reparam.MODELS) * len(fig3_reparam.TRANSFORMS)
    for key in fig3_reparam.KEYS:
        variant = _models.VARIANTS[key]
        assert variant.model in fig3_reparam.MODELS
        assert variant.transform in fig3_reparam.TRANSFORMS
    assert fig3_reparam.COLUMNS == _models.SMOOTHING_COLUMNS


def test_each_model_gets_a_row_of_panels_with_its_three_variants() -> None:
    # the mean tells the variant: its index in KEYS plus the layer
    rows = [
        {
            "model": _models.VARIANTS[key].model,
            "transform": _models.VARIANTS[key].transform,
            "layer": layer,
            "metric": metric,
            "mean": k + layer,
            "std": 0.1,
        }
        for k, key in enumerate(fig3_reparam.KEYS)
        for layer in range(3)
        for metric, _, _ in LAYER_PANELS
    ]
    fig = fig3_reparam.plot(rows)
    try:
        assert len(fig.axes) == len(fig3_reparam.MODELS) * len(LAYER_PANELS)
        for i, ax in enumerate(fig.axes):
            model = fig3_reparam.MODELS[i // len(LAYER_PANELS)]
            keys = [k for k in fig3_reparam.KEYS if _models.VARIANTS[k].model == model]
            lines = ax.get_lines()
            assert [line.get_label() for line in lines] == [_models.VARIANTS[k].label for k in keys]
            for key, line in zip(keys, lines, strict=True):
                k = fig3_reparam.KEYS.index(key)
                assert list(line.get_ydata()) == [k, k + 1, k + 2]
    finally:
        plt.close(fig)
