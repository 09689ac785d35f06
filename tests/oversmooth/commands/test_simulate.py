"""``oversmooth simulate`` end to end through the dispatcher: outputs, the summary, and every kind of
bad input (one-line error naming the argument, exit status 2, no output file)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from oversmooth.cli import main
from oversmooth.simulator.metrics import METRICS, hfc_lfc
from oversmooth.simulator.spectra import attention_symmetric_scores, h_symmetric
from oversmooth.simulator.tolerances import STEP_RTOL
from oversmooth.simulator.updates import SYSTEM_RULES


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _system(n: int = 6, d: int = 4, seed: int = 0, low: float = -1.0, high: float = -0.05):
    rng = np.random.default_rng(seed)
    H = h_symmetric(rng.uniform(low, high, d), rng=rng)
    return {
        "A": attention_symmetric_scores(n, rng=rng),
        "W_V": np.eye(d),
        "W_proj": H.T.copy(),
        "X0": rng.standard_normal((n, d)),
    }


def _save(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _simulate(*args: str) -> int:
    """Exit status of ``oversmooth simulate ARGS`` (argparse usage errors exit through SystemExit)."""
    try:
        return main(["simulate", *args])
    except SystemExit as stop:
        return int(stop.code)


# ---------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------


def test_synthetic_run_writes_a_tidy_csv_and_the_system(tmp_path, capsys):
    out, sys_file = tmp_path / "traj.csv", tmp_path / "sys.npz"
    code = _simulate(
        "--layers", "12", "--out", str(out), "--save-system", str(sys_file), "--n", "7", "--d", "3"
    )
    assert code == 0
    rows = _read_csv(out)
    assert list(rows[0]) == ["layer", "metric", "value"]
    assert {int(row["layer"]) for row in rows} == set(range(13))
    assert set(METRICS) <= {row["metric"] for row in rows}
    with np.load(sys_file) as system:
        assert system["A"].shape == (7, 7)
        assert system["X0"].shape == (7, 3)
        first = next(r for r in rows if r["layer"] == "0" and r["metric"] == "hfc_lfc")
        np.testing.assert_allclose(float(first["value"]), hfc_lfc(system["X0"]), rtol=STEP_RTOL)
    printed = capsys.readouterr().out
    assert "stop_reason completed" in printed
    assert "theory for the linear rule" in printed
    assert "hfc_lfc=" in printed


def test_system_file_round_trip_gives_the_same_trajectory(tmp_path):
    first, second, sys_file = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "s.npz"
    assert _simulate("--layers", "9", "--out", str(first), "--save-system", str(sys_file)) == 0
    assert _simulate("--system", str(sys_file), "--layers", "9", "--out", str(second)) == 0
    assert first.read_text() == second.read_text()


@pytest.mark.parametrize("rule", SYSTEM_RULES)
def test_every_rule_runs_from_a_file(tmp_path, rule):
    sys_file = _save(tmp_path / "s.npz", **_system(), gamma=np.full(4, -1.0), beta=np.zeros(4))
    out = tmp_path / "t.csv"
    assert (
        _simulate("--system", str(sys_file), "--rule", rule, "--layers", "5", "--out", str(out))
        == 0
    )
    values = [float(row["value"]) for row in _read_csv(out) if row["metric"] != "log_norm"]
    assert np.all(np.isfinite(values))


def test_pre_ln_depends_on_the_sign_of_gamma(tmp_path):
    base = _system(seed=3)
    plus = _save(tmp_path / "p.npz", **base, gamma=np.ones(4))
    minus = _save(tmp_path / "m.npz", **base, gamma=-np.ones(4))
    outputs = []
    for name, sys_file in (("p", plus), ("m", minus)):
        out = tmp_path / f"{name}.csv"
        assert (
            _simulate(
                "--system", str(sys_file), "--rule", "pre-ln", "--layers", "30", "--out", str(out)
            )
            == 0
        )
        outputs.append([float(r["value"]) for r in _read_csv(out) if r["metric"] == "hfc_lfc"][-1])
    assert outputs[0] != pytest.approx(outputs[1], rel=0.05)


def test_rule_params_reach_the_rule(tmp_path):
    sys_file = _save(tmp_path / "s.npz", **_system(seed=4))
    finals = []
    for lam in ("0.0", "0.9"):
        out = tmp_path / f"n{lam}.csv"
        args = ("--system", str(sys_file), "--rule", "neutreno", "--rule-param", f"lam={lam}")
        assert _simulate(*args, "--layers", "20", "--out", str(out)) == 0
        finals.append([r["value"] for r in _read_csv(out) if r["metric"] == "cosine"][-1])
    assert finals[0] != finals[1]


def test_floor_is_reported_and_can_be_disabled(tmp_path, capsys):
    out = tmp_path / "t.csv"
    args = ("--h-spectrum", "positive", "--layers", "3000", "--out", str(out))
    assert _simulate(*args) == 0
    printed = capsys.readouterr().out
    assert "stop_reason floor" in printed
    assert "note: iteration stopped" in printed
    layers = {int(r["layer"]) for r in _read_csv(out)}
    assert max(layers) < 3000
    assert _simulate(*args[:-4], "--layers", "300", "--out", str(out), "--no-floor") == 0
    assert "stop_reason completed" in capsys.readouterr().out
    assert max(int(r["layer"]) for r in _read_csv(out)) == 300


@pytest.mark.parametrize("kind", ["symmetric", "doubly-stochastic", "general"])
@pytest.mark.parametrize("spectrum", ["negative", "positive", "uniform:-2:0.5"])
def test_synthetic_options(tmp_path, kind, spectrum):
    out = tmp_path / "t.csv"
    args = ("--a-kind", kind, "--h-spectrum", spectrum, "--scale", "0.7", "--seed", "5")
    assert _simulate(*args, "--layers", "8", "--out", str(out), "--no-floor") == 0
    assert max(int(r["layer"]) for r in _read_csv(out)) == 8


# ---------------------------------------------------------------------------------------------
# bad input: exit 2, one line naming the argument, no output file
# ---------------------------------------------------------------------------------------------


def _bad_systems() -> list:
    good = _system()
    non_square = {**good, "A": good["A"][:, :5]}
    scaled = {**good, "A": 1.2 * good["A"]}
    negative = {**good, "A": good["A"] - 0.5 * np.eye(6)}
    with_nan = {**good, "X0": np.where(np.eye(6, 4) > 0, np.nan, good["X0"])}
    with_inf = {**good, "W_V": np.full((4, 4), np.inf)}
    missing = {key: value for key, value in good.items() if key != "W_proj"}
    small_A = attention_symmetric_scores(5, rng=np.random.default_rng(0))
    return [
        pytest.param(missing, "W_proj", id="missing-key"),
        pytest.param(non_square, "`A`", id="A-not-square"),
        pytest.param(scaled, "row-stochastic", id="A-rows-not-one"),
        pytest.param(negative, "row-stochastic", id="A-negative"),
        pytest.param(with_nan, "`X0`", id="X0-nan"),
        pytest.param(with_inf, "`W_V`", id="W_V-inf"),
        pytest.param({**good, "A": small_A}, "`X0`", id="X0-tokens-vs-A"),
        pytest.param({**good, "X0": good["X0"][:, :3]}, "`X0`", id="X0-features-vs-W_V"),
        pytest.param({**good, "W_proj": np.eye(3, 4)}, "`W_proj`", id="W_proj-vs-W_V"),
        pytest.param({**good, "gamma": np.ones(3)}, "`gamma`", id="gamma-length"),
        pytest.param({**good, "A": good["A"][None]}, "`A`", id="A-batched"),
        pytest.param({**good, "A": np.array(["x"])}, "`A`", id="A-text"),
    ]


def _assert_bad_input(capsys, out: Path, code: int, named: str) -> None:
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert named in lines[0]
    assert "oversmooth simulate: error:" in lines[0]
    assert not out.exists()
    assert not list(out.parent.glob("*.part"))


@pytest.mark.parametrize(("arrays", "named"), _bad_systems())
def test_bad_system_files(tmp_path, capsys, arrays, named):
    sys_file = _save(tmp_path / "s.npz", **arrays)
    out = tmp_path / "t.csv"
    rule = "pre-ln" if "gamma" in arrays else "linear"
    code = _simulate("--system", str(sys_file), "--rule", rule, "--layers", "4", "--out", str(out))
    _assert_bad_input(capsys, out, code, named)


def test_unreadable_system_files(tmp_path, capsys):
    out = tmp_path / "t.csv"
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip archive at all")
    plain = tmp_path / "plain.npy"
    np.save(plain, np.eye(3))
    for path in (garbage, plain, tmp_path / "absent.npz", tmp_path):
        code = _simulate("--system", str(path), "--layers", "4", "--out", str(out))
        _assert_bad_input(capsys, out, code, "--system")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        pytest.param(("--layers", "0"), "--layers", id="layers-zero"),
        pytest.param(("--layers", "-3"), "--layers", id="layers-negative"),
        pytest.param(("--layers", "2.5"), "--layers", id="layers-not-int"),
        pytest.param(("--layers", "4", "--rule", "quadratic"), "--rule", id="unknown-rule"),
        pytest.param(("--layers", "4", "--rule-param", "lam=1"), "--rule-param", id="param-key"),
        pytest.param(
            ("--layers", "4", "--rule", "neutreno", "--rule-param", "lam=x"),
            "--rule-param",
            id="param-value",
        ),
        pytest.param(("--layers", "4", "--h-spectrum", "wide"), "--h-spectrum", id="spectrum"),
        pytest.param(("--layers", "4", "--a-kind", "causal"), "--a-kind", id="a-kind"),
        pytest.param(("--layers", "4", "--n", "1"), "--n", id="one-token"),
        pytest.param(("--layers", "4", "--seed", "-1"), "--seed", id="seed"),
    ],
)
def test_bad_arguments(tmp_path, capsys, args, named):
    out = tmp_path / "t.csv"
    code = _simulate(*args, "--out", str(out))
    _assert_bad_input(capsys, out, code, named)


def test_system_file_and_synthetic_options_are_exclusive(tmp_path, capsys):
    sys_file = _save(tmp_path / "s.npz", **_system())
    out = tmp_path / "t.csv"
    code = _simulate("--system", str(sys_file), "--n", "5", "--layers", "4", "--out", str(out))
    _assert_bad_input(capsys, out, code, "--system")


def test_an_empty_output_path_is_a_clean_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _simulate("--layers", "4", "--out", "")
    captured = capsys.readouterr()
    assert code == 2
    assert "`--out` must name a file; got an empty string" in captured.err
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_is_a_clean_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "t.csv"  # a folder that is a file
    code = _simulate("--layers", "4", "--out", str(out))
    _assert_bad_input(capsys, out, code, "--out")
