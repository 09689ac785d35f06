"""The sweep's pure part: reading and checking a specification, its cells, one cell's row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.sweep import SWEEP_COLUMNS, Cell, evaluate_cell, load_spec, parse_spec

BASE = {"n": 6, "d": 3, "layers": 20}


def test_cells_are_the_product_of_the_axes_with_the_seed_fastest() -> None:
    spec = parse_spec(
        {
            **BASE,
            "n": [4, 6],
            "rules": [{"rule": "linear"}, {"rule": "neutreno", "lam": [0.4, 0.8]}],
            "seeds": 2,
        }
    )
    cells = spec.cells()
    assert spec.n_cells == len(cells) == 2 * 3 * 2
    assert [cell.index for cell in cells] == list(range(12))
    assert [cell.seed for cell in cells[:4]] == [0, 1, 0, 1]
    assert [(cell.rule, cell.params) for cell in cells[:6:2]] == [
        ("linear", ()),
        ("neutreno", (("lam", 0.4),)),
        ("neutreno", (("lam", 0.8),)),
    ]
    assert {cell.n for cell in cells[:6]} == {4}
    assert {cell.n for cell in cells[6:]} == {6}


def test_a_list_of_numbers_is_one_pair_and_a_list_of_lists_a_grid() -> None:
    one = parse_spec({**BASE, "rules": [{"rule": "resformer", "weights": [0.5, 0.5]}]})
    two = parse_spec(
        {**BASE, "rules": [{"rule": "resformer", "weights": [[0.5, 0.5], [0.2, 0.8]]}]}
    )
    assert one.rules == (("resformer", (("weights", (0.5, 0.5)),)),)
    assert [params for _, params in two.rules] == [
        (("weights", (0.5, 0.5)),),
        (("weights", (0.2, 0.8)),),
    ]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ([1, 2], "must be an object"),
        ({**BASE, "depth": 3}, "'depth'"),
        ({"n": 4}, "'layers'"),
        ({**BASE, "n": 1}, "'n'"),
        ({**BASE, "n": "8"}, "'n'"),
        ({**BASE, "d": True}, "'d'"),
        ({**BASE, "n": []}, "at least one value"),
        ({**BASE, "layers": 0}, "'layers'"),
        ({**BASE, "seeds": -1}, "'seeds'"),
        ({**BASE, "seeds": [0, -2]}, "'seeds'"),
        ({**BASE, "a_kind": "circulant"}, "'a_kind'"),
        ({**BASE, "h_spectrum": "uniform:2:1"}, "h_spectrum"),
        ({**BASE, "h_spectrum": 3}, "'h_spectrum'"),
        ({**BASE, "scale": float("inf")}, "'scale'"),
        ({**BASE, "gamma": ["minus"]}, "'gamma'"),
        ({**BASE, "rules": ["linear"]}, "rules[0]"),
        ({**BASE, "rules": [{"rule": "transformer"}]}, "rules[0] 'rule'"),
        ({**BASE, "rules": [{"rule": "linear", "lam": 1}]}, "'lam'"),
        ({**BASE, "rules": [{"rule": "neutreno", "lam": "big"}]}, "'lam'"),
        ({**BASE, "rules": [{"rule": "featscale", "code_faithful": 1}]}, "'code_faithful'"),
        ({**BASE, "rules": [{"rule": "resformer", "weights": [1, 2, 3]}]}, "weights"),
    ],
)
def test_a_bad_spec_is_refused_naming_what_is_wrong(spec: object, fragment: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_spec(spec)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message


def test_a_grid_beyond_the_cell_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERSMOOTH_MAX_SWEEP_CELLS", "3")
    parse_spec({**BASE, "seeds": 3})
    with pytest.raises(InputError, match="OVERSMOOTH_MAX_SWEEP_CELLS"):
        parse_spec({**BASE, "seeds": 4})


def test_json_and_toml_files_give_the_same_spec(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(
        json.dumps({**BASE, "gamma": [1, -1], "rules": [{"rule": "pre-ln", "eps": 1e-5}]})
    )
    (tmp_path / "s.toml").write_text(
        'n = 6\nd = 3\nlayers = 20\ngamma = [1, -1]\n[[rules]]\nrule = "pre-ln"\neps = 1e-5\n'
    )
    assert load_spec(tmp_path / "s.json") == load_spec(tmp_path / "s.toml")


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("s.json", "{", "valid JSON"),
        ("s.toml", "n = [", "valid TOML"),
        ("s.yaml", "n: 4", ".json or .toml"),
    ],
)
def test_an_unreadable_spec_file_is_refused(
    tmp_path: Path, name: str, text: str, fragment: str
) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=fragment):
        load_spec(tmp_path / name)


def _cell(**changes: object) -> Cell:
    spec = parse_spec({**BASE, **changes})
    (cell,) = spec.cells()
    return cell


def test_a_row_has_every_column_and_is_the_same_every_time() -> None:
    cell = _cell(h_spectrum="positive")
    row = evaluate_cell(cell)
    assert tuple(row) == SWEEP_COLUMNS
    assert evaluate_cell(cell) == row


def test_the_h_spectrum_decides_the_regime_of_the_linear_rule() -> None:
    """S5 and S6: positive H smooths (Perron), negative H does not."""
    smoothing = evaluate_cell(_cell(h_spectrum="positive", layers=60))
    not_smoothing = evaluate_cell(_cell(h_spectrum="negative", layers=60))
    assert smoothing["predicted_kind"] == "perron"
    assert not_smoothing["predicted_kind"] == "non-perron"
    assert smoothing["final_hfc_lfc"] < 1e-2 < not_smoothing["final_hfc_lfc"]


def test_a_negative_layer_norm_weight_flips_the_predicted_regime_under_pre_ln() -> None:
    """Claim 21: Pre-LN's effective value product is diag(γ) M; other rules ignore γ's sign."""
    pre = [
        evaluate_cell(_cell(h_spectrum="positive", gamma=g, rules=[{"rule": "pre-ln"}]))
        for g in (1, -1)
    ]
    linear = [evaluate_cell(_cell(h_spectrum="positive", gamma=g)) for g in (1, -1)]
    assert [row["predicted_kind"] for row in pre] == ["perron", "non-perron"]
    assert [row["predicted_kind"] for row in linear] == ["perron", "perron"]
    assert pre[0]["final_hfc_lfc"] < pre[1]["final_hfc_lfc"]


def test_an_early_stop_is_the_row_s_stop_reason_not_a_warning() -> None:
    row = evaluate_cell(_cell(n=4, d=2, h_spectrum="uniform:0.9:1", layers=3000))
    assert row["stop_reason"] == "floor"
    assert 0 < row["layers_run"] < 3000
    assert row["floor_layer"] >= 0
