"""What the subcommands share (:mod:`oversmooth.commands.common`): counts and ``all``/``auto``
refused at parse time in one line naming the option, the shared MODEL, ``--force``, ``--scheduler``
and ``--workers`` arguments, and opening a model by path or zoo name."""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
import pytest

from oversmooth.commands.common import (
    add_force_argument,
    add_model_argument,
    add_scheduler_options,
    count_or_rule,
    open_model,
    positive_int,
)
from oversmooth.importers.errors import ImporterError
from tests.importers.builders import VARIANTS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oversmooth x")
    add_model_argument(parser)
    add_force_argument(parser)
    add_scheduler_options(parser, "one item per task")
    parser.add_argument("--threads", type=positive_int)
    parser.add_argument("--dominance-inputs", type=count_or_rule)
    return parser


def test_the_shared_arguments_parse_to_their_values() -> None:
    args = _parser().parse_args(
        ["m.onnx", "--force", "--scheduler", "local", "--workers", "3", "--threads", "02"]
    )
    assert (args.model, args.force, args.scheduler, args.workers, args.threads) == (
        "m.onnx",
        True,
        "local",
        3,
        2,
    )
    defaults = _parser().parse_args(["m.onnx"])
    assert (defaults.force, defaults.scheduler, defaults.workers) == (False, None, None)


@pytest.mark.parametrize("text", ["all", "auto", "1", "250"])
def test_a_count_or_rule_is_a_positive_integer_or_a_rule(text: str) -> None:
    assert count_or_rule(text) == (text if text in ("all", "auto") else int(text))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads", "0"], "argument --threads: must be a positive integer; got '0'"),
        (["--threads", "1.5"], "argument --threads: must be a positive integer; got '1.5'"),
        (["--workers", "-2"], "argument --workers: must be a positive integer; got '-2'"),
        (
            ["--dominance-inputs", "some"],
            "argument --dominance-inputs: must be a positive integer, 'all' or 'auto'; got 'some'",
        ),
    ],
)
def test_a_bad_count_is_a_usage_error_naming_the_option(capsys, argv, message) -> None:
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(["m.onnx", *argv])
    assert stop.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"oversmooth x: error: {message}"


def test_open_model_loads_a_path_and_refuses_what_is_neither_file_nor_zoo_name(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bert.onnx"
    onnx.save(VARIANTS["bert_legacy"](0).model, path)
    model = open_model(path)
    assert (model.path, model.name) == (path, "bert.onnx")
    with pytest.raises(ImporterError, match="no-such-model"):
        open_model("no-such-model")
