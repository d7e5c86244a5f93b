"""The local model's server wheel is built once per machine and user, and kept in a user cache folder
that every clone reuses: a second clone with the wheel in the cache does not build it again. No real
build here: pip is replaced by a stand-in that writes the wheel it was asked for."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from conductor_web import local_model

VERSION = local_model.LLAMA_CPP_PYTHON.split("==")[1]
WHEEL = f"llama_cpp_python-{VERSION}-py3-none-linux_x86_64.whl"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(local_model.WHEEL_CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def pip(monkeypatch, tmp_path) -> list[list[str]]:
    """What pip was asked to do; a `pip wheel` leaves the wheel in its -w folder, a download the source."""
    asked: list[list[str]] = []

    def run(command, **kwargs):
        asked.append([str(c) for c in command])
        if "wheel" in command:
            out = Path(command[command.index("-w") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / WHEEL).write_bytes(b"built")
        elif "download" in command:
            folder = Path(command[command.index("-d") + 1])
            (folder / f"llama_cpp_python-{VERSION}.tar.gz").write_bytes(b"source")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(local_model.subprocess, "run", run)
    return asked


def builds(asked: list[list[str]]) -> list[list[str]]:
    return [c for c in asked if "wheel" in c]


def test_the_cache_folder_is_the_override_else_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(local_model.WHEEL_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert local_model.wheel_cache_dir() == tmp_path / "xdg" / "conductor-web" / "wheels"

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert local_model.wheel_cache_dir() == tmp_path / "home" / ".cache" / "conductor-web" / "wheels"

    monkeypatch.setenv(local_model.WHEEL_CACHE_ENV, str(tmp_path / "chosen"))
    assert local_model.wheel_cache_dir() == tmp_path / "chosen"


def test_a_second_clone_reuses_the_wheel_the_first_built(cache, pip, tmp_path):
    said: list[str] = []
    first = local_model.server_wheel(tmp_path / "clone-1" / "var", progress=said.append)

    assert first == cache / local_model.BUILD_NAME / WHEEL and first.read_bytes() == b"built"
    assert len(builds(pip)) == 1
    assert any(s.startswith("building llama.cpp's server") for s in said)

    said.clear()
    second = local_model.server_wheel(tmp_path / "clone-2" / "var", progress=said.append)

    assert second == first
    assert len(builds(pip)) == 1, "the second clone built the server again"
    assert not any(s.startswith("building") for s in said) and said[-1].endswith("(no build)")


def test_a_wheel_of_another_version_is_not_reused(cache, pip, tmp_path):
    older = cache / local_model.BUILD_NAME / "llama_cpp_python-0.0.1-py3-none-linux_x86_64.whl"
    older.parent.mkdir(parents=True)
    older.write_bytes(b"old")

    assert local_model.built_wheel(cache) is None
    assert local_model.server_wheel(tmp_path / "var", progress=lambda s: None).name == WHEEL
    assert len(builds(pip)) == 1


def test_a_wheel_an_older_clone_kept_in_its_var_folder_is_copied_into_the_cache(cache, pip, tmp_path):
    var = tmp_path / "var"
    kept = local_model.wheel_dir(var) / local_model.BUILD_NAME / WHEEL
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"built before")

    found = local_model.server_wheel(var, progress=lambda s: None)

    assert found == cache / local_model.BUILD_NAME / WHEEL and found.read_bytes() == b"built before"
    assert builds(pip) == []


def test_an_unwritable_cache_falls_back_to_the_clones_var_folder(tmp_path, monkeypatch, pip):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(local_model.WHEEL_CACHE_ENV, str(blocker / "wheels"))

    found = local_model.server_wheel(tmp_path / "var", progress=lambda s: None)

    assert found == local_model.wheel_dir(tmp_path / "var") / local_model.BUILD_NAME / WHEEL


def test_a_clone_that_built_before_the_cache_offers_its_wheel_to_the_others(
    cache, pip, tmp_path, monkeypatch
):
    var = tmp_path / "var"
    kept = local_model.wheel_dir(var) / local_model.BUILD_NAME / WHEEL
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"built before")
    monkeypatch.setattr(local_model, "weights_file", lambda: tmp_path / "weights.gguf")
    monkeypatch.setattr(local_model.importlib.util, "find_spec", lambda name: object())  # installed here

    local_model.install(var, log=io.StringIO())

    assert (cache / local_model.BUILD_NAME / WHEEL).read_bytes() == b"built before"
    assert pip == []
