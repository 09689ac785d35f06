"""The systems ``simulate`` runs, as a library: drawn, saved, read back, and refused with messages
naming the argument as the caller labels it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.errors import InputError
from simulator.systems import A_KINDS, System, draw_system, load_system, save_system

_DRAW = {"n": 5, "d": 3, "a_kind": "symmetric", "h_spectrum": "negative", "scale": 1.0, "seed": 2}


@pytest.mark.parametrize("a_kind", A_KINDS)
def test_a_drawn_system_has_the_documented_shapes(a_kind):
    system = draw_system(**{**_DRAW, "a_kind": a_kind}, gamma=-1.5)
    assert system.A.shape == (5, 5)
    np.testing.assert_allclose(system.A.sum(axis=1), 1.0)
    np.testing.assert_array_equal(system.W_V, np.eye(3))
    H = system.W_proj.T
    np.testing.assert_allclose(H, H.T)
    assert np.all(np.linalg.eigvalsh(H) < 0)
    assert system.X0.shape == (5, 3)
    np.testing.assert_array_equal(system.gamma, np.full(3, -1.5))
    assert system.beta is None


def test_the_same_seed_draws_the_same_system():
    first, second = draw_system(**_DRAW), draw_system(**_DRAW)
    for key, array in first.arrays().items():
        np.testing.assert_array_equal(array, second.arrays()[key])


def test_save_and_load_round_trip(tmp_path: Path):
    system = draw_system(**_DRAW, gamma=2.0)
    path = save_system(tmp_path / "s.npz", system)
    loaded = load_system(path)
    assert isinstance(loaded, System)
    assert set(loaded.arrays()) == {"A", "W_V", "W_proj", "X0", "gamma"}
    for key, array in system.arrays().items():
        np.testing.assert_array_equal(loaded.arrays()[key], array)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param({"n": 1}, "`n` must be at least 2", id="n"),
        pytest.param({"h_spectrum": "wide"}, "`h_spectrum`", id="spectrum"),
        pytest.param({"a_kind": "causal"}, "`a_kind`", id="a-kind"),
        pytest.param({"scale": float("nan")}, "`scale`", id="scale"),
        pytest.param({"seed": -1}, "`seed`", id="seed"),
    ],
)
def test_draw_names_its_parameters_or_the_callers_labels(change, named):
    with pytest.raises(InputError, match=named):
        draw_system(**{**_DRAW, **change})
    key = next(iter(change))
    with pytest.raises(InputError, match=f"`--{key.replace('_', '-')}`"):
        draw_system(**{**_DRAW, **change}, labels={key: f"--{key.replace('_', '-')}"})


def test_load_names_the_file_by_its_label(tmp_path: Path):
    path = tmp_path / "s.npz"
    np.savez(path, A=np.eye(3), W_V=np.eye(2), X0=np.ones((3, 2)))
    with pytest.raises(InputError, match=r"`system` must contain the keys .* lacks W_proj"):
        load_system(path)
    with pytest.raises(InputError, match="`--system` must contain the keys"):
        load_system(path, label="--system")
    np.savez(path, A=np.eye(3), W_V=np.eye(2), W_proj=np.eye(2), X0=np.ones(3))
    with pytest.raises(InputError, match=r"`X0` in system .* must be a single 2-D matrix"):
        load_system(path)
    with pytest.raises(InputError, match="`system` must be an existing file"):
        load_system(tmp_path / "absent.npz")
