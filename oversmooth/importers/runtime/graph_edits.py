"""The edits a session's graph gets: tensors exposed, an extension appended, and late outputs.

onnxruntime returns graph outputs only, and does not fuse across a tensor that is one (or that an
appended node reads). :func:`instrumented` exposes the audit's tensors and appends its extension
*before* onnxruntime optimises the graph, as every session here always has. A tensor that must be
read without changing any fusion is read *after*: :func:`optimised_with_late` takes the graph
onnxruntime optimised (written with ``optimized_model_filepath``), finds each wanted tensor there
— the tensor itself where it survived, else the optional sum output of the
``SkipLayerNormalization`` it was fused into — and appends the nodes that read it; the session
then runs that graph with optimisation off. Reloading the optimised graph gives bitwise the same
outputs as the session that optimised it (checked on the zoo models), so the other numbers stay
what they were.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oversmooth.importers.errors import RunnerError
from oversmooth.importers.graph.shapes import inferred_types
from oversmooth.importers.runtime.reductions import GraphExtension

__all__ = [
    "FUSED_NORMS",
    "FUSED_SUM_OUTPUT",
    "LateOutputs",
    "drop_outputs",
    "expose_late",
    "instrumented",
    "optimised_model_path",
    "optimised_product_of_itself",
    "optimised_with_late",
    "temporary_model_file",
]

#: onnxruntime's fused residual norms (com.microsoft), whose optional output
#: :data:`FUSED_SUM_OUTPUT` is the ``input + skip (+ bias)`` they normalise.
FUSED_NORMS = frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
FUSED_SUM_OUTPUT = 3


@dataclass(frozen=True)
class LateOutputs:
    """Tensors to read from the graph onnxruntime optimised, and the nodes that reduce them.

    Attributes
    ----------
    sums : mapping of str to str
        Each wanted tensor (a residual sum) and the output of the norm that reads it: where
        onnxruntime fused the two into one ``SkipLayerNormalization``, the sum is that node's
        optional output :data:`FUSED_SUM_OUTPUT`.
    extension : callable
        Given, per wanted tensor in the order of ``sums``, its name in the optimised graph or
        None (:func:`expose_late`), and the optimised ``GraphProto`` itself (to write the
        nodes as onnxruntime wrote the first extension's, :func:`optimised_product_of_itself`),
        the :class:`GraphExtension` that reads the ones found, appended to the optimised graph.
    """

    sums: Mapping[str, str]
    extension: Callable[[Sequence[str | None], Any], GraphExtension]


def expose_late(graph: Any, sums: Mapping[str, str]) -> list[str | None]:
    """Make each wanted tensor of ``sums`` a tensor of the optimised ``graph``.

    Returns, per wanted tensor in order, the name it has there, or None. A tensor some node still
    produces keeps its name; else the fused norm whose first output is the one ``sums`` names
    gets its optional sum output, under the wanted tensor's own name (gone from the optimised
    graph, so free) unless onnxruntime already named it.
    """
    produced = {output for node in graph.node for output in node.output if output}
    fused = {
        node.output[0]: node
        for node in graph.node
        if node.op_type in FUSED_NORMS and node.domain == "com.microsoft" and node.output
    }
    found: list[str | None] = []
    for wanted, norm_output in sums.items():
        if wanted in produced:
            found.append(wanted)
            continue
        node = fused.get(norm_output)
        if node is None:
            found.append(None)
            continue
        while len(node.output) <= FUSED_SUM_OUTPUT:
            node.output.append("")
        if not node.output[FUSED_SUM_OUTPUT]:
            node.output[FUSED_SUM_OUTPUT] = wanted
        found.append(node.output[FUSED_SUM_OUTPUT])
    return found


def optimised_with_late(
    path: str | os.PathLike[str], late: LateOutputs
) -> tuple[Any, GraphExtension, list[str | None]]:
    """The optimised model saved at ``path`` with ``late``'s tensors found and their extension
    appended (inputs, initializers, nodes, outputs; the outputs it replaces dropped,
    :func:`drop_outputs`); that extension; and per wanted tensor its name in the optimised graph
    or None (:func:`expose_late`)."""
    import onnx

    model = onnx.load(os.fspath(path))
    found = expose_late(model.graph, late.sums)
    extension = late.extension(found, model.graph)
    model.graph.node.extend(extension.nodes)
    model.graph.initializer.extend(extension.initializers)
    model.graph.input.extend(extension.inputs)
    model.graph.output.extend(extension.outputs)
    drop_outputs(model.graph, extension.replaces)
    return model, extension, found


def optimised_product_of_itself(graph: Any, outputs: Iterable[str]) -> Any | None:
    """The node of onnxruntime's optimised ``graph`` that computes the first of ``outputs`` it
    produces, when that node reads one tensor twice, else None.

    The late extension runs with optimisation off, so a ``Transpose`` it writes before a
    ``MatMul`` stays a pass of its own over the layer, where onnxruntime folds it into the
    product (``FusedMatMul`` with ``transA`` or ``transB``) in the first extension, bit for
    bit the same product (MiniLM-L6-int8 at batch 8 on 2 cores: its six late ``Transpose``
    passes took 1.4 ms of a 93 ms call). Given
    the first extension's Gram outputs, this is the form onnxruntime chose for them on this
    provider and element type, which the late Gram matrices can then copy
    (:func:`~oversmooth.importers.runtime.reductions.extend_plan`'s ``gram_as``); None where it
    kept the ``MatMul`` of a transposed copy, or where no such output is computed.
    """
    wanted = list(outputs)
    names = set(wanted)
    producer = {output: node for node in graph.node for output in node.output if output in names}
    for name in wanted:
        node = producer.get(name)
        if node is not None:
            same = len(node.input) == 2 and node.input[0] == node.input[1]
            return node if same else None
    return None


def _producers(graph: Any) -> dict[str, int]:
    return {output: k for k, node in enumerate(graph.node) for output in node.output if output}


def _ancestors(graph: Any, names: Iterable[str], producers: Mapping[str, int]) -> set[int]:
    """The nodes that the tensors ``names`` depend on (indices into ``graph.node``)."""
    seen: set[int] = set()
    todo = [producers[name] for name in names if name in producers]
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            todo += [producers[name] for name in graph.node[k].input if name in producers]
    return seen


def drop_outputs(graph: Any, names: Iterable[str]) -> int:
    """Remove the graph outputs ``names`` and the nodes that only they needed; the count removed.

    A node stays if any remaining output depends on it. onnxruntime runs every node of a graph
    whether or not an output needs it, so an output nobody reads still costs its nodes. A graph
    with a node that carries a subgraph (If, Loop, Scan: its reads of outer tensors are not
    listed as inputs) keeps every node.
    """
    import onnx

    drop = set(names)
    if not drop:
        return 0
    kept = [value for value in graph.output if value.name not in drop]
    del graph.output[:]
    graph.output.extend(kept)
    subgraph = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    if any(attribute.type in subgraph for node in graph.node for attribute in node.attribute):
        return 0
    producers = _producers(graph)
    needed = _ancestors(graph, (value.name for value in kept), producers)
    unneeded = _ancestors(graph, drop, producers) - needed
    nodes = [node for k, node in enumerate(graph.node) if k not in unneeded]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(unneeded)


@contextlib.contextmanager
def optimised_model_path() -> Iterator[str]:
    """A path in a temporary folder for onnxruntime to write the optimised model to."""
    with tempfile.TemporaryDirectory(prefix="oversmooth-optimised-") as folder:
        yield str(Path(folder) / "optimised.onnx")


def _copy_value(value: Any) -> Any:
    """A detached copy of a ``ValueInfoProto``."""
    import onnx

    detached = onnx.ValueInfoProto()
    detached.CopyFrom(value)
    return detached


@contextlib.contextmanager
def instrumented(
    model: Any, expose: Sequence[str], keep_outputs: bool, extension: GraphExtension
) -> Iterator[list[str]]:
    """Append ``extension`` to ``model`` and make its outputs, ``expose`` (plus the originals if
    ``keep_outputs``) the graph outputs, for a while.

    Exposed tensors are typed by ONNX shape inference where it can; the others are left untyped
    for onnxruntime to type. The graph is edited in place (no second copy of the weights) and
    restored when the block ends, so the caller's model is unchanged. Yields the output names in
    order.
    """
    import onnx

    graph = model.graph
    original = [_copy_value(value) for value in graph.output]
    sizes = {field: len(getattr(graph, field)) for field in ("node", "initializer", "input")}
    types = inferred_types(model) if expose else {}
    del graph.output[:]
    names: list[str] = []
    try:
        graph.node.extend(extension.nodes)
        graph.initializer.extend(extension.initializers)
        graph.input.extend(extension.inputs)
        graph.output.extend(extension.outputs)
        names.extend(extension.output_names)
        for name in expose:
            value = onnx.ValueInfoProto(name=name)
            if name in types:
                value.type.CopyFrom(types[name])
            graph.output.append(value)
            names.append(name)
        if keep_outputs:
            for value in original:
                if value.name not in names:
                    graph.output.append(value)
                    names.append(value.name)
        yield names
    finally:
        del graph.output[:]
        graph.output.extend(original)
        for field, size in sizes.items():
            del getattr(graph, field)[size:]


@contextlib.contextmanager
def temporary_model_file(model: Any, folder: Path) -> Iterator[str]:
    """Save ``model`` (without its external data) to a temporary file in ``folder``; delete it after.

    For models with external data: relative data locations resolve against the model's folder,
    so the temporary file there references the same data files.
    """

    try:
        fd, tmp = tempfile.mkstemp(prefix=".oversmooth-", suffix=".onnx", dir=folder)
    except OSError as err:
        raise RunnerError(
            f"a model with external data needs a temporary file in its folder {folder}: {err}"
        ) from err
    os.close(fd)
    try:
        with open(tmp, "wb") as handle:
            handle.write(model.SerializeToString())
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
