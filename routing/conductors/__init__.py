"""Conductors: given a task and the pool, write a workflow. One interface, several backends.

A conductor only proposes text; the engine parses and validates it (routing.plans) the same way
whatever the backend, so a rule-based plan and a model's plan are held to one standard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..models import ConductorVersion
from ..plans import MAX_STEPS
from .base import Conductor, ConductorUnavailable, PlanRequest, Proposal, WorkerCard
from .llm import LLMConductor, worker_alternatives
from .static import DEFAULT_STATIC_RULES, StaticConductor

# Conductor backends by ConductorVersion.backend. Apps above routing add theirs (training registers the
# learned policy in its AppConfig.ready), so routing never imports them.
_BACKENDS: dict[str, Callable[[dict[str, Any]], Conductor]] = {
    ConductorVersion.Backend.STATIC: StaticConductor,
    ConductorVersion.Backend.LLM: LLMConductor,
}


def backend_register(backend: str, factory: Callable[[dict[str, Any]], Conductor]) -> None:
    """Make `conductor_for` build versions of this backend with `factory(config)`."""
    _BACKENDS[backend] = factory


def conductor_for(version: ConductorVersion) -> Conductor:
    factory = _BACKENDS.get(version.backend)
    if factory is None:
        raise ValueError(f"conductor backend {version.backend!r} is not available")
    return factory(version.config)


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
    "conductor_for",
    "worker_alternatives",
]
