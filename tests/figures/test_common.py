"""The figure scripts' shared machinery (:mod:`oversmooth.figures._common`) on a toy script: the
figure sizes, the three outputs and their names, the tidy CSV in its column order, provenance with
every mapping's keys sorted, byte-identical reruns, and the common command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oversmooth.figures._common import WIDTHS, new_figure, parser, read_rows, run_script

COLUMNS = ("x", "label", "y")


def _compute(quick: bool):
    rows = [{"y": 0.1 * i, "x": i, "label": f"p{i}"} for i in range(3 if quick else 5)]
    return rows, {"zeta": {"b": 2, "a": 1}, "alpha": [{"d": 4, "c": 3}]}


def _plot(rows):
    fig, ax = new_figure("column", aspect=0.5)
    ax.plot([row["x"] for row in rows], [row["y"] for row in rows])
    return fig


@pytest.mark.parametrize(("width", "aspect"), [("column", 0.5), ("full", 0.35)])
def test_a_new_figure_has_the_papers_width_and_the_aspect_asked(width: str, aspect: float) -> None:
    import matplotlib.pyplot as plt

    fig, _ = new_figure(width, aspect=aspect)
    assert tuple(fig.get_size_inches()) == pytest.approx((WIDTHS[width], WIDTHS[width] * aspect))
    plt.close(fig)


def test_a_script_writes_its_csv_json_and_png_and_reruns_byte_identically(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "gallery"
    argv = ["--quick", "--out", str(out)]
    assert run_script("toy", "Toy.\n\nMore.", _compute, _plot, COLUMNS, argv) == 0
    names = ["toy.csv", "toy.json", "toy.png"]
    assert sorted(p.name for p in out.iterdir()) == names
    assert capsys.readouterr().out == f"toy: wrote {', '.join(str(out / n) for n in names)}\n"
    assert (out / "toy.csv").read_text(encoding="utf-8").splitlines()[0] == "x,label,y"
    assert read_rows(out / "toy.csv") == [
        {"x": str(i), "label": f"p{i}", "y": repr(0.1 * i)} for i in range(3)
    ]
    meta = json.loads((out / "toy.json").read_text(encoding="utf-8"))
    assert (meta["figure"], meta["script"], meta["argv"]) == ("toy", "figures/toy.py", argv)
    assert meta["config"] == {"alpha": [{"c": 3, "d": 4}], "quick": True, "zeta": {"a": 1, "b": 2}}
    assert list(meta["config"]) == ["alpha", "quick", "zeta"]
    assert list(meta["config"]["zeta"]) == ["a", "b"]
    assert list(meta["config"]["alpha"][0]) == ["c", "d"]
    assert (out / "toy.png").read_bytes().startswith(b"\x89PNG")
    first = {name: (out / name).read_bytes() for name in ("toy.csv", "toy.png")}
    assert run_script("toy", "Toy.", _compute, _plot, COLUMNS, argv) == 0
    assert {name: (out / name).read_bytes() for name in first} == first


def test_the_common_command_line() -> None:
    p = parser("toy", "First line.\nSecond.")
    assert (p.prog, p.description) == ("python -m oversmooth.figures.toy", "First line.")
    args = p.parse_args([])
    assert (args.quick, args.out) == (False, Path("figures-out"))
    with pytest.raises(SystemExit) as stop:
        p.parse_args(["--unknown"])
    assert stop.value.code == 2
