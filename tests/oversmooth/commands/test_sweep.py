"""``oversmooth sweep`` and ``oversmooth audit --scheduler`` through the dispatcher.

The sweep gives the same table in this process and on a local Dask cluster of two workers; the
distributed audit writes the same layers.csv and dominance fractions as the single-process one.
Bad input exits 2 with one line and no output folder; Ctrl-C leaves no output.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oversmooth.cli import main
from tests.cluster import WORKERS, started_cluster
from tests.realmodels import require_real_model

SPEC = {
    "n": [6],
    "d": [3],
    "h_spectrum": ["negative", "positive"],
    "gamma": [None, -1],
    "rules": [{"rule": "linear"}, {"rule": "pre-ln"}, {"rule": "neutreno", "lam": [0.4, 0.8]}],
    "layers": 30,
    "seeds": 2,
}
N_CELLS = 2 * 2 * 4 * 2
FILES = {"sweep.csv", "sweep.json", "regime_map.png"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with started_cluster(tmp_path_factory.mktemp("dask")) as address:
        yield address


def write_spec(folder: Path, spec: object = SPEC, name: str = "spec.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([*argv, "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_sweep_gives_the_same_table_here_and_on_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: str
) -> None:
    spec = write_spec(tmp_path)
    here, there = tmp_path / "here", tmp_path / "there"
    code, out, _ = run(["sweep", str(spec), "--out", str(here)], capsys)
    assert code == 0
    assert out.splitlines()[0] == f"sweep: {N_CELLS} cells on this process"
    code, out, _ = run(["sweep", str(spec), "--out", str(there), "--scheduler", cluster], capsys)
    assert code == 0
    assert out.splitlines()[0] == f"sweep: {N_CELLS} cells on {WORKERS} Dask workers"
    assert {path.name for path in here.iterdir()} == FILES
    assert (here / "sweep.csv").read_bytes() == (there / "sweep.csv").read_bytes()
    with (here / "sweep.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["cell"]) for row in rows] == list(range(N_CELLS))
    record = json.loads((there / "sweep.json").read_text(encoding="utf-8"))
    assert record["cells"] == N_CELLS
    assert record["executor"]["workers"] == WORKERS
    assert {path.name for path in tmp_path.iterdir()} == {"spec.json", "here", "there"}


def test_a_sweep_replaces_an_earlier_sweep_but_not_someone_else_s_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(tmp_path, {**SPEC, "rules": [{"rule": "linear"}], "seeds": 1})
    out = tmp_path / "out"
    assert run(["sweep", str(spec), "--out", str(out)], capsys)[0] == 0
    assert run(["sweep", str(spec), "--out", str(out)], capsys)[0] == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    code, _, err = run(["sweep", str(spec), "--out", str(mine)], capsys)
    assert code == 2
    assert "not an earlier output" in err
    assert (mine / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({**SPEC, "depth": 3}, "'depth'"),
        ({**SPEC, "layers": -1}, "'layers'"),
        ({**SPEC, "rules": [{"rule": "neutreno", "tau": 1}]}, "'tau'"),
        ("not an object", "must be an object"),
    ],
)
def test_a_bad_spec_exits_2_with_one_line_and_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: object, fragment: str
) -> None:
    path = write_spec(tmp_path, spec)
    code, out, err = run(["sweep", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("oversmooth sweep: error: ")
    assert fragment in lines[0]
    assert {p.name for p in tmp_path.iterdir()} == {"spec.json"}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--scheduler", "somewhere"], "tcp://HOST:PORT"),
        (["--workers", "2"], "--scheduler local"),
    ],
)
def test_a_bad_scheduler_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], fragment: str
) -> None:
    path = write_spec(tmp_path)
    code, _, err = run(["sweep", str(path), "--out", str(tmp_path / "out"), *options], capsys)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_ctrl_c_during_a_sweep_leaves_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(cells):
        raise KeyboardInterrupt

    monkeypatch.setattr("oversmooth.simulator.sweep.evaluate_cells", interrupted)
    path = write_spec(tmp_path)
    code, _, err = run(["sweep", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == 130
    assert err.strip() == "oversmooth sweep: interrupted"
    assert {p.name for p in tmp_path.iterdir()} == {"spec.json"}


def _layers(folder: Path) -> list[dict[str, str]]:
    with (folder / "layers.csv").open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.realmodel
def test_audit_on_a_local_cluster_writes_the_single_process_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_real_model("minilm-l3")
    common = ["audit", "minilm-l3", "--provider", "cpu", "--random", "9", "--batch-size", "2"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert run([*common, "--out", str(one)], capsys)[0] == 0
    code, _, _ = run([*common, "--out", str(two), "--scheduler", "local", "--workers", "2"], capsys)
    assert code == 0
    rows, merged = _layers(one), _layers(two)
    assert [(r["layer"], r["metric"], r["n"]) for r in rows] == [
        (r["layer"], r["metric"], r["n"]) for r in merged
    ]
    for row, other in zip(rows, merged, strict=True):
        for key in ("mean", "std"):
            assert float(other[key]) == pytest.approx(float(row[key]), rel=1e-9, nan_ok=True)
    docs = [json.loads((f / "audit.json").read_text(encoding="utf-8")) for f in (one, two)]
    for key in ("perron", "non_perron", "balanced"):
        assert docs[1]["dominance"][key] == pytest.approx(docs[0]["dominance"][key], rel=1e-9)
    assert docs[1]["provenance"]["runner"]["executor"]["workers"] == 2
    assert {p.name for p in tmp_path.iterdir()} == {"one", "two"}


def _group(pgid: int) -> list[int]:
    """The processes of a process group (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
    return members


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(process: subprocess.Popen) -> tuple[str, str]:
    """Ctrl-C at the terminal, again if it was lost.

    A Ctrl-C while the local cluster's workers start is ignored by design (they must inherit an
    ignored SIGINT); on a loaded machine the start can outlast the wait above, so the key is
    pressed again after :data:`RETRY_S` seconds without an exit.
    """
    for _ in range(5):
        os.killpg(process.pid, signal.SIGINT)
        try:
            return process.communicate(timeout=RETRY_S)
        except subprocess.TimeoutExpired:
            continue
    process.kill()
    return process.communicate()


#: Seconds to wait for an interrupted sweep to exit before pressing Ctrl-C again.
RETRY_S = 20


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process groups from /proc")
def test_ctrl_c_at_the_terminal_stops_a_local_cluster_sweep_with_one_line(tmp_path: Path) -> None:
    """The terminal sends SIGINT to the whole process group, workers included: still one line,
    exit 130, no output folder, no process left."""
    spec = write_spec(tmp_path, {**SPEC, "layers": 3000, "seeds": 40})
    out = tmp_path / "out"
    command = [sys.executable, "-m", "oversmooth.cli", "sweep", str(spec), "--out", str(out)]
    command += ["--scheduler", "local", "--workers", "2", "--no-progress"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as from a terminal: a SIGINT that this test process happens to ignore (a local cluster
        # started by an earlier test ignores it while its workers start) would be inherited, and
        # Python installs no KeyboardInterrupt handler when it starts with SIGINT ignored
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while len(_group(process.pid)) < 4 and time.monotonic() < deadline:  # the workers run
        time.sleep(0.2)
    time.sleep(2)
    stdout, stderr = _interrupt(process)
    assert process.returncode == 130
    assert stderr == "oversmooth sweep: interrupted\n"
    assert stdout == ""
    assert not out.exists()
    assert {p.name for p in tmp_path.iterdir()} == {"spec.json"}
    deadline = time.monotonic() + 20  # multiprocessing's resource tracker ends on its own
    while _group(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group(process.pid) == []
