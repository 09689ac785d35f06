"""Where an array lives (simulator.backend): host arrays as NumPy, device arrays by their library.

No GPU is needed: a stand-in device library (a module registered in ``sys.modules`` with
``asnumpy``, ``matmul`` and ``linalg``, and an array type declaring a device) plays CuPy's part.
The GPU itself is exercised in tests/importers/runtime/test_device_path.py (marker ``cuda``).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np
import pytest

from oversmooth.simulator.backend import HostCopies, array_module, on_host, to_numpy

#: The attributes by which an array declares a device (the array API, CUDA, DLPack).
DEVICE_MARKS = ("__array_namespace__", "__cuda_array_interface__", "__dlpack_device__")


class DeviceArray:
    """An array of the stand-in library ``fakedevice``: its data is held, never exposed as NumPy."""

    __module__ = "fakedevice.core"
    __cuda_array_interface__ = None

    def __init__(self, data: np.ndarray) -> None:
        self.data = data


def _fake_library(**members: Any) -> types.ModuleType:
    """A module named ``fakedevice`` with ``members`` as attributes."""
    module = types.ModuleType("fakedevice")
    for name, value in members.items():
        setattr(module, name, value)
    return module


@pytest.fixture
def fakedevice(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in device library, imported (in ``sys.modules``) for the test's duration."""
    module = _fake_library(
        asnumpy=lambda array: array.data.copy(), matmul=np.matmul, linalg=np.linalg
    )
    monkeypatch.setitem(sys.modules, "fakedevice", module)
    return module


def test_host_arrays_are_their_own_module_and_counted_not_copied() -> None:
    array = np.arange(6.0)
    assert array_module(array) is np
    assert on_host(array)
    assert on_host(2.0)
    copies = HostCopies()
    assert copies(array) is array
    assert (copies.bytes, copies.arrays, copies.device_bytes) == (48, 1, 0)
    assert to_numpy(array) is array


def test_an_array_of_an_unknown_library_is_refused_by_name() -> None:
    class Foreign:
        __module__ = "nosuchlibrary.core"

        def __array_namespace__(self) -> types.ModuleType:  # pragma: no cover - never called
            raise AssertionError

    with pytest.raises(TypeError, match=r"nosuchlibrary\.core\.Foreign are not supported"):
        array_module(Foreign())


@pytest.mark.parametrize("value", [[1.0, 2.0], (3,), 4, np.float32(5.0), np.zeros((0, 2))])
def test_python_data_and_numpy_scalars_are_host_data(value: Any) -> None:
    assert on_host(value)
    assert array_module(value) is np
    converted = to_numpy(value)
    assert isinstance(converted, np.ndarray)
    np.testing.assert_array_equal(converted, np.asarray(value))


@pytest.mark.parametrize("mark", DEVICE_MARKS)
def test_any_one_device_mark_puts_an_array_on_a_device(mark: str) -> None:
    declares = type("Declares", (), {mark: None})
    assert not on_host(declares())
    assert on_host(type("Plain", (), {})())


def test_a_device_array_belongs_to_its_already_imported_library(
    fakedevice: types.ModuleType,
) -> None:
    data = np.arange(4.0).reshape(2, 2)
    array = DeviceArray(data)
    assert not on_host(array)
    assert array_module(array) is fakedevice
    host = to_numpy(array)
    assert isinstance(host, np.ndarray)
    assert host is not data  # copied from the device, as asnumpy does
    np.testing.assert_array_equal(host, data)


def test_a_device_library_that_is_not_imported_is_refused() -> None:
    assert "fakedevice" not in sys.modules  # nothing is imported on the array's behalf
    with pytest.raises(TypeError, match=r"fakedevice\.core\.DeviceArray are not supported"):
        array_module(DeviceArray(np.zeros(2)))


@pytest.mark.parametrize("missing", ["asnumpy", "matmul", "linalg"])
def test_a_device_library_without_the_numpy_api_is_refused(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    members = {"asnumpy": np.asarray, "matmul": np.matmul, "linalg": np.linalg}
    del members[missing]
    monkeypatch.setitem(sys.modules, "fakedevice", _fake_library(**members))
    with pytest.raises(TypeError, match="NumPy-compatible"):
        array_module(DeviceArray(np.zeros(2)))


def test_host_copies_count_what_crossed_from_a_device_apart(fakedevice: types.ModuleType) -> None:
    copies = HostCopies()
    device = DeviceArray(np.ones((3, 4), dtype=np.float32))  # 48 bytes
    host = np.ones(5)  # 40 bytes
    np.testing.assert_array_equal(copies(device), np.ones((3, 4)))
    assert copies(host) is host
    assert (copies.bytes, copies.arrays, copies.device_bytes) == (88, 2, 48)
    copies.reset()
    assert (copies.bytes, copies.arrays, copies.device_bytes) == (0, 0, 0)
    copies(device)
    assert (copies.bytes, copies.arrays, copies.device_bytes) == (48, 1, 48)
