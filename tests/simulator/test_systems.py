"""The systems ``simulate`` runs, as a library: drawn, saved, read back, and refused with messages
naming the argument as the caller labels it."""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from oversmooth.simulator.errors import InputError
from oversmooth.simulator.systems import A_KINDS, System, draw_system, load_system, save_system

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


# -- hostile sizes and shapes: one line, checked before anything is allocated ---------------------
def _npy(header: str, data: bytes = b"\0" * 8) -> bytes:
    """An ``.npy`` member with ``header`` as its header text, then ``data``."""
    raw = header.encode("latin1")
    raw += b" " * (63 - (10 + len(raw)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + data


def _system_file(path: Path, **members: bytes | np.ndarray) -> Path:
    """A system archive: a valid (A, W_V, W_proj, X0), each member replaceable by raw bytes."""
    arrays: dict[str, bytes | np.ndarray] = {
        "A": np.full((4, 4), 0.25),
        "W_V": np.eye(3),
        "W_proj": -0.5 * np.eye(3),
        "X0": np.arange(12.0).reshape(4, 3),
        **members,
    }
    with zipfile.ZipFile(path, "w") as archive:
        for key, value in arrays.items():
            if isinstance(value, np.ndarray):
                buffer = io.BytesIO()
                np.save(buffer, value)
                value = buffer.getvalue()
            archive.writestr(f"{key}.npy", value)
    return path


_F8 = "{'descr': '<f8', 'fortran_order': False, 'shape': %s, }"
HOSTILE_SYSTEMS = {
    "header-declares-2^40": ({"A": _npy(_F8 % "(1048576, 1048576)")}, "OVERSMOOTH_MAX_ELEMENTS"),
    "header-declares-more-than-held": ({"A": _npy(_F8 % "(4, 4)")}, "declares shape"),
    "header-negative-shape": ({"A": _npy(_F8 % "(-4, -4)")}, "non-negative sizes"),
    "header-unclosed-tuple": ({"A": _npy(_F8 % "(2, ")}, r"unreadable entry 'A' .*TokenError"),
    "header-unclosed-string": ({"A": _npy(_F8 % "'''(2, }")}, "unreadable entry 'A'"),
    "header-object-dtype": (
        {"A": _npy("{'descr': '|O', 'fortran_order': False, 'shape': (4, 4), }")},
        "Python objects",
    ),
    "unused-member-declares-2^40": (None, None),
    "empty-A": ({"A": np.zeros((0, 0))}, "`A` in --system .* must not be empty"),
    "empty-X0": ({"X0": np.zeros((0, 3))}, "`X0` in --system .* must not be empty"),
    "empty-gamma": ({"gamma": np.zeros(0)}, "`gamma` in --system .* must not be empty"),
}


@pytest.mark.parametrize("name", HOSTILE_SYSTEMS)
def test_a_hostile_system_file_is_one_line_before_any_allocation(tmp_path: Path, name: str):
    members, message = HOSTILE_SYSTEMS[name]
    if members is None:  # a member that is not a system key is never read
        path = _system_file(tmp_path / "s.npz", junk=_npy(_F8 % "(1048576, 1048576)"))
        assert load_system(path).A.shape == (4, 4)
        return
    path = _system_file(tmp_path / "s.npz", **members)
    with pytest.raises(InputError, match=message) as info:
        load_system(path, label="--system")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param({"n": 10**9}, "`A of n 1000000000", id="n-billion"),
        pytest.param({"n": 40}, "`A of n 40", id="n-squared"),
        pytest.param({"d": 40}, "`H of d 40", id="d-squared"),
        pytest.param({"n": 2, "d": 600}, "`X0 of n 2 and d 600", id="n-by-d"),
    ],
)
def test_drawn_sizes_are_checked_against_the_limits_before_drawing(change, named, monkeypatch):
    """Each array a draw makes is checked first: A (n, n), X0 (n, d), H (d, d)."""
    monkeypatch.setenv("OVERSMOOTH_MAX_ELEMENTS", "1000")
    with pytest.raises(InputError, match=f"{named} .*OVERSMOOTH_MAX_ELEMENTS") as info:
        draw_system(**{**_DRAW, **change})
    assert "\n" not in str(info.value)
