"""The layers' reductions stacked along the batch axis: a measurement, not yet the audit's design.

The audit's session reduces each layer by its own chain of about 28 small nodes
(:mod:`oversmooth.importers.runtime.reductions`): 1,250 nodes for DINOv2's 25 layer tensors,
533 for MiniLM-L6-int8's 13. On a GPU each node costs its dispatch (about 23 µs on an H200,
whatever it computes). Layers of one shape can instead be concatenated along the batch axis and
reduced by one chain: 50 and 42 nodes. This builds both for the same layers (every stream and
attention-sublayer tensor the audit reduces, without its late reads) so that
``python -m benchmarks ops`` can profile them side by side (variants ``layers`` and ``stacked``),
and says whether the stacked statistics and Gram matrices are bit for bit the per-layer ones.

The stacked chain's intermediates are as many times larger as there are layers (DINOv2 at batch
64: 1.3 GB of float64 each), and stacking is only sound where every layer has the same shape;
both are why this is a benchmark first. A mask (text models) is concatenated as often inside the
graph, so the feeds are the audit's own.

Public API
----------
stacked_calls
    Each variant's session and one call of it (``layers``, ``stacked``), and whether the two
    give the same bits; None for a model whose layers are not all batch-first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

from benchmarks.bench_runner import _repeated
from oversmooth.importers.audit.session import attention_sublayer_tensor, layer_tensors
from oversmooth.importers.graph import OnnxModel, model_from_proto
from oversmooth.importers.inputs.feeds import Inputs
from oversmooth.importers.match import find_attention_blocks
from oversmooth.importers.runtime.reductions import MASK_INPUT, ReductionPlan, plan_reductions
from oversmooth.importers.runtime.runner import Runner
from oversmooth.importers.weights import block_weights

__all__ = ["STACKED", "StackedCalls", "stacked_calls"]

#: The name of the concatenated layers, and of the mask repeated as often.
STACKED = "oversmooth.bench.stacked"
_STACKED_MASK = "oversmooth.bench.stacked_mask"


@dataclasses.dataclass(frozen=True)
class StackedCalls:
    """The two variants' sessions and calls, and how their outputs compare.

    Attributes
    ----------
    calls : dict of str to (session, call)
        ``layers`` (a chain per layer) and ``stacked`` (one chain), as ``variant_calls`` gives
        the other variants.
    nodes : dict of str to int
        The nodes each variant adds to the model.
    same_bits : bool
        Every layer's eight statistics and Gram matrices equal bit for bit.
    largest_difference : float
        The largest relative difference between them (0 when the bits agree).
    """

    calls: dict[str, tuple[Any, Callable[[], object]]]
    nodes: dict[str, int]
    same_bits: bool
    largest_difference: float


def _with_stacked_layers(graph: OnnxModel, layers: list[str]) -> OnnxModel:
    """``graph`` with one more tensor, :data:`STACKED`: ``layers`` concatenated along axis 0."""
    proto = onnx.ModelProto()
    proto.CopyFrom(graph.session_model())
    # A graph input concatenated along an axis, even through an Identity, reads as a KV cache
    # (oversmooth.importers.graph.kv_cache): such a layer is multiplied by one first, exactly.
    given = {spec.name: spec.dtype for spec in graph.inputs}
    parts = []
    for k, layer in enumerate(layers):
        if layer not in given:
            parts.append(layer)
            continue
        one = onnx.numpy_helper.from_array(np.ones((), given[layer]), f"{STACKED}.one.{k}")
        proto.graph.initializer.append(one)
        parts.append(f"{STACKED}.{k}")
        proto.graph.node.append(onnx.helper.make_node("Mul", [layer, one.name], [parts[-1]]))
    proto.graph.node.append(onnx.helper.make_node("Concat", parts, [STACKED], axis=0))
    return model_from_proto(proto, path=graph.path)


def _mask_repeated(plan: ReductionPlan, times: int) -> ReductionPlan:
    """``plan`` reading the fed (B, T) mask repeated ``times`` along the batch axis."""
    nodes = [onnx.helper.make_node("Concat", [MASK_INPUT] * times, [_STACKED_MASK], axis=0)]
    for node in plan.extension.nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [_STACKED_MASK if name == MASK_INPUT else name for name in copy.input]
        nodes.append(copy)
    return dataclasses.replace(
        plan, extension=dataclasses.replace(plan.extension, nodes=tuple(nodes))
    )


def _largest_difference(
    per_layer: dict[str, np.ndarray],
    stacked: dict[str, np.ndarray],
    plans: tuple[ReductionPlan, ReductionPlan],
    layers: int,
) -> float:
    """The largest relative difference between each layer's outputs and its slice of the stack."""
    each, one = plans
    batch = len(per_layer[each.scalars_name(0)])
    largest = 0.0
    for layer in range(layers):
        rows = slice(layer * batch, (layer + 1) * batch)
        for own, joint in ((each.scalars_name, one.scalars_name), (each.gram_name, one.gram_name)):
            a, b = per_layer[own(layer)], stacked[joint(0)][rows]
            scale = np.maximum(np.abs(a), np.finfo(float).tiny)
            largest = max(largest, float(np.max(np.abs(a - b) / scale, initial=0.0)))
    return largest


def stacked_calls(
    graph: OnnxModel, inputs: Inputs, provider: str, batch: int, prefix: int
) -> StackedCalls | None:
    """The per-layer and the stacked reductions of ``graph``'s layers (``prefix`` leading tokens
    left out, as the model's zoo entry says), on ``inputs`` repeated to fill ``batch``; None when
    a layer is time-major (its stack would need a transpose per layer first)."""
    blocks = [block_weights(graph, block) for block in find_attention_blocks(graph).blocks]
    if any(block.time_major for block in blocks):
        return None
    items = _repeated(inputs, batch)
    mids = [attention_sublayer_tensor(block) for block in blocks]
    layers = layer_tensors(blocks) + [str(mid) for mid in mids if mid is not None]
    options = {
        "prefix": prefix,
        "masked": items.token_mask is not None,
        "gram": "tokens",
    }
    each = plan_reductions(graph, layers, **options)  # type: ignore[arg-type]
    joint_graph = _with_stacked_layers(graph, layers)
    one = plan_reductions(joint_graph, [STACKED], **options)  # type: ignore[arg-type]
    feeds = dict(items.feeds)
    if items.token_mask is not None:
        one = _mask_repeated(one, len(layers))
        feeds.update(each.mask_feed(items.token_mask))
    runners = {
        "layers": Runner(graph, expose=[], extension=each.extension, provider=provider),  # type: ignore[arg-type]
        "stacked": Runner(joint_graph, expose=[], extension=one.extension, provider=provider),  # type: ignore[arg-type]
    }
    outputs = {variant: runner.collect(feeds) for variant, runner in runners.items()}
    difference = _largest_difference(
        outputs["layers"], outputs["stacked"], (each, one), len(layers)
    )

    def call(runner: Runner) -> Callable[[], object]:
        return lambda: list(runner.run(feeds, reuse_outputs=True))

    return StackedCalls(
        calls={variant: (runner.session, call(runner)) for variant, runner in runners.items()},
        nodes={"layers": len(each.extension.nodes), "stacked": len(one.extension.nodes)},
        same_bits=difference == 0.0,
        largest_difference=difference,
    )
