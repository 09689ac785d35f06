"""Running a model with onnxruntime: the session, its devices, and what it returns besides outputs.

Modules
-------
runner
    :class:`Runner`: an onnxruntime session that returns chosen intermediate tensors, with a graph
    extension appended (the in-graph reductions).
batching
    Items per onnxruntime call: fixed batch sizes filled, batch-mixing graphs run one input at a time.
binding
    IOBinding: host buffers reused, outputs kept on the GPU.
reductions
    The ONNX nodes that reduce a layer to its statistics inside the graph.
cuda
    Preloading the CUDA wheels; CuPy views of onnxruntime's device buffers.
doctor
    What onnxruntime can run here.
"""

from __future__ import annotations

from oversmooth.importers.runtime.runner import Runner, plain_session

__all__ = ["Runner", "plain_session"]
