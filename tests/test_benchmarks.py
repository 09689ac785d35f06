"""The benchmarks still run: each one's measuring function on a small real model, once.

Speed is never asserted here (targets live in ``benchmarks/``, ratios measured in one run); these
tests only catch a benchmark broken by a refactor (a renamed function it patches, an argument it
no longer passes), which nothing else runs.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realmodels import require_real_model


@pytest.mark.realmodel
def test_the_gpu_checks_script_runs_every_step_in_a_dry_run(tmp_path: Path) -> None:
    """``scripts/gpu_checks.sh`` on the CPU with a small model: every step finishes (a renamed
    option of a benchmark would fail its step) and each writes its output under OUT only."""
    require_real_model("minilm-l3")
    environment = {
        **os.environ,
        "PYTHON": sys.executable,
        "PROVIDER": "cpu",
        "MODEL": "minilm-l3",
        "BATCH": "4",
        "BATCHES_PER_AUDIT": "2",
        "GRAM_COUNT": "20",
    }
    rows = _gpu_checks(tmp_path, environment, timeout=600)
    assert [(name, status) for name, status, _ in rows] == [
        (name, "0")
        for name in (
            "doctor",
            "cuda-tests",
            "gram",
            "target",
            "target-held0",
            "target-panel",
            "gram-host",
            "target-fused",
            "target-raw",
            "session",
            "ops",
        )
    ]
    assert "Gram spectra on the host" in (tmp_path / "out" / "gram-host.txt").read_text()
    assert "--held-share 0" in (tmp_path / "out" / "target-held0.txt").read_text()
    # on the CPU a device tridiagonalisation has nothing to run on, and the line says so
    assert "--gram-solver fused unused" in (tmp_path / "out" / "target-fused.txt").read_text()
    # 8 inputs, below the rule's first look: every input's cases computed and used
    assert (
        "dominance: cases of 8 of 8 inputs computed, 8 used"
        in (tmp_path / "out" / "target.txt").read_text()
    )


@pytest.mark.realmodel
def test_the_device_benchmark_can_put_the_gram_spectra_on_the_host() -> None:
    """``--gram-solver host``: the audit's Gram spectra go through the host's LAPACK (the stage is
    still timed where the audit calls it), the line says so, and the audit's own is restored."""
    from benchmarks import bench_device
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs.sources import default_inputs
    from oversmooth.importers.runtime import reductions
    from oversmooth.importers.zoo import get_model

    original = reductions.gram_eigenvalues
    called: list[int] = []

    def on_the_host(gram):
        called.append(len(gram))
        return original(gram)

    graph = load_model(require_real_model("minilm-l3"))
    inputs = default_inputs(graph.inputs, get_model("minilm-l3"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_device, "_gram_eigenvalues_on_the_host", on_the_host)
        result = bench_device.rates(
            graph,
            "minilm-l3",
            inputs,
            "cpu",
            2,
            min_seconds=0.0,
            batches_per_audit=1,
            stages=True,
            gram_solver="host",
        )
    assert result.line().endswith("Gram spectra on the host")
    assert called  # the warm-up and the timed audit went through it
    calls = {line[:24].strip(): int(line[24:31]) for line in result.stages[1:-1]}
    assert calls["Gram spectra"] > 0
    assert reductions.gram_eigenvalues is original


@pytest.mark.realmodel
def test_the_device_benchmark_measures_a_text_model() -> None:
    from benchmarks.bench_device import rates
    from oversmooth.importers.graph import load_model
    from oversmooth.importers.inputs.sources import default_inputs
    from oversmooth.importers.zoo import get_model

    graph = load_model(require_real_model("minilm-l3"))
    inputs = default_inputs(graph.inputs, get_model("minilm-l3"))
    result = rates(
        graph, "minilm-l3", inputs, "cpu", 2, min_seconds=0.0, batches_per_audit=1, stages=True
    )
    assert min(result.plain, result.session, result.audit) > 0
    assert result.device_bytes_per_input == 0
    assert "CPU" in result.line()
    calls = {line[:24].strip(): int(line[24:31]) for line in result.stages[1:-1]}
    # the stages every audit with dominance meets were each called, where the benchmark looks
    for stage in (
        "onnxruntime calls",
        "layer metrics",
        "Gram spectra",
        "dominance stacks",
        "depth step's heads",
        "waiting for a batch",
    ):
        assert calls[stage] > 0, stage


@pytest.mark.realmodel
def test_the_audit_benchmark_times_the_audit_against_inference() -> None:
    from benchmarks.bench_audit import audit_against_inference

    require_real_model("minilm-l3")
    timing = audit_against_inference("minilm-l3", 4, 2)
    assert timing.n_inputs == 4


def test_the_train_benchmark_times_one_epoch_of_each_variant() -> None:
    pytest.importorskip("torch", reason="needs the train extra: pip install 'oversmooth[train]'")
    from benchmarks.bench_train import VARIANTS, time_runs

    timings = time_runs(1, variants=VARIANTS[:2])
    assert [t.variant for t in timings] == ["standard", "plus"]
    assert all(t.seconds > 0 and t.epochs == 1 and t.device == "cpu" for t in timings)


def test_every_audit_stage_names_a_function_the_audit_looks_up_there() -> None:
    from benchmarks.stages import AUDIT_STAGES, _owner

    for label, (path, name) in AUDIT_STAGES.items():
        assert callable(getattr(_owner(path), name, None)), label


def test_stage_totals_count_every_call_on_every_thread_and_restore_the_function() -> None:
    import math
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.stages import stage_lines, timed_stages

    original = math.fsum
    with timed_stages({"sums": ("math", "fsum")}) as totals:
        assert math.fsum is not original
        with ThreadPoolExecutor(max_workers=3) as pool:
            assert list(pool.map(math.fsum, [[1.0, 2.0]] * 7)) == [3.0] * 7
        with pytest.raises(TypeError):
            math.fsum(None)  # type: ignore[arg-type]
    assert math.fsum is original
    assert totals["sums"].calls == 8
    assert totals["sums"].wall > 0
    assert totals["sums"].cpu >= 0
    lines = stage_lines(totals, 4, 1.0)
    assert lines[1].split()[:2] == ["sums", "8"]
    assert lines[-1].split() == ["elapsed", "250.0"]


def test_the_gram_benchmark_times_every_host_solver_against_the_first() -> None:
    import numpy as np

    from benchmarks.bench_gram import time_solvers

    rows = np.random.default_rng(0).standard_normal((5, 9, 12))
    timings = time_solvers(rows @ rows.transpose(0, 2, 1), threads=2, repeats=1)
    assert [t.solver for t in timings] == ["host, 1 thread", "host, 2 threads"]
    assert all(t.ms_per_matrix > 0 for t in timings)
    assert timings[0].max_relative_difference == 0
    assert timings[1].max_relative_difference < 1e-14


def test_the_gram_benchmarks_device_rows_run_on_a_stand_in_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The device rows and parts run only on a lent GPU, where a broken one costs the lease's
    step: here NumPy stands in for CuPy (the raw kernels by the array code they mirror, the
    synchronisation a no-op), so a renamed function or a wrong argument fails on the CPU."""
    import types

    import numpy as np

    from benchmarks import bench_gram
    from oversmooth.importers.runtime import device_spectra, gram_spectra

    device = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None)),
        linalg=np.linalg,
    )
    monkeypatch.setattr(bench_gram, "array_module", lambda stack: device)
    for name in ("raw", "block", "panel"):
        monkeypatch.setitem(
            gram_spectra.TRIDIAGONALISATIONS, name, device_spectra.householder_tridiagonal
        )
    rows = np.random.default_rng(1).standard_normal((16, 9, 12))
    stack = rows @ rows.transpose(0, 2, 1)
    parts = bench_gram.time_device_parts(stack, repeats=1)
    assert list(parts) == [
        "tridiagonalisation, fused",
        "tridiagonalisation, raw",
        "tridiagonalisation, block",
        "tridiagonalisation, panel",
        "bisection",
    ]
    assert all(list(by_size) == [2, 16] and min(by_size.values()) > 0 for by_size in parts.values())
    solvers = bench_gram._solvers(stack, threads=2)
    reference = np.linalg.eigvalsh(stack)
    for name in (
        "device, fused",
        "device, raw",
        "device, block",
        "device, panel",
        "device, batched",
    ):
        np.testing.assert_allclose(solvers[name](stack), reference, atol=1e-12 * reference.max())
    unchecked = bench_gram._unchecked_device_spectra(stack)
    assert list(unchecked) == ["fused", "raw", "block", "panel", "batched"]
    for eig in unchecked.values():
        np.testing.assert_allclose(eig, reference, atol=1e-12 * reference.max())


@pytest.mark.realmodel
def test_the_gram_benchmark_reads_the_models_own_gram_matrices() -> None:
    from benchmarks.bench_gram import gram_stack

    require_real_model("minilm-l3")
    stack = gram_stack("minilm-l3", "cpu", 7)
    assert stack.shape[0] == 7
    assert stack.shape[1] == stack.shape[2] > 1
    assert (stack == stack.transpose(0, 2, 1)).all()


def test_each_ratio_is_held_to_the_target_of_its_largest_count_reached() -> None:
    from benchmarks.bench_audit import ratio_target

    assert ratio_target("dinov2-vits14", 6) is None
    assert ratio_target("dinov2-vits14", 64) == ratio_target("dinov2-vits14", 1023) == 3.0
    assert ratio_target("dinov2-vits14", 1024) == 1.5
    assert ratio_target("minilm-l6-int8", 256) == 2.0
    assert ratio_target("minilm-l3", 64) is None


@pytest.mark.parametrize(("plain_s", "runs"), [(0.4, 5), (0.9, 3), (2.5, 1)])
def test_a_short_ratio_is_measured_again_and_sorted(
    monkeypatch: pytest.MonkeyPatch, plain_s: float, runs: int
) -> None:
    from benchmarks import bench_audit

    audit_seconds = iter([9.0, 5.0, 7.0, 6.0, 8.0])

    def fake(model: str, n_inputs: int, batch: int, mode: str) -> bench_audit.AuditRatio:
        return bench_audit.AuditRatio(
            model, n_inputs, batch, next(audit_seconds), plain_s, 0.0, 0.0, *[1.0] * 8
        )

    monkeypatch.setattr(bench_audit, "audit_against_inference", fake)
    measured = bench_audit.ratio_runs("m", 64, 8, "auto")
    assert len(measured) == runs
    ratios = [run.per_input_ratio for run in measured]
    assert ratios == sorted(ratios)


def test_the_device_benchmark_takes_the_audits_dominance_inputs(capsys) -> None:
    from benchmarks.bench_device import parser

    parsed = [parser().parse_args(["--dominance-inputs", text]) for text in ("all", "auto", "32")]
    assert [args.dominance_inputs for args in parsed] == ["all", "auto", 32]
    for bad in ("0", "-3", "some"):
        with pytest.raises(SystemExit) as stopped:
            parser().parse_args(["--dominance-inputs", bad])
        assert stopped.value.code == 2
        assert "must be a positive integer, 'all' or 'auto'" in capsys.readouterr().err


def test_the_device_benchmark_picks_the_gram_solver_it_is_told() -> None:
    """``--gram-solver`` names a device tridiagonalisation or the host (``--gram-on-host`` is the
    latter); the audit's Gram function is then the device solver with that tridiagonalisation."""
    from benchmarks import bench_device
    from oversmooth.importers.runtime import gram_spectra
    from oversmooth.importers.runtime.gram_spectra import TRIDIAGONALISATIONS

    parse = bench_device.parser().parse_args
    assert parse([]).gram_solver == "block"
    assert parse(["--gram-on-host"]).gram_solver == "host"
    assert parse(["--gram-solver", "fused"]).gram_solver == "fused"
    with pytest.raises(SystemExit):
        parse(["--gram-solver", "jacobi"])
    fused = bench_device._gram_solver("fused")
    assert fused.func is gram_spectra.gram_eigenvalues  # type: ignore[attr-defined]
    assert fused.keywords == {"tridiagonalise": TRIDIAGONALISATIONS["fused"]}  # type: ignore[attr-defined]
    assert bench_device._gram_solver("host") is bench_device._gram_eigenvalues_on_the_host
    assert bench_device._gram_solver_note("block", "cpu") == ""
    assert bench_device._gram_solver_note("host", "cpu") == ", Gram spectra on the host"
    assert "unused" in bench_device._gram_solver_note("fused", "cpu")


def test_the_device_benchmark_takes_a_held_share_between_0_and_1() -> None:
    from benchmarks import bench_device
    from oversmooth.importers.audit.host_work import HELD_ATTENTION_SHARE

    parse = bench_device.parser().parse_args
    assert parse([]).held_share == HELD_ATTENTION_SHARE
    assert parse(["--held-share", "0"]).held_share == 0
    for bad in ("1.5", "-0.1", "half", "nan"):
        with pytest.raises(SystemExit):
            parse(["--held-share", bad])
    assert bench_device._held_share_note(HELD_ATTENTION_SHARE) == ""
    assert bench_device._held_share_note(0) == ", --held-share 0"


def test_the_device_benchmark_warms_up_on_its_first_batches_with_the_timed_runner() -> None:
    """The warm-up audits the first two batches (the whole set where it is smaller), through
    the session the timed run uses, so that run finds its kernels compiled and pools filled."""
    from dataclasses import dataclass

    import numpy as np

    from benchmarks.bench_device import WARM_UP_BATCHES, _warm_up
    from oversmooth.importers.inputs.feeds import Inputs

    @dataclass
    class Session:
        runner: object
        inputs: Inputs

    items = np.arange(40.0).reshape(20, 2)
    inputs = Inputs(labels=[str(i) for i in range(20)], source="test", feeds={"x": items})
    runner = object()
    few, warm = _warm_up(Session(runner, inputs), inputs, 4)  # type: ignore[arg-type]
    assert WARM_UP_BATCHES == 2
    np.testing.assert_array_equal(few.feeds["x"], items[:8])
    assert warm.inputs is few
    assert warm.runner is runner
    few, _ = _warm_up(Session(runner, inputs), inputs, 16)  # type: ignore[arg-type]
    assert few.batch_size == 20


def test_the_gpu_checks_script_runs_only_the_steps_named(tmp_path: Path) -> None:
    """``STEPS``: a short lease runs the steps it names, in the script's order, and no other."""
    environment = {**os.environ, "PYTHON": sys.executable, "STEPS": "doctor"}
    rows = _gpu_checks(tmp_path, environment, timeout=120)
    assert [(name, status) for name, status, _ in rows] == [("doctor", "0")]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["doctor.txt", "steps.tsv"]


def _gpu_checks(tmp_path: Path, environment: dict[str, str], timeout: int) -> list[list[str]]:
    """Run ``scripts/gpu_checks.sh`` with SITE (what unpack_offline_gpu.sh fills: nothing is
    needed on the CPU) and OUT under ``tmp_path``: steps.tsv's rows."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    (tmp_path / "site").mkdir()
    subprocess.run(
        ["bash", str(root / "scripts" / "gpu_checks.sh"), str(tmp_path / "site"), str(out)],
        cwd=root,
        env=environment,
        check=True,
        capture_output=True,
        timeout=timeout,
    )
    return [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()[1:]]


def test_the_gpu_checks_script_refuses_an_unknown_step(tmp_path: Path) -> None:
    """A misspelt step would otherwise run nothing and report success: one line, exit 2."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "site").mkdir()
    result = subprocess.run(
        [
            "bash",
            str(root / "scripts" / "gpu_checks.sh"),
            str(tmp_path / "site"),
            str(tmp_path / "out"),
        ],
        cwd=root,
        env={**os.environ, "PYTHON": sys.executable, "STEPS": "doctor targt"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "STEPS names an unknown step 'targt'; expected some of: "
        "doctor cuda-tests gram target target-held0 target-panel gram-host target-fused target-raw "
        "session ops"
    ]
    assert not (tmp_path / "out").exists()


def test_the_host_pool_solves_any_stack_on_its_threads() -> None:
    """``--gram-on-host`` hands a device batch's whole stack (layers, batch, k, k) to the pool,
    which may have more threads than layers: LAPACK's values, bitwise."""
    import numpy as np

    from benchmarks.bench_gram import host_pool

    rows = np.random.default_rng(2).standard_normal((3, 2, 6, 8))
    stack = rows @ np.swapaxes(rows, -1, -2)
    for threads in (1, 2, 5):
        np.testing.assert_array_equal(host_pool(threads)(stack), np.linalg.eigvalsh(stack))


def _profile_event(cat: str, name: str, ts: int, dur: int, **args: str) -> dict[str, object]:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_an_op_profile_sums_each_calls_kernels_and_leaves_out_the_warm_up() -> None:
    """A call's kernels are the Node events that start within its ``model_run``, in whatever
    order the events were written; warm-up calls do not count; ``between`` is the run's time
    the kernels do not account for."""
    from benchmarks.bench_ops import op_profile

    def call(start: int, run: int, *kernels: tuple[str, str, int]) -> list[dict[str, object]]:
        events, ts = [], start
        for k, (op, provider, dur) in enumerate(kernels):
            name = f"{op}_{k}_kernel_time"
            events.append(_profile_event("Node", name, ts, dur, op_name=op, provider=provider))
            ts += dur
        return [*events, _profile_event("Session", "model_run", start, run)]

    cuda, cpu = "CUDAExecutionProvider", "CPUExecutionProvider"
    first = call(1_000, 50_000, ("MatMul", cuda, 40_000))  # warm-up
    second = call(60_000, 5_000, ("MatMul", cuda, 3_000), ("Abs", cpu, 1_000))
    third = call(70_000, 7_000, ("MatMul", cuda, 4_000), ("Abs", cpu, 2_000))
    events = [
        _profile_event("Session", "session_initialization", 0, 900),
        _profile_event("Node", "Init_kernel_time", 10, 5, op_name="Init", provider=cpu),
        *first,
        *second,
        third[-1],  # the run's own event written before its kernels'
        *third[:-1],
    ]
    profile = op_profile(events, warm_up=1)
    assert profile.calls == 2
    assert profile.run_ms == pytest.approx(6.0)
    assert profile.node_ms == pytest.approx(5.0)
    assert profile.between_ms == pytest.approx(1.0)
    assert profile.nodes == 2
    assert profile.providers == pytest.approx({cuda: 3.5, cpu: 1.5})
    assert profile.ops["Abs"] == pytest.approx((1.0, 1.5))
    assert "Init" not in profile.ops  # outside every call
    with pytest.raises(ValueError, match="no call after the 3 warm-up calls"):
        op_profile(events, warm_up=3)


def test_the_extra_over_plain_ranks_operator_types_by_the_time_they_add() -> None:
    """Types only one side has count from 0; the costliest difference comes first, a type that
    got cheaper last."""
    from benchmarks.bench_ops import OpProfile, extra_over, profile_lines

    plain = OpProfile(3, 10.0, 9.0, 1.0, 2, ops={"MatMul": (2, 8.0), "Add": (1, 1.0)})
    reduced = OpProfile(
        3, 14.0, 12.5, 1.5, 5, ops={"MatMul": (3, 10.0), "Add": (1, 0.5), "ReduceSum": (1, 2.0)}
    )
    assert extra_over(plain, reduced) == [
        ("MatMul", 2, 3, 2.0),
        ("ReduceSum", 0.0, 1, 2.0),
        ("Add", 1, 1, -0.5),
    ]
    lines = profile_lines({"plain": plain, "reduced": reduced}, top=2)
    assert lines[-2].split() == ["MatMul", "2", "→", "3", "2.000"]
    assert lines[-1].split() == ["ReduceSum", "0", "→", "1", "2.000"]


@pytest.mark.realmodel
def test_the_ops_benchmark_profiles_plain_inference_and_the_audits_session() -> None:
    from benchmarks.bench_ops import (
        profile_lines,
        session_profiles,
        stacked_lines,
        stacked_profiles,
    )
    from benchmarks.bench_runner import VARIANTS, installed_models

    require_real_model("minilm-l3")
    ((name, graph, inputs),) = installed_models(["minilm-l3"])
    profiles = session_profiles(graph, inputs, name, "cpu", batch=2, runs=1, warm_up=1)
    assert tuple(profiles) == VARIANTS
    assert profiles["reduced"].nodes > profiles["plain"].nodes  # the reductions are nodes too
    assert profiles["reduced"].nodes > profiles["scalars"].nodes  # and the Gram products'
    assert all(set(p.providers) == {"CPUExecutionProvider"} for p in profiles.values())
    assert all(p.run_ms >= p.node_ms > 0 for p in profiles.values())
    assert profile_lines(profiles, 3)[1].split()[0] == "plain"
    stacked = stacked_profiles(graph, inputs, name, "cpu", batch=2, runs=1, warm_up=1)
    assert stacked is not None
    timed, calls = stacked
    assert tuple(timed) == ("layers", "stacked")
    assert timed["stacked"].nodes < timed["layers"].nodes
    (line,) = stacked_lines(timed, calls)
    assert f"{calls.nodes['layers']} against {calls.nodes['stacked']} nodes added" in line


def test_the_ops_benchmark_refuses_what_it_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    """No calls or a negative warm-up: one line naming the option, exit 2 (not a traceback)."""
    from benchmarks.bench_ops import main

    for argv, option in ((["--runs", "0"], "--runs"), (["--warm-up", "-1"], "--warm-up")):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        assert option in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("bench_audit", ["--ratio-inputs", "0"]),
        ("bench_audit", ["--ratio-batch", "-8"]),
        ("bench_device", ["--batches", "8", "0"]),
        ("bench_gram", ["--count", "none"]),
        ("bench_importer", ["--repeats", "0"]),
        ("bench_memory", ["--counts", "64", "0"]),
        ("bench_operator", ["--inputs", "0"]),
        ("bench_runner", ["--audit-inputs", "0"]),
        ("bench_scheduler", ["--workers", "0"]),
        ("bench_train", ["--epochs", "0"]),
    ],
)
def test_a_count_that_is_not_positive_is_refused_before_any_work(
    module: str, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """One line naming the option, exit 2, as the commands do (``--audit-inputs 0`` ran the
    session benchmark for half a minute and then ended in a traceback)."""
    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert f"argument {argv[0]}: must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "prefix"), [("bert_legacy", 0), ("vit_prenorm_layerscale", 1)])
def test_the_stacked_reductions_give_each_layers_statistics_with_fewer_nodes(
    name: str, prefix: int
) -> None:
    """One chain over the layers concatenated along the batch axis (the mask repeated as often
    inside the graph) against a chain per layer: far fewer nodes, the same statistics and Gram
    matrices to round-off, and both sessions' calls run."""
    from benchmarks.stacked import stacked_calls
    from tests.importers.audited import builder_model_and_inputs

    graph, inputs = builder_model_and_inputs(name, 3)
    stacked = stacked_calls(graph, inputs, "cpu", batch=3, prefix=prefix)
    assert stacked is not None
    assert stacked.nodes["stacked"] < stacked.nodes["layers"] / 2
    assert stacked.largest_difference <= 1e-12
    assert stacked.same_bits == (stacked.largest_difference == 0.0)
    for _, call in stacked.calls.values():
        call()


def test_time_major_layers_are_not_stacked() -> None:
    """nn.TransformerEncoder without batch_first keeps (tokens, batch, features): concatenating
    its layers along axis 0 would mix tokens and items, so the comparison is not built."""
    import numpy as np

    from benchmarks.stacked import stacked_calls
    from oversmooth.importers.inputs.feeds import Inputs
    from tests.importers.family_corpus import load_fixture

    ids = np.full((2, 8), 5, dtype=np.int64)
    inputs = Inputs(
        feeds={"input_ids": ids, "attention_mask": np.ones_like(ids)},
        token_mask=np.ones(ids.shape, dtype=bool),
        labels=("a", "b"),
        source="test",
    )
    time_major = load_fixture("torch_encoder_time_major/legacy_eager.onnx.xz")
    assert stacked_calls(time_major, inputs, "cpu", batch=2, prefix=0) is None
    batch_first = load_fixture("torch_encoder/legacy_eager.onnx.xz")
    assert stacked_calls(batch_first, inputs, "cpu", batch=2, prefix=0) is not None


@pytest.mark.parametrize(
    "argv",
    [["ops", "--model", "dinov2-small", "--runs", "1"], ["memory", "--model", "dinov2-small"]],
)
def test_a_model_the_zoo_does_not_have_is_one_line_with_the_commands_status(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``ops`` ended in UnknownModelError's traceback, ``memory`` (whose audit runs in a child
    process) in a RuntimeError's: now one line each, with the status the command gives."""
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m benchmarks {argv[0]}: error: ")
    assert err.count("\n") == 1
    assert "did you mean 'dinov2-vits14'" in err


def test_profiled_variants_are_called_in_turn(tmp_path: Path) -> None:
    """One call of each variant per round, so that drift moves every variant alike (called one
    variant after another, two chains of the same reductions once differed by 10 %)."""
    from benchmarks.bench_ops import _profiled

    order: list[str] = []

    class FakeSession:
        def __init__(self, name: str) -> None:
            self.name, self.calls = name, 0

        def call(self) -> None:
            order.append(self.name)
            self.calls += 1

        def end_profiling(self) -> str:
            events = [
                {"cat": "Session", "name": "model_run", "ts": 10 * k, "dur": 5}
                for k in range(self.calls)
            ]
            path = tmp_path / f"{self.name}.json"
            path.write_text(json.dumps(events))
            return str(path)

    sessions = {name: FakeSession(name) for name in ("a", "b")}
    profiles, extra = _profiled(
        lambda: ({n: (s, s.call) for n, s in sessions.items()}, "extra"), runs=2, warm_up=1
    )
    assert order == ["a", "b"] * 3
    assert extra == "extra"
    assert {name: profile.calls for name, profile in profiles.items()} == {"a": 2, "b": 2}
