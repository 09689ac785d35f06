"""ONNX's own op implementations (``onnx.reference``) run on one node: the importer's evaluator.

:func:`~oversmooth.importers.graph.ops.fold` takes an op's value from here unless the op table
(:mod:`oversmooth.importers.graph.ops`) keeps a hand-written rule, and says why. The implementation
is the one of the node's opset (:attr:`~oversmooth.importers.graph.node.Node.opset`), looked up once
per op and version; an instance only reads the node's attributes (about 3 µs of a call's 12), so
one is made per call. ``onnx.reference`` is imported on first use (about 0.06 s).

Public API
----------
reference_outputs
    Every output of one node from its input values, by ``onnx.reference`` (None: it has no
    implementation of the op).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
import onnx

from oversmooth.importers.graph.node import Node

__all__ = ["reference_outputs"]


@functools.cache
def _implementation(op_type: str, version: int | None) -> Any:
    """``onnx.reference``'s class (or factory) for a default-domain ``op_type`` at ``version``
    (None: the newest), or None where it has none."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops import load_op

    try:
        return load_op("", op_type, version, evaluator_cls=ReferenceEvaluator)
    except Exception:  # an op it does not implement at that version, or only with input types
        return None


@functools.cache
def _run_params(version: int | None) -> dict[str, Any]:
    """What an ``onnx.reference`` op reads besides its node (a subgraph's evaluator included);
    read only, so one per version serves every instance."""
    from onnx.reference import ReferenceEvaluator

    opsets = {} if version is None else {"": version}
    return {
        "log": lambda *_args: None,
        "opsets": opsets,
        "verbose": 0,
        "new_ops": {},
        "existing_functions": {},
        "evaluator_cls": ReferenceEvaluator,
    }


def _reads_external_data(node: Node) -> bool:
    """Whether a tensor attribute is stored outside the model file: only
    :meth:`~oversmooth.importers.graph.index.GraphIndex.read_tensor` may read one (inside the model's
    folder); ``onnx.reference`` would resolve it against the working directory."""
    return any(
        attribute.HasField("t") and attribute.t.data_location == onnx.TensorProto.EXTERNAL
        for attribute in node.proto.attribute
    )


def reference_outputs(node: Node, values: list) -> tuple[np.ndarray, ...] | None:
    """Every output of ``node`` (read as the default domain's op of its name) from its input
    values, by ``onnx.reference`` at ``node.opset``.

    Parameters
    ----------
    node : Node
    values : list of ndarray or None
        One per input, in order (None for an omitted optional input).

    Returns
    -------
    tuple of ndarray or None
        One array per output; None where ``onnx.reference`` has no implementation of the op at
        that version, or a tensor attribute is stored as external data.

    Raises
    ------
    ValueError
        The op refuses its inputs, or returns something that is not a tensor (a sequence, a
        sparse tensor); the reference's own error is chained.
    """
    implementation = _implementation(node.op_type, node.opset)
    if implementation is None or _reads_external_data(node):
        return None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # an op's overflow or log(0) is its value, not news
            outputs = implementation(node.proto, _run_params(node.opset)).run(*values)
    except Exception as err:  # whatever the reference raises, the op refused its inputs
        raise ValueError(f"{node.op_type} {node.label!r}: {err}") from err
    if not all(isinstance(output, np.ndarray | np.generic) for output in outputs):
        raise ValueError(f"{node.op_type} {node.label!r} does not output tensors")
    return tuple(np.asarray(output) for output in outputs)
