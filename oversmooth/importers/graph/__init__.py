"""The one ONNX parser of the importer: loading, graph navigation, constant folding, static shapes.

Everything that reads an ``.onnx`` file goes through :func:`load_model`; every other part of the
importer (matching, weights, running, auditing) takes the resulting :class:`OnnxModel`.

Modules
-------
load
    :func:`load_model`, :func:`model_from_proto`, :class:`OnnxModel`, :class:`GraphInput`.
index
    :class:`GraphIndex`: producers, consumers, constants read on demand (external data only from
    inside the model's folder).
ops
    The one table of op semantics (value, shape, layout replay, weight folding) and its one
    evaluator, :func:`~oversmooth.importers.graph.ops.fold`: ``onnx.reference``'s implementation at
    the model's opset (:mod:`~oversmooth.importers.graph.reference`), or a hand-written rule that says
    why.
shape_rules
    Output shapes by arithmetic alone (ONNX's Reshape, Slice and Split arithmetic included).
shapes
    :class:`ShapeContext`: static shapes and shape arithmetic under assumed batch/sequence sizes
    (:class:`ShapeBasis`: what the contexts at one pair of sizes share).
node
    :class:`Node`: one node with its position.
branches
    A merged decoder's ``If`` on its key/value cache read through its no-cache branch.
kv_cache
    Key/value cache inputs of a decoder exported for generation, found by structure (fed empty).
defuse, defuse_parts
    Fused attention operators rewritten into standard ONNX when a model is loaded.
opsets
    Models of opsets 7 to 12 read through ONNX's version converter at opset 13, run as shipped.
"""

from __future__ import annotations

from oversmooth.importers.graph.index import GraphIndex, external_data_path
from oversmooth.importers.graph.load import (
    SUPPORTED_OPSETS,
    GraphInput,
    OnnxModel,
    load_model,
    model_from_proto,
)
from oversmooth.importers.graph.node import Node
from oversmooth.importers.graph.shape_rules import apply_slice, reshape_target
from oversmooth.importers.graph.shapes import ShapeBasis, ShapeContext

__all__ = [
    "SUPPORTED_OPSETS",
    "GraphIndex",
    "GraphInput",
    "Node",
    "OnnxModel",
    "ShapeBasis",
    "ShapeContext",
    "apply_slice",
    "external_data_path",
    "load_model",
    "model_from_proto",
    "reshape_target",
]
