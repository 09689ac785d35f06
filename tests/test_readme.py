"""The README's Python API block runs as written (it once imported ``save_audit`` from a package
that never had it): the block is read from the README itself and run in a temporary folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oversmooth.simulator.errors import NumericalFloorWarning
from tests.realmodels import require_real_model

README = Path(__file__).resolve().parent.parent / "README.md"


def python_api_block(text: str) -> str:
    """The first ```python block after the ``## Python API`` heading."""
    section = text.split("\n## Python API\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the Python API section has no python block"
    return match.group(1)


def test_the_block_is_found() -> None:
    block = python_api_block(README.read_text(encoding="utf-8"))
    assert "from oversmooth" in block
    assert "import simulator" not in block


@pytest.mark.realmodel
def test_the_python_api_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_real_model("minilm-l3")
    monkeypatch.chdir(tmp_path)
    block = python_api_block(README.read_text(encoding="utf-8"))
    namespace: dict[str, object] = {"print": lambda *args, **kwargs: None}
    with pytest.warns(NumericalFloorWarning):  # the README says so: "(warned)"
        exec(compile(block, "README.md:Python API", "exec"), namespace)
    assert (tmp_path / "l3-report" / "audit.json").is_file()
