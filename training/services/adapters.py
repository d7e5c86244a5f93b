"""Serving a trained conductor's adapter before anything asks it for a plan (an evaluation, a shadow
run, a promotion): vLLM loads a LoRA adapter at run time; other servers are registered here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from django.conf import settings

from routing.models import ConductorVersion
from routing.secrets import redact

from .common import TrainingError

# Servers other than vLLM that load a trained adapter, by a version's config["serving"]: a function of
# the version that serves its adapter (raising TrainingError when it cannot). The app that runs such a
# server registers it (conductor_web: llama.cpp's, for the local model), so training never imports it.
AdapterServer = Callable[[ConductorVersion], dict[str, Any]]
_ADAPTER_SERVERS: dict[str, AdapterServer] = {}


def adapter_server_register(serving: str, serve: AdapterServer) -> None:
    _ADAPTER_SERVERS[serving] = serve


def adapter_load(version: ConductorVersion) -> dict[str, Any] | None:
    """For an LLM conductor with an adapter: have its server serve it (vLLM's runtime LoRA loading, or
    the server its config names); None for a version without one. Raises TrainingError."""
    config = version.config
    if version.backend != ConductorVersion.Backend.LLM or not config.get("lora_path"):
        return None
    serving = str(config.get("serving") or "vllm")
    if serving == "vllm":
        return _vllm_load(version)
    serve = _ADAPTER_SERVERS.get(serving)
    if serve is None:
        raise TrainingError(f"{version.name}'s adapter is for a {serving} server, and none is set up here")
    return serve(version)


def _vllm_load(version: ConductorVersion) -> dict[str, Any]:
    """Load a version's adapter into the vLLM server (POST /v1/load_lora_adapter)."""
    config = version.config
    base = str(config.get("api_base") or "").rstrip("/")
    if not base:
        raise TrainingError(
            f"{version.name} has a LoRA adapter for a vLLM server but no api_base to load it into: set "
            "CONDUCTOR_VLLM_API_BASE to the vLLM server's OpenAI API (e.g. http://vllm:8000/v1) for the "
            "versions trained next, and this version's api_base on the admin site"
        )
    url = (base if base.endswith("/v1") else base + "/v1") + "/load_lora_adapter"
    body = {"lora_name": config.get("lora_name") or version.name, "lora_path": config["lora_path"]}
    try:
        response = httpx.post(url, json=body, timeout=settings.CONDUCTOR_PROVIDER_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise TrainingError(redact(f"could not reach the vLLM server at {url}: {exc}")) from exc
    if response.status_code >= 400 and "already been loaded" not in response.text:  # its text is the server's
        raise TrainingError(
            redact(f"vLLM refused the adapter ({response.status_code}): {response.text[:300]}")
        )
    return {"url": url, **body, "status": response.status_code}
