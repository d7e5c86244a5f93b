"""The local model as a base to train: SmolLM2-135M-Instruct, read from the GGUF file its server serves
and saved once as an ordinary transformers checkpoint (var/models/smollm2-135m-instruct/).

transformers reads a GGUF file with the `gguf` package and dequantises it to fp32, but marks the model
as quantised, which Trainer refuses; so the model is rebuilt from its config (the GGUF quantisation
left out) and given the loaded weights. The checkpoint is also the base that llama.cpp's converter
reads when it turns an adapter trained on it into the server's form. Needs the `train` extra.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings

from routing.local_server import MODEL_ALIAS, weights_file

from .tiny_model import offline


def local_base_dir() -> Path:
    return settings.VAR_DIR / "models" / MODEL_ALIAS


def is_local_base(path: str | Path) -> bool:
    return Path(path).resolve() == local_base_dir().resolve()


def local_base_available() -> bool:
    """The checkpoint exists, or can be made (the weights are installed)."""
    return (local_base_dir() / "config.json").is_file() or weights_file() is not None


def local_base_export() -> Path:
    """The checkpoint's directory, made from the GGUF file the first time (about 40 s on 2 cores)."""
    directory = local_base_dir()
    if (directory / "config.json").is_file():
        return directory
    weights = weights_file()
    if weights is None:
        raise FileNotFoundError("the local model's weights are not installed (make local-model)")
    offline()
    from transformers import (  # transformers: heavy; only an export needs it
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(weights.parent), gguf_file=weights.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(weights.parent), gguf_file=weights.name)
    config = loaded.config
    for quantised in ("quantization_config", "_name_or_path"):
        if hasattr(config, quantised):
            delattr(config, quantised)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    partial.rename(directory)  # whole or not at all: a job never reads a half-written checkpoint
    return directory
