"""Conductors: given a task and the pool, write a workflow. One interface, several backends.

A conductor only proposes text; the engine parses and validates it (routing.plans) the same way
whatever the backend, so a rule-based plan and a model's plan are held to one standard.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..models import ConductorVersion
from ..plans import MAX_STEPS
from .base import Conductor, ConductorUnavailable, PlanRequest, Proposal, WorkerCard, elapsed_ms
from .llm import LLMConductor, worker_alternatives
from .static import DEFAULT_STATIC_RULES, StaticConductor

# Conductor backends by ConductorVersion.backend. Apps above routing add theirs (training registers the
# learned policy in its AppConfig.ready), so routing never imports them.
_BACKENDS: dict[str, Callable[[dict[str, Any]], Conductor]] = {
    ConductorVersion.Backend.STATIC: StaticConductor,
    ConductorVersion.Backend.LLM: LLMConductor,
}


def backend_register(backend: str, factory: Callable[[dict[str, Any]], Conductor]) -> None:
    """Make `conductor_load` build versions of this backend with `factory(config)`."""
    _BACKENDS[backend] = factory


# Built conductors, one per version and config, kept for the life of the process: a learned policy
# is parsed once, not on every plan. A changed config is another key; versions are never edited in
# place once they have runs (a retrained policy is a new version with a file of its own).
CACHE_SIZE = 16
_built: OrderedDict[tuple[int | None, str, str, str], Conductor] = OrderedDict()
_built_lock = threading.Lock()


def conductor_load(version: ConductorVersion) -> tuple[Conductor, float]:
    """The version's conductor and the milliseconds this call spent building it (0 when it was built
    before): the engine adds them to the plan's latency, which is what the run waited."""
    factory = _BACKENDS.get(version.backend)
    if factory is None:
        raise ValueError(f"conductor backend {version.backend!r} is not available")
    made = version.created_at.isoformat() if version.created_at else ""
    key = (version.pk, made, version.backend, json.dumps(version.config, sort_keys=True, default=str))
    with _built_lock:
        found = _built.get(key)
        if found is not None:
            _built.move_to_end(key)
            return found, 0
    started = time.monotonic()
    conductor = factory(version.config)
    load_ms = elapsed_ms(started)
    with _built_lock:
        _built[key] = conductor
        while len(_built) > CACHE_SIZE:
            _built.popitem(last=False)
    return conductor, load_ms


__all__ = [
    "DEFAULT_STATIC_RULES",
    "MAX_STEPS",
    "Conductor",
    "ConductorUnavailable",
    "LLMConductor",
    "PlanRequest",
    "Proposal",
    "StaticConductor",
    "WorkerCard",
    "backend_register",
    "conductor_load",
    "elapsed_ms",
    "worker_alternatives",
]
