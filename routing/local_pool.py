"""The local model in the pool: SmolLM2-135M-Instruct on this machine's CPU, as a worker and as an
`llm` conductor. Its server is started elsewhere (conductor_web.local_model, the demo, the tests);
this module says what the pool records of it, in one place.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import transaction

from audit.actions import Action
from audit.services import Actor, event_record
from routing.conductors.llm import LLAMA_CPP, PROBE
from routing.local_server import MODEL_ALIAS, api_base
from routing.models import ConductorVersion, DataClass, Worker
from routing.services import worker_upsert

WORKER_SLUG = "smollm2-135m-local"
VENDOR = "local"
CONDUCTOR_NAME = "smollm2-local"
# What the local model costs per token: nothing (its CPU time is this machine's).
FREE = Decimal("0")


def local_api_base() -> str:
    """Where this deployment's local model answers (CONDUCTOR_LOCAL_MODEL_PORT on loopback)."""
    return api_base(settings.LOCAL_MODEL_PORT)


def worker_fields(api_base: str) -> dict[str, object]:
    return {
        "display_name": "SmolLM2-135M (local, 135M parameters)",
        "litellm_model": f"openai/{MODEL_ALIAS}",
        "api_base": api_base,
        "vendor": VENDOR,
        "self_hosted": True,
        "input_usd_per_mtok": FREE,
        "output_usd_per_mtok": FREE,
        "price_source": Worker.PriceSource.OVERRIDE,
        "context_window": 4096,
        # The data never leaves this machine.
        "data_classes": list(DataClass.values),
        "description": "a 135M-parameter model on this machine's CPU: weak, free, and nothing leaves the machine",
        "weak": True,  # its answers are labelled so wherever they are shown
    }


# Its plans end within the token budget: at most 3 steps (the paper's workflows average about 3), each
# text at most 300 characters (the schema it writes under, when it serves and when it is trained).
MAX_PLAN_STEPS = 3
MAX_TEXT_CHARS = 300


def conductor_config(api_base: str) -> dict[str, object]:
    return {
        "model": f"openai/{MODEL_ALIAS}",
        "api_base": api_base,
        "schema_dialect": LLAMA_CPP,
        "temperature": 0.0,
        "max_plan_steps": MAX_PLAN_STEPS,
        "max_text_chars": MAX_TEXT_CHARS,
        "max_tokens": 512,
        "top_logprobs": 5,
        "alternatives": PROBE,
    }


def local_model_register(*, api_base: str, actor: Actor) -> tuple[Worker, ConductorVersion]:
    """The local model's worker (registered, or its endpoint brought up to date) and its `llm` conductor
    version (made once, never made active here: the learned conductor stays the default). Audited."""
    worker, _ = worker_upsert(slug=WORKER_SLUG, fields=worker_fields(api_base), actor=actor)
    with transaction.atomic():
        version, created = ConductorVersion.objects.get_or_create(
            name=CONDUCTOR_NAME,
            defaults={
                "backend": ConductorVersion.Backend.LLM,
                "config": conductor_config(api_base),
                "notes": "SmolLM2-135M-Instruct on this machine's CPU writes the workflow (llama.cpp's server)",
            },
        )
        if created:
            event_record(
                actor=actor,
                action=Action.CONDUCTORVERSION_REGISTERED,
                obj=version,
                payload={"backend": version.backend, "config": version.config, "notes": version.notes},
            )
    return worker, version
