"""The audit's onnxruntime session (:mod:`oversmooth.importers.audit.session`): the session
``audit_session`` builds, where the reductions of each stream sit (``AuditSession.reads``,
``late_start``), the feeds it adds, the refusal of a batch gone non-finite (naming the first place
in depth order), and the pipeline of every batch's host work
(:func:`oversmooth.importers.audit.host_work.pipelined`)."""

from __future__ import annotations

import functools
import importlib
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from oversmooth.importers.audit.host_work import (
    _device_bytes,
    held_attention_limit,
    pipelined,
)
from oversmooth.importers.audit.pipeline import audit
from oversmooth.importers.audit.session import (
    GRAM_NORM_SQ_LIMIT,
    LOOKAHEAD_BATCHES,
    AuditSession,
    audit_session,
    check_finite_outputs,
    layer_tensors,
    nonfinite_layer_items,
)
from oversmooth.importers.errors import NonFiniteModelError
from oversmooth.importers.graph import OnnxModel, load_model, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.inputs.sources import default_inputs, random_inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.reductions import MASK_INPUT, ReductionPlan, plan_reductions
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import block_weights
from oversmooth.importers.zoo import get_model, models
from oversmooth.simulator.metrics import METRICS
from oversmooth.simulator.statistics import SCALAR_FIELDS, TokenStatistics
from tests.importers.audited import builder_model_and_inputs
from tests.realmodels import require_real_model

SEED = 3
ZOO = [entry.name for entry in models()]


def _session(name: str, **options: Any) -> tuple[AuditSession, list, Inputs]:
    model, inputs = builder_model_and_inputs(name, SEED)
    blocks = [block_weights(model, block) for block in find_attention_blocks(model).blocks]
    return audit_session(model, blocks, inputs, provider="cpu", **options), blocks, inputs


def test_the_session_reduces_the_layers_and_fetches_each_blocks_attention() -> None:
    session, blocks, _ = _session("bert_legacy")
    assert session.layers == layer_tensors(blocks)
    assert len(session.layers) == len(blocks) + 1
    assert session.attention == [block.attention_name for block in blocks]
    assert session.plan.gram != "none"
    plain, _, _ = _session("bert_legacy", attention=False, spectral=False)
    assert plain.attention == []
    assert plain.plan.gram == "none"


def test_the_feeds_add_the_token_mask_where_the_inputs_have_one() -> None:
    masked, _, inputs = _session("bert_legacy")
    assert inputs.token_mask is not None
    feeds = masked.feeds
    assert set(feeds) == set(inputs.feeds) | {MASK_INPUT}
    np.testing.assert_array_equal(feeds[MASK_INPUT], inputs.token_mask.astype(np.float64))
    unmasked, _, vit_inputs = _session("vit_prenorm_layerscale")
    assert vit_inputs.token_mask is None
    assert set(unmasked.feeds) == set(vit_inputs.feeds)


def test_reads_and_late_start_place_the_extra_streams_after_the_layers() -> None:
    # 3 layers (2 blocks), both blocks' sublayers, block 1's attention reading its own stream,
    # block 0's pre-norm sum: plan layers 0-2, sublayers 3-4, block 1's read 5, the late sum 6
    session = AuditSession(
        layers=["x0", "x1", "x2"],
        attention=[],
        sublayers=[0, 1],
        plan=None,  # type: ignore[arg-type]  # not read by these properties
        runner=None,  # type: ignore[arg-type]
        inputs=None,  # type: ignore[arg-type]
        notes=[],
        attention_inputs=[1],
        pre_norm_sums=[0],
    )
    assert session.reads == [0, 5]
    assert session.late_start == 6
    plain = AuditSession(["x0", "x1", "x2"], [], [], None, None, None, [])  # type: ignore[arg-type]
    assert plain.reads == [0, 1]
    assert plain.late_start == 3


def _first_batch(session: AuditSession) -> tuple[Inputs, dict[str, np.ndarray]]:
    batch, outputs = next(iter(session.batches(session.inputs.batch_size)))
    return batch, {name: np.array(array, copy=True) for name, array in outputs.items()}


def _poison(
    session: AuditSession, outputs: dict[str, np.ndarray], layer: int, item: int, value: float
) -> None:
    """What a non-finite entry in ``layer`` of ``item`` does to its statistics: lfc_sq follows
    (``test_the_statistics_flag_every_item_whose_gram_matrix_is_not_finite``)."""
    outputs[session.plan.scalars_name(layer)][item, SCALAR_FIELDS.index("lfc_sq")] = value


def test_finite_outputs_pass_and_a_non_finite_layer_names_the_input_and_the_layer() -> None:
    session, blocks, _ = _session("bert_legacy")
    batch, outputs = _first_batch(session)
    check_finite_outputs(session, blocks, outputs, batch, start=10)
    _poison(session, outputs, layer=2, item=1, value=np.inf)
    with pytest.raises(NonFiniteModelError) as info:
        check_finite_outputs(session, blocks, outputs, batch, start=10)
    message = str(info.value)
    assert f"{batch.labels[1]!r} (item 11)" in message
    assert f"first at layer 2 (the output of block {blocks[1].index})" in message
    assert "\n" not in message


def test_the_first_place_in_depth_order_is_named() -> None:
    session, blocks, _ = _session("bert_legacy")
    batch, outputs = _first_batch(session)
    _poison(session, outputs, layer=2, item=0, value=np.nan)  # layer 2: after block 1
    outputs[session.attention[1]][0, ..., 0, 0] = np.nan  # block 1's attention: before layer 2
    with pytest.raises(NonFiniteModelError, match=rf"block {blocks[1].index}'s attention"):
        check_finite_outputs(session, blocks, outputs, batch, start=0)
    _poison(session, outputs, layer=0, item=0, value=np.nan)  # layer 0 comes first of all
    with pytest.raises(NonFiniteModelError, match=r"first at layer 0 \(the stream entering"):
        check_finite_outputs(session, blocks, outputs, batch, start=0)


class _Held:
    """A :class:`~oversmooth.importers.audit.dominance_inputs.HeldCases` stand-in: cases ``[start]``,
    finished on their own or only once waited for."""

    def __init__(self, start: int, log: list[str], finished: bool) -> None:
        self.start, self.log, self.finished = start, log, finished

    def advance(self, wait: bool = False) -> bool:
        return self.finished or wait

    def result(self) -> list[int]:
        self.log.append(f"dominance {self.start}")
        return [self.start]

    def cancel(self) -> None:
        self.log.append(f"cancel dominance {self.start}")


class _Work:
    """A batch's host work whose result names its batch (its per-head cases are ``[start]``).

    ``held``: its dominance cases may go on after it (on device attention), holding ``held``
    bytes, finished on their own when ``finished``; None: they are part of its result."""

    def __init__(
        self, start: int, log: list[str], held: int | None = None, finished: bool = False
    ) -> None:
        self.start, self.log, self.held = start, log, held
        self.dominance = _Held(start, log, finished)

    def detach(self) -> tuple[_Held, int] | None:
        return None if self.held is None else (self.dominance, self.held)

    def result(self):
        self.log.append(f"collect {self.start}")
        return ([self.start] if self.held is None else []), [], [], ([], [])

    def cancel(self) -> None:
        self.log.append(f"cancel {self.start}")


class _Batch:
    def __init__(self, size: int) -> None:
        self.batch_size = size


def test_pipelined_collects_in_batch_order_with_bounded_lookahead() -> None:
    log: list[str] = []

    def measure(pool, batch, start, outputs):
        log.append(f"measure {start}")
        return _Work(start, log)

    starts = [0, 2, 5, 6]
    batches = iter([(_Batch(size), {}) for size in (2, 3, 1, 4)])
    cases, exact, heads, (operating, parts) = pipelined(batches, measure, threads=2)
    assert cases == starts  # each batch starts where the last one ended, collected in order
    assert (exact, heads, operating, parts) == ([], [], [], [])
    # batch k is collected after it started, and before batch k + LOOKAHEAD_BATCHES + 1 starts
    for k, start in enumerate(starts):
        collected = log.index(f"collect {start}")
        assert collected > log.index(f"measure {start}")
        if k + LOOKAHEAD_BATCHES + 1 < len(starts):
            assert collected < log.index(f"measure {starts[k + LOOKAHEAD_BATCHES + 1]}")


@pytest.mark.parametrize("held_limit", [0, 1, 2, 5, 100])
def test_dominance_on_device_attention_goes_on_while_later_batches_run(held_limit: int) -> None:
    """Dominance cases that may outlive their batch are waited for only when more than
    ``held_limit`` bytes of attention are held (one byte a batch here, never finishing on
    their own) or at the end, and still come back in batch order."""
    log: list[str] = []
    outstanding: list[int] = []

    def measure(pool, batch, start, outputs):
        detached = sum(entry.startswith("collect") for entry in log)
        outstanding.append(detached - sum(entry.startswith("dominance") for entry in log))
        log.append(f"measure {start}")
        return _Work(start, log, held=1)

    sizes = [2, 3, 1, 4, 2, 2, 5]
    starts = [0, 2, 5, 6, 10, 12, 14]
    batches = iter([(_Batch(size), {}) for size in sizes])
    cases, *_ = pipelined(batches, measure, threads=1, held_limit=held_limit)
    assert cases == starts
    assert max(outstanding) == min(held_limit, len(sizes) - 1 - LOOKAHEAD_BATCHES)
    assert [e for e in log if e.startswith("dominance")] == [f"dominance {s}" for s in starts]


def test_finished_dominance_is_taken_in_after_the_next_batch() -> None:
    """Dominance cases that have finished are taken in at the first look after their batch,
    whatever room the limit leaves (so the budget hears of them early)."""
    log: list[str] = []

    def measure(pool, batch, start, outputs):
        log.append(f"measure {start}")
        return _Work(start, log, held=1, finished=True)

    batches = iter([(_Batch(1), {}) for _ in range(4)])
    cases, *_ = pipelined(batches, measure, threads=1, held_limit=10**9)
    assert cases == [0, 1, 2, 3]
    for k in range(4 - LOOKAHEAD_BATCHES - 1):
        assert log.index(f"dominance {k}") < log.index(f"measure {k + LOOKAHEAD_BATCHES + 1}")


def test_pipelined_cancels_the_held_dominance_when_a_batch_fails() -> None:
    log: list[str] = []

    def batches():
        for _ in range(3):
            yield _Batch(1), {}
        raise RuntimeError("inference failed")

    def measure(pool, batch, start, outputs):
        return _Work(start, log, held=1)

    with pytest.raises(RuntimeError, match="inference failed"):
        pipelined(batches(), measure, threads=1, held_limit=10)
    assert log == ["collect 0", "collect 1", "cancel 2", "cancel dominance 0", "cancel dominance 1"]


def test_only_attention_on_a_device_may_outlive_its_batch() -> None:
    """Host attention lives in buffers the runner writes over after the lookahead: its cases
    are never detached; device arrays (any that say they are) count their bytes."""

    class DeviceArray:
        __cuda_array_interface__: ClassVar[dict] = {}

        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

    assert _device_bytes([np.zeros((2, 3), dtype=np.float32)]) is None
    assert _device_bytes([DeviceArray(24), np.zeros(3)]) is None
    assert _device_bytes([DeviceArray(24), DeviceArray(40)]) == 64


def test_the_held_attention_is_a_share_of_the_gpus_free_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quarter of the free memory where every attention output stays on the GPU; nothing held
    where one comes to the host, where there is no attention, or without CuPy."""
    import types

    host_work = importlib.import_module("oversmooth.importers.audit.host_work")
    monkeypatch.setattr(host_work, "device_free_memory", lambda: 8_000)

    def session(attention: list[str], on_device: set[str]) -> Any:
        runner = types.SimpleNamespace(on_device=frozenset(on_device))
        return types.SimpleNamespace(attention=attention, runner=runner)

    assert held_attention_limit(session(["a", "b"], {"a", "b", "gram"})) == 2_000
    assert held_attention_limit(session(["a", "b"], {"a"})) == 0
    assert held_attention_limit(session([], {"gram"})) == 0
    monkeypatch.setattr(host_work, "device_free_memory", lambda: None)
    assert held_attention_limit(session(["a"], {"a"})) == 0


def test_pipelined_cancels_the_pending_work_when_a_batch_fails() -> None:
    log: list[str] = []

    def batches():
        yield _Batch(2), {}
        raise RuntimeError("inference failed")

    def measure(pool, batch, start, outputs):
        return _Work(start, log)

    with pytest.raises(RuntimeError, match="inference failed"):
        pipelined(batches(), measure, threads=1)
    assert log == ["cancel 0"]


def test_gram_matrices_on_a_device_are_one_task_and_one_solve_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where every layer's Gram matrices stayed on the GPU (here: said to have), a batch's layers
    are one pool task whose spectra are one stacked solve, and the metrics are bitwise the
    host path's (LAPACK solves each matrix of a stack on its own)."""
    session_module = importlib.import_module("oversmooth.importers.audit.host_work")
    reductions = importlib.import_module("oversmooth.importers.runtime.reductions")
    path, inputs = _saved_bert(tmp_path)
    on_host = audit(path, inputs, provider="cpu", batch_size=2)
    measure_layers = session_module.measure_layers
    solve = reductions.gram_eigenvalues
    tasks: list[tuple[int, ...]] = []
    solves: list[tuple[int, ...]] = []

    def task(*args: Any) -> int:
        tasks.append(tuple(args[-1]))
        return measure_layers(*args)

    def stacked(gram: np.ndarray) -> np.ndarray:
        solves.append(gram.shape)
        return solve(gram)

    monkeypatch.setattr(session_module, "measure_layers", task)
    monkeypatch.setattr(reductions, "gram_eigenvalues", stacked)
    monkeypatch.setattr(reductions.ReductionPlan, "grams_on_device", lambda plan, outputs: True)
    on_device = audit(path, inputs, provider="cpu", batch_size=2)
    batches = -(-len(inputs.labels) // 2)
    assert len(tasks) == len(solves) == batches
    assert all(len(layers) == len(tasks[0]) >= 2 for layers in tasks)
    assert all(shape[0] == len(tasks[0]) for shape in solves)  # every layer in one stack
    for metric in METRICS:
        np.testing.assert_array_equal(on_device.metrics[metric], on_host.metrics[metric])


# Moved from tests/importers/runtime/test_reductions.py.
def _saved_bert(folder: Path) -> tuple[Path, Inputs]:
    """The ``bert_legacy`` builder model saved in ``folder``, and its inputs."""
    path = folder / "bert.onnx"
    model, inputs = builder_model_and_inputs("bert_legacy", SEED)
    onnx.save(model.proto, path)
    return path, inputs


def test_dominance_cases_do_not_depend_on_the_worker_threads(tmp_path: Path) -> None:
    path, inputs = _saved_bert(tmp_path)
    results = [
        audit(path, inputs, provider="cpu", batch_size=1, threads=threads).dominance
        for threads in (1, 3)
    ]
    assert results[0] == results[1]
    assert len(results[0]) > 0


def test_the_depth_step_and_the_attribution_are_a_task_per_input_and_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each is a few dense eigensolves per head: one pool task per (input, block) spreads them
    over the threads (one task per batch made the first batch wait for them in a row)."""
    host_work = importlib.import_module("oversmooth.importers.audit.host_work")
    calls: dict[str, list[list[tuple[int, int]]]] = {"heads": [], "attribution": []}

    def recorded(name: str, function: Any) -> Any:
        def task(problems: Any, *args: Any) -> Any:
            calls[name].append([(p.item, p.layer) for p in problems])
            return function(problems, *args)

        return task

    monkeypatch.setattr(host_work, "head_cases", recorded("heads", host_work.head_cases))
    monkeypatch.setattr(
        host_work, "sublayer_cases", recorded("attribution", host_work.sublayer_cases)
    )
    path, inputs = _saved_bert(tmp_path)
    audit(path, inputs, provider="cpu", batch_size=2)
    blocks = len({layer for call in calls["heads"] for _, layer in call})
    assert blocks >= 2
    assert sorted(c[0] for c in calls["heads"]) == [(0, b) for b in range(blocks)]
    assert len(calls["attribution"]) > 0
    assert all(len(call) == 1 for call in calls["heads"] + calls["attribution"])


def test_each_layers_metrics_are_a_task_of_their_own_and_do_not_depend_on_the_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's layers are measured one per pool task (so its Gram spectra spread over every
    worker thread, not one), and the metrics are bitwise those of a single worker."""
    session_module = importlib.import_module("oversmooth.importers.audit.host_work")
    measure_layers = session_module.measure_layers
    calls: list[tuple[int, int, tuple[int, ...]]] = []

    def recorded(*args: Any) -> int:
        calls.append((threads, args[2], tuple(args[-1])))  # the batch's start, its layers
        return measure_layers(*args)

    monkeypatch.setattr(session_module, "measure_layers", recorded)
    path, inputs = _saved_bert(tmp_path)
    results = []
    for threads in (1, 3):
        results.append(audit(path, inputs, provider="cpu", batch_size=2, threads=threads))
    assert all(len(layers) == 1 for _, _, layers in calls)
    per_batch: dict[tuple[int, int], list[int]] = {}
    for threads, start, (layer,) in calls:
        per_batch.setdefault((threads, start), []).append(layer)
    assert {(threads, start) for threads, start in per_batch} == {
        (threads, start) for threads in (1, 3) for start in range(0, len(inputs.labels), 2)
    }
    layers = per_batch[(1, 0)]
    assert len(layers) >= 2
    assert len(set(layers)) == len(layers)
    assert all(sorted(measured) == sorted(layers) for measured in per_batch.values())
    for metric in METRICS:
        np.testing.assert_array_equal(results[1].metrics[metric], results[0].metrics[metric])


# Moved from tests/importers/runtime/test_reductions.py.
def test_the_pipelined_audit_equals_the_sequential_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reducing batch k while batch k+1 runs changes nothing: metrics and cases as one at a time
    (a batch's arrays must not be written over by the next run while they are being reduced)."""
    session_module = importlib.import_module("oversmooth.importers.audit.session")
    host_work = importlib.import_module("oversmooth.importers.audit.host_work")
    measure_layers = host_work.measure_layers

    def late_measure(*args: Any) -> int:  # the next batch runs before this batch is read
        time.sleep(0.05)
        return measure_layers(*args)

    monkeypatch.setattr(host_work, "measure_layers", late_measure)
    path, inputs = _saved_bert(tmp_path)
    results = []
    for lookahead in (0, 1, 3):  # the runner's reused outputs and the pipeline's lookahead
        monkeypatch.setattr(session_module, "LOOKAHEAD_BATCHES", lookahead)
        monkeypatch.setattr(host_work, "LOOKAHEAD_BATCHES", lookahead)
        results.append(audit(path, inputs, provider="cpu", batch_size=1))
    for result in results[1:]:
        assert result.dominance == results[0].dominance
        for metric in METRICS:
            np.testing.assert_array_equal(result.metrics[metric], results[0].metrics[metric])


# Moved from tests/importers/runtime/test_reductions.py.
def _planned_gram(model: OnnxModel, inputs: Inputs) -> str:
    blocks = [block_weights(model, block) for block in find_attention_blocks(model).blocks]
    return audit_session(model, blocks, inputs, attention=False, provider="cpu").plan.gram


# Moved from tests/importers/runtime/test_reductions.py.
def _free_sequence(model: OnnxModel) -> OnnxModel:
    """The model with a symbolic sequence axis (the builders fix it) on its 2-d inputs."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    for value in proto.graph.input:
        dims = value.type.tensor_type.shape.dim
        if len(dims) == 2:
            dims[1].dim_param = "sequence"
    return model_from_proto(proto)


# Moved from tests/importers/runtime/test_reductions.py.
@pytest.mark.parametrize(
    ("name", "tokens", "gram"),
    [
        ("gpt2_fused_qkv", 6, "tokens"),  # no mask: T from the graph's shape arithmetic
        ("gpt2_fused_qkv", 40, "features"),  # T = 40 > D = 32
        ("bert_legacy", 6, "tokens"),  # T from the mask
        ("bert_legacy", 30, "features"),  # T = 30 > D = 24
        ("vit_prenorm_layerscale", None, "tokens"),  # the builder's (2, 5, 24) embeddings
    ],
)
def test_the_audit_reduces_the_smaller_gram_matrix(
    name: str, tokens: int | None, gram: str
) -> None:
    """T×T or D×D give the same singular values; the smaller one costs less everywhere."""
    model, inputs = builder_model_and_inputs(name, SEED)
    if tokens is not None:
        model = _free_sequence(model)
        inputs = random_inputs(model.inputs, seed=0, batch=2, seq=tokens, vocab_size=20)
        assert next(iter(inputs.feeds.values())).shape == (2, tokens)
    assert _planned_gram(model, inputs) == gram


# Moved from tests/importers/runtime/test_reductions.py.
@pytest.mark.realmodel
@pytest.mark.parametrize("name", ZOO)
def test_zoo_audits_reduce_the_token_gram_matrix(name: str) -> None:
    """DINOv2: 257 tokens against 384 features, known only through the graph's own shape
    arithmetic (ONNX shape inference loses the token count in its position-embedding
    interpolation); MiniLM: the bundled sentences' mask."""
    model = load_model(require_real_model(name))
    inputs = default_inputs(model.inputs, get_model(name))
    assert _planned_gram(model, inputs) == "tokens"


@functools.cache
def _identity_layer_runner(masked: bool, prefix: int, gram: str) -> tuple[Runner, ReductionPlan]:
    """The reductions of one (2, 5, 3) float64 layer that is the graph's own input."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [2, 5, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [2, 5, 3])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    proto = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8
    )
    model = model_from_proto(proto)
    plan = plan_reductions(model, ["x"], masked=masked, prefix=prefix, gram=gram)  # type: ignore[arg-type]
    return Runner(model, expose=[], extension=plan.extension, provider="cpu"), plan


_ENTRIES = st.sampled_from([np.nan, np.inf, -np.inf, 1e155, -1e160, 1e153, 3.0, -0.5])


@pytest.mark.parametrize("gram", ["tokens", "features"])
@pytest.mark.parametrize(("masked", "prefix"), [(False, 0), (False, 1), (True, 0), (True, 2)])
@given(
    poisoned=st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 4), st.integers(0, 2), _ENTRIES), max_size=4
    ),
    mask=st.lists(st.booleans(), min_size=10, max_size=10),
)
def test_the_statistics_flag_every_item_whose_gram_matrix_is_not_finite(
    masked: bool, prefix: int, gram: str, poisoned: list, mask: list[bool]
) -> None:
    """The finite check reads a layer's eight statistics, never its Gram matrix
    (:func:`nonfinite_layer_items`): an item is refused exactly when its Gram matrix or its
    statistics hold a NaN or an infinity, or its ``‖Xm‖_F²`` passes the limit below which no Gram
    entry can overflow. NaN, infinities and huge entries anywhere, in counted rows or not."""
    counted = np.array(mask).reshape(2, 5) if masked else np.ones((2, 5), dtype=bool)
    assume(counted[:, prefix:].any(axis=1).all())  # no counted token: refused before (n = 0)
    runner, plan = _identity_layer_runner(masked, prefix, gram)
    x = np.random.default_rng(len(poisoned)).standard_normal((2, 5, 3))
    for item, token, feature, value in poisoned:
        x[item, token, feature] = value
    feeds = {"x": x, **plan.mask_feed(np.array(mask).reshape(2, 5))}
    with np.errstate(all="ignore"):
        outputs = runner.collect(feeds)
    scalars, gram_matrix = outputs[plan.scalars_name(0)], outputs[plan.gram_name(0)]
    flagged = nonfinite_layer_items(scalars)
    not_finite = ~np.isfinite(gram_matrix).all(axis=(1, 2)) | ~np.isfinite(scalars).all(axis=1)
    stats = TokenStatistics.from_packed(scalars)
    with np.errstate(all="ignore"):
        large = stats.hfc_sq + stats.lfc_sq > GRAM_NORM_SQ_LIMIT
    np.testing.assert_array_equal(flagged, not_finite | large)
    non_finite = ~np.isfinite(x).all(axis=(1, 2))
    with np.errstate(invalid="ignore"):
        touched = non_finite | (np.abs(x) > 1e150).any(axis=(1, 2))
    assert not flagged[~touched].any()
    assert flagged[non_finite].all()


@pytest.mark.parametrize("gram", ["tokens", "features"])
def test_a_layer_near_float64s_top_is_refused_only_above_the_limit(gram: str) -> None:
    """All of ``‖Xm‖_F²`` in one entry, where Cauchy–Schwarz is tight (the Gram's diagonal entry
    is ``‖Xm‖_F²`` itself): at 2^1019 the Gram matrix is finite and the item passes; at 2^1021.5,
    past the limit, it is refused although its Gram matrix is still finite (the limit's margin);
    at 2^1025 the Gram overflows and the statistics with it."""
    runner, plan = _identity_layer_runner(False, 0, gram)
    for exponent, refused in ((1019, False), (1021.5, True), (1025, True)):
        x = np.zeros((2, 5, 3))
        x[1, 2, 1] = 2.0 ** (exponent / 2)
        with np.errstate(all="ignore"):
            outputs = runner.collect({"x": x})
        flagged = nonfinite_layer_items(outputs[plan.scalars_name(0)])
        assert flagged.tolist() == [False, refused], exponent
        assert np.isfinite(outputs[plan.gram_name(0)]).all() == (exponent < 1024)
