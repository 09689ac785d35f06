"""A match attempt is a value: each Softmax candidate is matched with its own shape context over a
shared, pin-free basis (:mod:`oversmooth.importers.match`: ``match_outcome``, ``ProbeBases``,
``retry_sizes``), so the order in which Softmaxes are matched cannot change any answer."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.match import (
    AttentionBlock,
    MatchFailure,
    ProbeBases,
    RejectCode,
    match_outcome,
    retry_sizes,
)
from oversmooth.importers.match.core import Matcher
from oversmooth.importers.match.limits import LONG_PROBE_SEQUENCE, PROBE_BATCH, PROBE_SEQUENCE
from oversmooth.importers.match.walker import RejectError
from tests.importers.builders import NEAR_MISSES, VARIANTS
from tests.importers.family_corpus import MANIFEST, load_fixture

DEFAULT = (PROBE_BATCH, PROBE_SEQUENCE)


def _canonical(value: Any) -> Any:
    """A comparable, complete form of a match outcome (arrays by dtype, shape and every entry)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _canonical(getattr(value, field.name))
            for field in dataclasses.fields(value)
        }
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tolist())
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _canonical(item) for key, item in value.items()}
    return value


def _outcomes(model: OnnxModel, order: list[int]) -> dict[str, Any]:
    """Every Softmax's outcome, matched in ``order`` (positions into the graph's Softmax list)
    over one shared set of bases, keyed by the Softmax's label."""
    softmaxes = model.index.nodes_of_type("Softmax")
    bases = ProbeBases(model.index)
    found = {}
    for position in order:
        outcome = match_outcome(bases, softmaxes[position])
        found[softmaxes[position].label] = _canonical(outcome)
    return found


def _models() -> list[Any]:
    params = [pytest.param(entry["file"], id=entry["id"]) for entry in MANIFEST["fixtures"]]
    params += [pytest.param(f"variant:{name}", id=f"variant-{name}") for name in VARIANTS]
    params += [pytest.param(f"near:{tag}", id=f"near-{tag}") for tag in NEAR_MISSES]
    return params


def _load(source: str) -> OnnxModel:
    kind, _, name = source.partition(":")
    if kind == "variant":
        return model_from_proto(VARIANTS[name](0).model)
    if kind == "near":
        return model_from_proto(NEAR_MISSES[name](0).model)
    return load_fixture(source)


@pytest.mark.parametrize("source", _models())
def test_matching_order_changes_no_answer(source: str) -> None:
    """Graph order, reversed and shuffled: the same outcome for every Softmax, entry for entry."""
    model = _load(source)
    count = len(model.index.nodes_of_type("Softmax"))
    forward = list(range(count))
    shuffled = forward.copy()
    random.Random(count).shuffle(shuffled)
    expected = _outcomes(model, forward)
    assert _outcomes(model, forward[::-1]) == expected
    assert _outcomes(model, shuffled) == expected


def test_two_attempts_share_the_basis_and_never_a_pin() -> None:
    model = model_from_proto(VARIANTS[sorted(VARIANTS)[0]](0).model)
    basis = ProbeBases(model.index).at(DEFAULT)
    first, second = Matcher(basis), Matcher(basis)
    for attempt in (first, second):
        for part in (attempt.layout, attempt.stream, attempt.rotary):
            assert part.basis is basis
            assert part.context is attempt.context  # one attempt's parts share its pins
    assert first.context is not second.context
    tensor = model.index.nodes_of_type("Softmax")[0].outputs[0]
    before = second.context.shape(tensor)
    first.context.set_shape(tensor, (5, 7, 11))
    assert Matcher(basis).context.shape(tensor) == before != (5, 7, 11)
    assert second.context.shape(tensor) == before


def test_an_attempt_leaves_the_basis_as_it_found_it() -> None:
    """Matching a block pins shapes in its own context only: a later attempt's context starts
    empty, and matching the same Softmax again gives the same block."""
    model = model_from_proto(VARIANTS[sorted(VARIANTS)[0]](0).model)
    bases = ProbeBases(model.index)
    softmax = model.index.nodes_of_type("Softmax")[0]
    once = match_outcome(bases, softmax)
    assert isinstance(once, AttentionBlock)
    assert Matcher(bases.at(DEFAULT)).context._memo == {}
    assert _canonical(match_outcome(bases, softmax)) == _canonical(once)


def _reject(code: RejectCode, sizes: tuple[int, int] | None = None) -> RejectError:
    return RejectError(code, "reason", probe_sizes=sizes)


@pytest.mark.parametrize(
    ("reject", "expected"),
    [
        (_reject(RejectCode.HEAD_RESHAPE, (1, 197)), ((1, 197), (197, 1))),
        (_reject(RejectCode.HEAD_RESHAPE, (5, 5)), ((5, 5),)),
        (
            _reject(RejectCode.HEAD_RESHAPE, (PROBE_SEQUENCE, PROBE_BATCH)),
            ((PROBE_SEQUENCE, PROBE_BATCH),),
        ),
        (_reject(RejectCode.HEAD_RESHAPE), ((PROBE_BATCH, LONG_PROBE_SEQUENCE),)),
        (_reject(RejectCode.HEAD_RESHAPE, DEFAULT), ((PROBE_BATCH, LONG_PROBE_SEQUENCE),)),
        (_reject(RejectCode.HEAD_LAYOUT), ()),
    ],
)
def test_retry_sizes(reject: RejectError, expected: tuple[tuple[int, int], ...]) -> None:
    assert retry_sizes(reject) == expected


def test_a_failure_is_reported_once_as_a_match_failure() -> None:
    model = model_from_proto(NEAR_MISSES["kv_from_other_input"](0).model)
    outcome = match_outcome(ProbeBases(model.index), model.index.nodes_of_type("Softmax")[0])
    assert isinstance(outcome, MatchFailure)


def _bert_with(mutate) -> OnnxModel:
    model = VARIANTS["bert_legacy"](0).model
    mutate(model)
    return model_from_proto(model)


def _set_softmax_axis(model: Any) -> None:
    from onnx import helper

    for node in model.graph.node:
        if node.op_type == "Softmax":
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("axis", "last"))


def _drop_first_reshape_shape(model: Any) -> None:
    reshape = next(node for node in model.graph.node if node.op_type == "Reshape")
    del reshape.input[1:]


@pytest.mark.parametrize(
    ("mutate", "code", "reason"),
    [
        (_set_softmax_axis, RejectCode.MALFORMED, "Softmax axis attribute is b'last'"),
        (_drop_first_reshape_shape, RejectCode.HEAD_RESHAPE, "into an unknown shape"),
    ],
    ids=["softmax-axis-a-string", "reshape-without-its-shape"],
)
def test_a_malformed_node_is_a_deliberate_rejection_not_the_catch_all(mutate, code, reason) -> None:
    """Both reached the per-candidate catch-all as a bare ValueError/IndexError ("malformed
    graph around it: invalid literal for int()..."); each is now its finder's own rejection."""
    model = _bert_with(mutate)
    bases = ProbeBases(model.index)
    outcomes = [match_outcome(bases, s) for s in model.index.nodes_of_type("Softmax")]
    failures = [outcome for outcome in outcomes if isinstance(outcome, MatchFailure)]
    assert failures
    assert {failure.code for failure in failures} == {code}
    assert all(reason in failure.reason for failure in failures)
    assert not any("malformed graph around it" in failure.reason for failure in failures)
