"""``oversmooth verify`` through the dispatcher: table, JSON, exit codes, bad arguments."""

from __future__ import annotations

import json

import pytest

from oversmooth.cli import main
from oversmooth.simulator import checks
from oversmooth.simulator.checks import Check, IntRange

REQUIRED_KEYS = {"name", "claim", "statement", "cases", "passed", "worst_margin", "failing_seed"}


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_table_lists_each_check_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["verify", "--only", "vec_identity", "dong_vs_rank1", "--examples", "3"])
    out = _lines(capsys.readouterr().out)
    assert status == 0
    assert out[0].split()[:4] == ["name", "claim", "cases", "passed"]
    assert out[1].split()[:4] == ["vec_identity", "1", "3", "yes"]
    assert out[2].split()[:4] == ["dong_vs_rank1", "30", "3", "yes"]
    assert out[-1].startswith("2 of 2 checks passed")


def test_json_is_an_array_with_the_required_keys(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["verify", "--json", "--examples", "2", "--seed", "4", "--only", "closed_form"])
    records = json.loads(capsys.readouterr().out)
    assert status == 0
    assert isinstance(records, list)
    assert len(records) == 1
    (record,) = records
    assert REQUIRED_KEYS <= set(record)
    assert record["name"] == "closed_form"
    assert record["cases"] == 2
    assert record["passed"] is True
    assert record["failing_seed"] is None


def test_every_check_runs_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["verify", "--json", "--examples", "1"])
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == list(checks.check_names())
    assert all(r["passed"] for r in records), [r for r in records if not r["passed"]]
    assert status == 0


def test_list_names_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--list"]) == 0
    out = capsys.readouterr().out
    for name in checks.check_names():
        assert name in out


@pytest.fixture
def broken_registry(monkeypatch: pytest.MonkeyPatch) -> Check:
    broken = Check(
        name="broken_claim",
        claim=1,
        statement="x stays below 5",
        unit="5 - x",
        space={"x": IntRange(0, 9), "seed": checks.SEED},
        body=lambda params: 4.5 - params["x"],
    )
    monkeypatch.setattr(checks, "CHECKS", (*checks.CHECKS, broken))
    return broken


def test_a_failing_check_exits_1_and_reports_a_reproducing_seed(
    broken_registry: Check, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["verify", "--json", "--examples", "30", "--only", "broken_claim"])
    (record,) = json.loads(capsys.readouterr().out)
    assert status == 1
    assert record["passed"] is False
    assert checks.run_case(broken_registry, record["failing_seed"]) == record["worst_margin"] < 0


def test_a_failing_check_in_the_table(
    broken_registry: Check, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["verify", "--examples", "30", "--only", "vec_identity", "broken_claim"])
    out = capsys.readouterr().out
    assert status == 1
    assert "1 of 2 checks passed" in out
    assert "broken_claim: worst margin -4.5 at seed" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--examples", "0"], "`--examples` must be a positive integer; got 0"),
        (["--examples", "-3"], "`--examples` must be a positive integer; got -3"),
        (["--seed", "-1"], "`--seed` must be a non-negative integer; got -1"),
        (["--only", "vec_identiy"], "did you mean 'vec_identity'?"),
        (["--only", "zzzz"], "got 'zzzz' (see --list)"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["verify", *argv])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert len(_lines(captured.err)) == 1
    assert message in captured.err


def test_non_integer_examples_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", "--examples", "many"])
    assert exit_info.value.code == 2
    assert "--examples" in capsys.readouterr().err
