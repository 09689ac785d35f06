"""A merged decoder read through its no-cache branch (importers.graph.branches) on hand-made ``If``
graphs: only an ``If`` switching a cache on a graph input is inlined, whichever branch is the
no-cache one; a switch read elsewhere, or a branch redefining an outer tensor, leaves the graph as
it is; the note names the caches. (The corpus' merged export: tests/importers/test_kv_cache.py.)"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from oversmooth.importers.graph import GraphIndex, model_from_proto
from oversmooth.importers.graph.branches import CacheBranch, read_no_cache_branch


def _if_graph(*, switch: str, then_reads: str) -> onnx.ModelProto:
    """``If(switch)`` whose else branch returns ``x · W`` and whose then branch returns
    ``Concat(then_reads, x · W)``; ``switch`` is ``"input"`` (a bool graph input) or
    ``"computed"`` (``x`` compared with 0)."""
    weight = helper.make_tensor("W", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())

    def branch(name: str, nodes: list) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)
        return helper.make_graph(nodes, name, [], [out])

    plain = branch("plain", [helper.make_node("MatMul", ["x", "W"], ["plain_out"])])
    cached = branch(
        "cached",
        [
            helper.make_node("MatMul", ["x", "W"], ["cached_new"]),
            helper.make_node("Concat", [then_reads, "cached_new"], ["cached_out"], axis=2),
        ],
    )
    nodes = []
    condition = "use_cache"
    if switch == "computed":
        nodes.append(helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0))
        nodes.append(helper.make_node("Greater", ["top", "W_zero"], ["use_cache"]))
    nodes.append(helper.make_node("If", [condition], ["y"], then_branch=cached, else_branch=plain))
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1, "t", 4]),
        helper.make_tensor_value_info("past", TensorProto.FLOAT, ["b", 1, "p", 4]),
    ]
    if switch == "input":
        inputs.append(helper.make_tensor_value_info("use_cache", TensorProto.BOOL, [1]))
    zero = helper.make_tensor("W_zero", TensorProto.FLOAT, [], [0.0])
    graph = helper.make_graph(
        nodes,
        "merged",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, zero],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("switch", "then_reads", "rewritten"),
    [
        ("input", "past", True),  # the cache switch: read through the plain branch
        ("input", "x", False),  # both branches read the same inputs: nothing to choose
        ("computed", "past", False),  # a condition the graph computes is no caller's switch
    ],
)
def test_only_an_if_switching_a_cache_on_a_graph_input_is_inlined(
    switch: str, then_reads: str, rewritten: bool
) -> None:
    proto = _if_graph(switch=switch, then_reads=then_reads)
    model = model_from_proto(proto)
    inlined, done = read_no_cache_branch(proto, GraphIndex(proto.graph))
    assert (inlined is not None) == rewritten == bool(model.branches)
    if rewritten:
        assert done[0].caches == ("past",)
        assert [spec.name for spec in model.inputs] == ["x"]
        assert [node.op_type for node in model.index.nodes] == ["MatMul", "Identity"]  # -> y


def _if_node(proto: onnx.ModelProto) -> onnx.NodeProto:
    return next(node for node in proto.graph.node if node.op_type == "If")


def test_the_then_branch_is_kept_when_it_is_the_one_without_the_cache() -> None:
    proto = _if_graph(switch="input", then_reads="past")
    for attribute in _if_node(proto).attribute:  # swap: the cache is read by the else branch
        attribute.name = {"then_branch": "else_branch", "else_branch": "then_branch"}[
            attribute.name
        ]
    inlined, (done,) = read_no_cache_branch(proto, GraphIndex(proto.graph))
    assert inlined is not None
    assert (done.node, done.switch, done.branch, done.caches) == (
        "If#0",
        "use_cache",
        "then",
        ("past",),
    )
    assert [value.name for value in inlined.graph.input] == ["x"]


def test_a_switch_read_elsewhere_is_not_the_callers_to_drop() -> None:
    proto = _if_graph(switch="input", then_reads="past")
    proto.graph.node.append(helper.make_node("Not", ["use_cache"], ["no_cache"]))
    proto.graph.output.append(helper.make_tensor_value_info("no_cache", TensorProto.BOOL, None))
    assert read_no_cache_branch(proto, GraphIndex(proto.graph)) == (None, ())


def test_a_branch_defining_a_tensor_the_graph_defines_is_not_inlined() -> None:
    proto = _if_graph(switch="input", then_reads="past")
    proto.graph.node.insert(0, helper.make_node("Identity", ["x"], ["plain_out"]))
    assert read_no_cache_branch(proto, GraphIndex(proto.graph)) == (None, ())


def test_the_original_model_is_not_changed() -> None:
    proto = _if_graph(switch="input", then_reads="past")
    before = proto.SerializeToString()
    inlined, _ = read_no_cache_branch(proto, GraphIndex(proto.graph))
    assert inlined is not None
    assert proto.SerializeToString() == before


def test_the_note_names_four_caches_and_counts_the_rest() -> None:
    caches = tuple(f"past_key_values.{i}.key" for i in range(6))
    note = CacheBranch("optimum::if", "use_cache_branch", "else", caches).note()
    assert note.startswith(
        "merged decoder read through the no-cache branch (else) of If 'optimum::if' on "
        "'use_cache_branch': the model without a cache (past length 0); the KV cache input(s) "
    )
    assert "'past_key_values.3.key' and 2 more, read only by the other branch" in note
    assert "'past_key_values.4.key'" not in note
