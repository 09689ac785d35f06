"""How items are cut into onnxruntime calls, so that no item's numbers depend on how it was batched.

Two properties of a graph decide it:

- **A fixed batch size.** A graph whose inputs fix axis 0 (an export traced at batch 1 or 32) runs
  at that size: a short batch is filled with copies of its last item, and the filler's outputs are
  dropped (:func:`fill`, :func:`drop_filler`). It is never refused for the caller's batch size.
- **Batch-mixing nodes.** Some nodes make one item's result depend on the other items of its call:
  ``DynamicQuantizeLinear`` takes its scale and zero point over the whole tensor, batch included
  (onnxruntime's dynamically quantised int8 models), and a reduction, ``ArgMax``, ``Softmax``...
  along axis 0 mixes items outright. :func:`batch_mixing_nodes` finds them structurally, on the
  tensors computed from the graph inputs (shape arithmetic excluded); the audit then runs every item
  alone (:func:`items_per_call`), filled to a fixed batch with copies of itself.

A reduction after a ``Reshape`` that folds the batch into another axis is not recognised.

A third property shows only at run time: **a batch fixed inside the graph.** A torch dynamo export
may spell batch 1 in a ``Reshape`` (``view(1, T, heads, d_head)``) while its inputs declare a
symbolic batch; onnxruntime then fails on every call of more than one input. Such a call is
retried one input per call (:class:`OnePerCall`); when the inputs run alone, every later call
does so too, and the runner's record says why.

Public API
----------
fixed_batch
    The batch size a graph's inputs fix, or None.
batch_mixing_nodes
    The nodes whose outputs mix the items of a batch.
items_per_call
    How many items the audit puts in one onnxruntime call, and the notes saying why.
calls
    Consecutive calls over batch-first feeds: item range and the (filled) feeds.
drop_filler, batch_count, call_size
    Outputs without the filler rows; the number of items of feeds; items per call.
OnePerCall, run_notes
    Calls of several inputs retried one input per call when onnxruntime refuses them; the note
    a runner's record then carries.
run_batches
    Run a :class:`~oversmooth.importers.runtime.runner.Runner` over inputs read batch by batch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from oversmooth.importers.errors import ImporterInputError, RunnerError
from oversmooth.importers.graph import GraphInput, OnnxModel
from oversmooth.importers.inputs.feeds import Inputs, check_finite
from oversmooth.importers.notes import Note
from oversmooth.simulator.backend import array_module
from oversmooth.simulator.limits import check_elements

__all__ = [
    "OnePerCall",
    "batch_count",
    "batch_mixing_nodes",
    "call_size",
    "calls",
    "drop_filler",
    "fixed_batch",
    "items_per_call",
    "run_batches",
    "run_notes",
]

#: Ops whose result for one item depends on every item of the tensor, whatever their attributes.
_WHOLE_TENSOR_OPS = frozenset(
    {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}
)
#: Reductions: over their ``axes`` (attribute or second input), over every axis without one.
_REDUCTIONS = frozenset(
    {
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
    }
)
#: Ops acting along one ``axis`` attribute, with its default.
_AXIS_OPS = {
    "ArgMax": 0,
    "ArgMin": 0,
    "Softmax": -1,
    "LogSoftmax": -1,
    "Hardmax": -1,
    "LayerNormalization": -1,
    "LpNormalization": -1,
    "TopK": -1,
}
#: Ops whose outputs describe shapes, not values: the tensors after them are not item data.
_SHAPE_OPS = frozenset({"Shape", "Size"})
#: The node an onnxruntime run failed in, as its message names it ("... while running Reshape
#: node. Name:'node_view' Status Message: ...").
_FAILED_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")


def fixed_batch(specs: Sequence[GraphInput]) -> int | None:
    """The batch size (axis 0) the graph inputs fix, or None when it is symbolic.

    Raises
    ------
    ImporterInputError
        Two inputs fix different batch sizes.
    """
    sizes = {spec.shape[0] for spec in specs if spec.shape and isinstance(spec.shape[0], int)}
    if len(sizes) > 1:
        raise ImporterInputError(
            f"the model's inputs must agree on one batch size; they fix {sorted(sizes)}"
        )
    return sizes.pop() if sizes else None


def _item_data(model: OnnxModel) -> set[str]:
    """Tensors computed from the graph inputs' values (not through Shape/Size), in graph order."""
    data = {spec.name for spec in model.inputs}
    for node in model.index.nodes:
        if node.op_type not in _SHAPE_OPS and any(name in data for name in node.inputs):
            data.update(name for name in node.outputs if name)
    return data


def _axes(node: Any, model: OnnxModel) -> list[int] | None:
    """A reduction's axes (None: every axis), from its attribute or its constant second input."""
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        value = model.index.constant_value(node.inputs[1])
        if value is None:
            return [0]  # axes computed at run time: assume the worst
        axes = np.ravel(value).tolist()
    if axes is None or len(axes) == 0:
        return [] if node.attr("noop_with_empty_axes", 0) else None
    return [int(axis) for axis in axes]


def _mixes_items(node: Any, model: OnnxModel) -> bool:
    if node.op_type in _WHOLE_TENSOR_OPS:
        return True
    if node.op_type in _REDUCTIONS:
        axes = _axes(node, model)
        return axes is None or 0 in axes
    if node.op_type in _AXIS_OPS:
        return int(node.attr("axis", _AXIS_OPS[node.op_type])) == 0
    if node.op_type == "CumSum":
        axis = model.index.constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
        return axis is None or int(np.ravel(axis)[0]) == 0
    if node.op_type == "BatchNormalization":
        return bool(node.attr("training_mode", 0))
    return False


def batch_mixing_nodes(model: OnnxModel) -> list[Any]:
    """Nodes whose output for one item depends on the other items of its batch.

    ``DynamicQuantizeLinear`` and onnxruntime's dynamic-quantisation ops (scale over the whole
    tensor); reductions over axis 0 or over every axis; ``ArgMax``, ``Softmax``, ``LayerNormalization``
    ... along axis 0; ``CumSum`` along axis 0; training-mode ``BatchNormalization``. Only nodes
    reading item data count (:func:`_item_data`): a reduction of weights or of a shape does not.
    """
    data = _item_data(model)
    return [
        node
        for node in model.index.nodes
        if any(name in data for name in node.inputs) and _mixes_items(node, model)
    ]


def items_per_call(model: OnnxModel, requested: int) -> tuple[int, list[str]]:
    """Items per onnxruntime call for the audit, and notes saying why it is not ``requested``.

    One item when the graph has batch-mixing nodes (filled to a fixed batch with copies of itself);
    else the batch size the graph fixes; else ``requested``.
    """
    fixed = fixed_batch(model.inputs)
    mixing = Counter(node.op_type for node in batch_mixing_nodes(model))
    if mixing:
        found = ", ".join(f"{count} {op}" for op, count in sorted(mixing.items()))
        filled = (
            f", filled to the graph's fixed batch of {fixed} with copies of itself"
            if (fixed or 1) > 1
            else ""
        )
        return 1, [
            f"every input ran alone (batch 1{filled}): the graph has nodes that compute over the "
            f"whole batch ({found}), so an input's numbers would depend on the other inputs of "
            f"its batch"
        ]
    if fixed is not None and fixed != requested:
        return fixed, [
            f"the graph fixes the batch size at {fixed}: inputs ran {fixed} at a time (a last, "
            f"shorter batch filled with copies of its last input, whose results were dropped)"
        ]
    return fixed or requested, []


def batch_count(feeds: Mapping[str, np.ndarray]) -> int:
    """The number of items: the one size of axis 0 that every feed with axes shares.

    Raises
    ------
    ImporterInputError
        The feeds disagree on axis 0.
    """
    sizes = {int(np.asarray(array).shape[0]) for array in feeds.values() if np.ndim(array)}
    if len(sizes) != 1:
        raise ImporterInputError(
            f"`feeds` must share one batch size along axis 0; got sizes {sorted(sizes)}"
        )
    return sizes.pop()


def call_size(batch_size: int | None, n_items: int, fixed: int | None) -> int:
    """Items per call: ``batch_size`` (checked; None: all ``n_items`` at once), at most ``fixed``."""
    if batch_size is None:
        size = max(1, n_items)
    elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ImporterInputError(
            f"`batch_size` must be a positive integer or None; got {batch_size!r}"
        )
    else:
        size = batch_size
    return size if fixed is None else min(size, fixed)


def _fill(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` with copies of its last row appended up to ``rows`` rows."""
    if array.ndim == 0 or array.shape[0] >= rows:
        return array
    check_elements(
        (rows, *array.shape[1:]),
        "a batch filled to the graph's fixed batch size",
        error=ImporterInputError,
    )
    filler = np.repeat(array[-1:], rows - array.shape[0], axis=0)
    return np.concatenate([array, filler])


def drop_filler(
    outputs: Mapping[str, np.ndarray], n_items: int, rows: int
) -> dict[str, np.ndarray]:
    """The first ``n_items`` rows of every batch-first output of a call filled to ``rows`` rows."""
    return {
        name: array[:n_items] if array.ndim and array.shape[0] == rows else array
        for name, array in outputs.items()
    }


def calls(
    feeds: Mapping[str, np.ndarray], size: int, fixed: int | None
) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """``(start, stop, feeds)`` per onnxruntime call over batch-first ``feeds``, ``size`` items each.

    With a ``fixed`` batch size (``size`` at most that) the call's feeds are filled to it with
    copies of their last item.
    """
    n_items = batch_count(feeds)
    for start in range(0, n_items, size):
        stop = min(start + size, n_items)
        batch = {
            name: array[start:stop] if np.ndim(array) else array for name, array in feeds.items()
        }
        if fixed is not None:
            batch = {name: _fill(array, fixed) for name, array in batch.items()}
        yield start, stop, batch


#: One onnxruntime call: ``(feeds, reuse, first item, items) -> outputs``, raising
#: :class:`~oversmooth.importers.errors.RunnerError` when onnxruntime fails (``Runner._call``).
Call = Callable[[dict[str, np.ndarray], int, int, int], dict[str, Any]]


class OnePerCall:
    """Calls of several inputs run one input per call once onnxruntime refused such a call.

    For a graph whose inputs declare a symbolic batch (a batch fixed at the inputs is filled
    instead, :func:`calls`). When a call of n > 1 inputs fails, its inputs are run one per call:
    if they all run, their outputs are concatenated along axis 0 (batch-first outputs, as
    :func:`drop_filler` assumes), exactly those of a batch-size-1 run, and every later call of
    several inputs is run so at once; :attr:`note` says why. If one fails too, the batch's error
    stands.

    Attributes
    ----------
    note : str
        Why inputs run one per call (which node refused a batch), or "" while batches run.
    """

    def __init__(self) -> None:
        self.note = ""

    def run(self, call: Call, feeds: dict[str, np.ndarray], reuse: int, first: int) -> dict:
        """The outputs of ``feeds`` (items numbered from ``first``; ``reuse`` as for
        :meth:`~oversmooth.importers.runtime.runner.Runner.run`), from one call or, see above, one per input."""
        items = batch_count(feeds)
        if items > 1 and self.note:
            return self._singly(call, feeds, first)
        try:
            return call(feeds, reuse, first, items)
        except RunnerError as error:
            if items == 1:
                raise
            try:
                outputs = self._singly(call, feeds, first)
            except RunnerError:  # the inputs fail alone too: not the batch
                raise error from error.__cause__
            self.note = _fixed_inside_note(error, items)
            return outputs

    @staticmethod
    def _singly(call: Call, feeds: dict[str, np.ndarray], first: int) -> dict:
        """One call per item of ``feeds`` (fresh arrays), outputs concatenated along axis 0."""
        singles = [
            {name: array[i : i + 1] if np.ndim(array) else array for name, array in feeds.items()}
            for i in range(batch_count(feeds))
        ]
        parts = [call(single, 0, first + i, 1) for i, single in enumerate(singles)]
        return {
            name: array_module(array).concatenate([part[name] for part in parts])
            if np.ndim(array)
            else array
            for name, array in parts[0].items()
        }


def _fixed_inside_note(error: RunnerError, items: int) -> str:
    """The note of a graph that refused ``items`` inputs at once and runs each alone."""
    found = _FAILED_NODE.search(str(error))
    node = "a node" if found is None else f"a {found[1]}"
    node = f"{found[1]} {found[2]!r}" if found is not None and found[2] else node
    return (
        f"the model fixes the batch at 1 inside the graph ({node} refused {items} inputs at once, "
        f"although the graph inputs declare a symbolic batch); ran one input per call"
    )


def run_notes(record: Mapping[str, Any]) -> list[Note]:
    """The notes of a runner's record (:meth:`~oversmooth.importers.runtime.runner.Runner.provenance`): why its
    inputs ran one per call (:class:`OnePerCall`), if they did."""
    note = record.get("one_input_per_call")
    return [Note("batching", str(note))] if note else []


class _Runs(Protocol):
    """What :func:`run_batches` needs of a :class:`~oversmooth.importers.runtime.runner.Runner`."""

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        *,
        batch_size: int | None = None,
        reuse_outputs: int = 0,
        first_item: int = 0,
    ) -> Iterator[dict[str, np.ndarray]]: ...


def run_batches(
    runner: _Runs,
    inputs: Inputs,
    extra_feeds: Callable[[Inputs], Mapping[str, np.ndarray]],
    items: int,
    *,
    progress: bool = False,
    keep: int = 1,
) -> Iterator[tuple[Inputs, dict[str, np.ndarray]]]:
    """Read ``inputs`` ``items`` at a time and run each batch: yield ``(batch, outputs)``.

    The outputs of the last ``keep`` batches stay valid; older batches' arrays are written over
    (``Runner.run(reuse_outputs=keep)``), so memory does not grow with the number of inputs.
    ``extra_feeds(batch)`` adds feeds (the audit's token mask). ``items`` must not exceed a batch
    size the graph fixes (:func:`items_per_call`), so a batch is one call. Each batch's float
    feeds must be finite (:func:`~oversmooth.importers.inputs.feeds.check_finite`), checked before it runs.
    """
    batches: Any = inputs.batches(items)
    if progress:
        from tqdm import tqdm

        total = math.ceil(inputs.batch_size / items)
        batches = tqdm(batches, desc="onnxruntime", unit="batch", total=total)
    start = 0
    for batch in batches:
        check_finite(batch.feeds, batch.labels, start)  # a NaN input is bad input, not the model's
        feeds = {**batch.feeds, **extra_feeds(batch)}
        for outputs in runner.run(feeds, batch_size=items, reuse_outputs=keep, first_item=start):
            yield batch, outputs
        start += batch.batch_size
