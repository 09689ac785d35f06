"""The figures' audited variants (:mod:`oversmooth.figures._models`): the variant table, row
selection and the bootstrap intervals of the perron share, on hand-made audits (the audits of the
zoo models themselves run in the quick run of ``test_figures.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from oversmooth.figures._models import VARIANTS, Audited, perron_intervals, rows_of
from oversmooth.importers.zoo import get_model


def test_each_key_names_its_model_and_transform() -> None:
    for key, variant in VARIANTS.items():
        assert variant.key == key
        trained = variant.transform == "trained"
        assert key == (variant.model if trained else f"{variant.model}:{variant.transform}")
    # the int8 model cannot be rewritten, so it is only there as trained
    assert [v.transform for v in VARIANTS.values() if v.model == "minilm-l6-int8"] == ["trained"]


@pytest.mark.parametrize(
    ("key", "modality"), [("dinov2-vits14:plus", "vision"), ("minilm-l3:minus", "language")]
)
def test_the_modality_follows_the_zoo_models_kind(key: str, modality: str) -> None:
    variant = VARIANTS[key]
    assert variant.modality == modality
    assert get_model(variant.model).kind == ("image" if modality == "vision" else "text")


def test_rows_of_keeps_the_rows_matching_every_column_given() -> None:
    rows = [
        {"model": "a", "transform": "plus", "layer": 0},
        {"model": "a", "transform": "minus", "layer": 0},
        {"model": "b", "transform": "plus", "layer": 1},
    ]
    assert rows_of(rows, model="a") == rows[:2]
    assert rows_of(rows, model="a", transform="plus") == rows[:1]
    assert rows_of(rows, transform="plus", layer=1) == rows[2:]
    assert rows_of(rows, model="c") == []
    assert rows_of(rows) == rows


def _audited(cases: list[tuple[int, int, int]], n_inputs: int) -> Audited:
    return Audited(
        variant=VARIANTS["minilm-l3"],
        layer_rows=[],
        dominance=None,  # type: ignore[arg-type]  # not read by perron_intervals
        spectra=[],
        provenance={"inputs": {"n_inputs": n_inputs}},
        cases=np.array(cases, dtype=np.int64).reshape(-1, 3),
        frozen=np.empty((0, 4), dtype=np.int64),
    )


def test_perron_intervals_are_points_where_every_input_has_the_same_share() -> None:
    # block 0 always perron, block 1 never: every input's overall share is 1/2
    cases = [(i, b, int(b == 0)) for i in range(3) for b in (0, 1)]
    found = perron_intervals(_audited(cases, 3), resamples=200, seed=0)
    assert found == {"all": (0.5, 0.5), "0": (1.0, 1.0), "1": (0.0, 0.0)}


def test_perron_intervals_resample_inputs_not_cases() -> None:
    # input 0: all 4 blocks perron; input 1: none. Resampling inputs gives shares 0, 1/2 or 1,
    # whatever the cases per input; a wide interval inside [0, 1] around the point share 1/2.
    cases = [(i, b, int(i == 0)) for i in range(2) for b in range(4)]
    found = perron_intervals(_audited(cases, 2), resamples=400, seed=1, level=0.9)
    low, high = found["all"]
    assert low == 0.0
    assert high == 1.0
    for block in "0123":
        assert found[block] == (0.0, 1.0)
    # the same seed gives the same intervals
    assert perron_intervals(_audited(cases, 2), resamples=400, seed=1, level=0.9) == found
