"""Hypothesis-generated mutations of valid small models and npz files: never another exception.

A mutated file may still be valid (exit 0), have no attention left (exit 1) or be refused (exit 2
with one line); a traceback, a hang or any exception other than the importer's own is a failure.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oversmooth.cli import main
from oversmooth.importers.errors import ImporterError
from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import sources
from tests.importers.builders import assemble

VALID = assemble("bert_legacy", 3).built.model.SerializeToString()
OPS = ["MatMul", "Softmax", "Add", "Reshape", "Transpose", "Identity", "Where", "Gemm", "Unknown"]
GRAPH = (
    GraphInput("input_ids", np.dtype(np.int64), ("batch", "seq")),
    GraphInput("attention_mask", np.dtype(np.int64), ("batch", "seq")),
)
MUTATIONS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(list(argv))
    return status, err.getvalue()


def _check_contract(status: int, err: str) -> None:
    assert status in (0, 1, 2), err
    if status:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "Traceback" not in err


def _mutated(data: bytes, edits: list[tuple[int, int]], keep: int) -> bytes:
    """The first ``keep`` bytes of ``data`` with each ``(position, value)`` edit applied."""
    mutated = bytearray(data[:keep])
    for position, value in edits:
        if position < len(mutated):
            mutated[position] = value
    return bytes(mutated)


@MUTATIONS
@given(
    edits=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), max_size=12),
    keep=st.integers(1, len(VALID)),
)
def test_byte_mutations_of_a_model_keep_the_contract(edits, keep):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.onnx"
        path.write_bytes(_mutated(VALID, edits, keep))
        _check_contract(*_cli("inspect", str(path)))
        out = Path(folder) / "w.npz"
        status, err = _cli("weights", str(path), "--out", str(out))
        _check_contract(status, err)
        assert out.exists() == (status == 0)


@MUTATIONS
@given(data=st.data())
def test_structural_mutations_of_a_model_keep_the_contract(data):
    model = onnx.ModelProto()
    model.ParseFromString(VALID)
    nodes = model.graph.node
    for _ in range(data.draw(st.integers(1, 4))):
        node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        kind = data.draw(st.sampled_from(["op", "drop-input", "swap-inputs", "attr", "dims"]))
        if kind == "op":
            node.op_type = data.draw(st.sampled_from(OPS))
        elif kind == "drop-input" and node.input:
            del node.input[data.draw(st.integers(0, len(node.input) - 1))]
        elif kind == "swap-inputs" and len(node.input) > 1:
            node.input[0], node.input[1] = node.input[1], node.input[0]
        elif kind == "attr" and node.attribute:
            attribute = node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))]
            attribute.i = data.draw(st.integers(-(2**40), 2**40))
            attribute.type = onnx.AttributeProto.INT
        elif kind == "dims" and model.graph.initializer:
            tensor = model.graph.initializer[
                data.draw(st.integers(0, len(model.graph.initializer) - 1))
            ]
            if tensor.dims:
                tensor.dims[0] = data.draw(st.integers(0, 2**20))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.onnx"
        path.write_bytes(model.SerializeToString())
        _check_contract(*_cli("inspect", str(path)))
        _check_contract(*_cli("spectra", str(path), "--out", str(Path(folder) / "s.csv")))


def _valid_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(
        buffer,
        input_ids=np.arange(12, dtype=np.int64).reshape(2, 6),
        attention_mask=np.ones((2, 6), np.int64),
    )
    return buffer.getvalue()


NPZ = _valid_npz()


@MUTATIONS
@given(
    edits=st.lists(st.tuples(st.integers(0, len(NPZ) - 1), st.integers(0, 255)), max_size=8),
    keep=st.integers(0, len(NPZ)),
)
def test_mutated_npz_inputs_are_read_or_refused_with_one_line(edits, keep):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.npz"
        path.write_bytes(_mutated(NPZ, edits, keep))
        try:
            inputs = sources.from_npz(path, GRAPH)
        except ImporterError as err:
            message = str(err)
        else:
            message = ""
            assert set(inputs.feeds) == {"input_ids", "attention_mask"}
    if message:  # the refusal names what was wrong: the file or a feed
        assert "`inputs`" in message or "feed" in message, message
