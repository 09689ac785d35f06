"""A garbage ``.npy`` member header is one line wherever the project reads ``.npz`` files.

NumPy parses member headers with ``ast.literal_eval`` and, for what looks like a Python 2 header,
``tokenize``; both raise on hostile text (``SyntaxError``, ``tokenize.TokenError``, ...).
:func:`oversmooth.simulator.npzfile.read_npy_header` is the one place that parser runs; every reader
(``audit --inputs``, ``simulate --system``) must answer a bad header with its own one-line error.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oversmooth.importers.graph import GraphInput
from oversmooth.importers.inputs import sources
from oversmooth.simulator.errors import InputError
from oversmooth.simulator.systems import load_system

TEXT_GRAPH = (
    GraphInput("input_ids", np.dtype(np.int64), ("batch", "seq")),
    GraphInput("attention_mask", np.dtype(np.int64), ("batch", "seq")),
)
#: Pieces of header text, valid and not, that hypothesis strings together.
PIECES = [
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "'",
    '"',
    "'''",
    '"""',
    ":",
    ",",
    " ",
    "\\",
    "#",
    "\n",
    "L",
    "'descr'",
    "'<f8'",
    "'<i8'",
    "'shape'",
    "'fortran_order'",
    "False",
    "1",
    "-1",
    "2**40",
    "1048576",
    "lambda",
    "b'x'",
]
_PREFIX = "{'descr': '<i8', 'fortran_order': False, 'shape': "
GARBAGE = {
    "unclosed-tuple": _PREFIX + "(2, ",
    "unclosed-triple-quote": _PREFIX + "'''(2, 6) }",
    "python2-long-unclosed": _PREFIX + "(2L, 6L",
    "backslash-continuation": _PREFIX + "(2, \\",
    "deep-nesting": "(" * 500,
    "not-a-dict": "[1, 2, 3]",
    "wrong-keys": "{'descr': '<i8'}",
    "set-literal": "{1, 2}",
}


def _npy(header: str, data: bytes = b"") -> bytes:
    raw = header.encode("latin1", "replace")
    raw += b" " * (63 - (10 + len(raw)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + data


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(f"{name}.npy", content)
    return path


def _read_both(folder: Path, header: str) -> list[InputError]:
    """Each reader on an archive whose first member has ``header``: the one-line errors raised."""
    errors = []
    inputs = _archive(folder / "inputs.npz", {"input_ids": _npy(header, b"\0" * 96)})
    system = _archive(folder / "system.npz", {"A": _npy(header, b"\0" * 96)})
    for read in (lambda: sources.from_npz(inputs, TEXT_GRAPH), lambda: load_system(system)):
        try:
            read()
        except InputError as err:  # ImporterInputError is one too
            errors.append(err)
    return errors


@pytest.mark.parametrize("name", GARBAGE)
def test_a_garbage_member_header_is_one_line_for_every_reader(tmp_path: Path, name: str) -> None:
    errors = _read_both(tmp_path, GARBAGE[name])
    assert len(errors) == 2
    for err in errors:
        assert "\n" not in str(err)


@given(pieces=st.lists(st.sampled_from(PIECES), max_size=30))
def test_any_member_header_is_read_or_refused_in_one_line(tmp_path_factory, pieces) -> None:
    folder = tmp_path_factory.mktemp("headers")
    for err in _read_both(folder, "".join(pieces)):
        assert "\n" not in str(err)
