"""``oversmooth doctor`` (:mod:`oversmooth.commands.doctor`): this machine's report in text and
JSON, and the text it prints for findings we cannot produce here (a GPU, libraries loaded, CUDA
usable or not, with its fix), from a diagnosis given to it."""

from __future__ import annotations

import json

import pytest

from oversmooth.cli import main
from oversmooth.importers.runtime import doctor
from oversmooth.importers.runtime.doctor import Diagnosis


# Moved from tests/importers/runtime/test_doctor.py.
def test_doctor_reports_this_machine_in_text_and_json(capsys) -> None:
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "cpu: usable" in text
    assert "CUDA: " in text
    assert main(["doctor", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["usable"]["cpu"] == "ok"
    assert set(found) >= {"onnxruntime", "listed", "usable", "gpus", "libraries", "cuda_reason"}
    assert (found["cuda_reason"] is None) == (found["usable"]["cuda"] == "ok")


@pytest.mark.parametrize("cuda_usable", [True, False])
def test_the_text_report_says_each_finding_in_its_line(monkeypatch, capsys, cuda_usable) -> None:
    found = Diagnosis(
        onnxruntime="1.99",
        listed=("CUDAExecutionProvider", "CPUExecutionProvider"),
        usable={"cpu": "ok", "cuda": "ok" if cuda_usable else "libcudnn.so.9: not found"},
        gpus=[{"name": "NVIDIA H100", "driver": "580.0", "memory": "81559 MiB"}],
        libraries={"libcudnn.so.9": "/v/libcudnn.so.9", "libcudart.so.13": "/v/libcudart.so.13"},
        cuda_reason=None if cuda_usable else "cuDNN is missing",
        fix=None if cuda_usable else "pip install x",
        device_arrays="off",
    )
    monkeypatch.setattr(doctor, "diagnose", lambda: found)
    assert main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = [
        "onnxruntime 1.99; providers listed: CUDAExecutionProvider, CPUExecutionProvider",
        "  cpu: usable",
        "  cuda: usable" if cuda_usable else "  cuda: not usable: libcudnn.so.9: not found",
        "GPU: NVIDIA H100 (driver 580.0, 81559 MiB)",
        "loaded libcudart.so.13 from /v/libcudart.so.13",  # sorted by name
        "loaded libcudnn.so.9 from /v/libcudnn.so.9",
    ]
    if cuda_usable:
        expected.append("CUDA: usable; `oversmooth audit --provider cuda` runs on the GPU")
    else:
        expected += ["CUDA: not usable: cuDNN is missing", "fix: pip install x"]
    assert lines == [*expected, "device arrays: off"]


def test_nothing_found_is_said_not_left_out(monkeypatch, capsys) -> None:
    found = Diagnosis(
        onnxruntime="1.99",
        listed=("CPUExecutionProvider",),
        usable={"cpu": "ok"},
        cuda_reason="no CUDA provider in this onnxruntime",
    )
    monkeypatch.setattr(doctor, "diagnose", lambda: found)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "GPU: none visible (no nvidia-smi)" in out
    assert "CUDA libraries loaded: none" in out
    assert "fix:" not in out
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == []
