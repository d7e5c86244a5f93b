"""The conductor interface: what a conductor is asked (PlanRequest, with the pool as WorkerCards) and
what it answers (Proposal). A conductor only proposes text; the engine parses and validates it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from ..models import CONDUCTOR_SLUG, Worker


@dataclass(frozen=True)
class WorkerCard:
    slug: str
    vendor: str
    description: str
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal

    @classmethod
    def of(cls, worker: Worker) -> WorkerCard:
        return cls(
            worker.slug,
            worker.vendor,
            worker.description,
            worker.input_usd_per_mtok,
            worker.output_usd_per_mtok,
        )


@dataclass(frozen=True)
class PlanRequest:
    task_text: str
    domain: str
    workers: list[WorkerCard]
    max_steps: int
    may_recurse: bool
    feedback: str = ""  # why the previous proposal was rejected
    parent_plan: dict[str, Any] | None = None  # set for a recursive (inner) call
    last_response: str = ""
    visible_responses: tuple[str, ...] = ()  # inner call: responses of the steps the conductor step may see
    temperature: float | None = None  # set for rollouts: sample the plan at this temperature
    seed: int | None = None  # makes a sampled plan reproducible

    @property
    def is_inner(self) -> bool:
        return self.parent_plan is not None

    @property
    def allowed_slugs(self) -> list[str]:
        slugs = [w.slug for w in self.workers]
        return slugs + [CONDUCTOR_SLUG] if self.may_recurse else slugs


@dataclass
class Proposal:
    raw_output: str
    prompt: list[dict[str, Any]] = field(default_factory=list)
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal = Decimal("0")
    latency_ms: float = 0.0  # milliseconds, to the microsecond: a learned conductor decides in well under one


def elapsed_ms(started: float) -> float:
    """Milliseconds since `started` (a `time.monotonic()`), to the microsecond."""
    return round((time.monotonic() - started) * 1000, 3)


class ConductorUnavailable(Exception):
    """The conductor could not be asked (endpoint down after retries); not a plan error."""


class Conductor(Protocol):
    def propose(self, request: PlanRequest) -> Proposal: ...
