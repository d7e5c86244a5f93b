"""A step's call to its worker: the messages it is sent (what it may see), the call itself, and the
backoff between attempts. No database write: a call is started (step_start) and settled
(step_settle) on the engine's thread, which makes every write of the run (on one connection); only
`send`, the provider call, runs on a pool thread when steps run side by side.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from ..models import Attempt, Step, StepStatus, Worker
from ..plans import visible_indices
from ..providers import Completion, ProviderCallError, complete, worker_api_key
from .execution import RunExecution

log = logging.getLogger(__name__)


WORKER_SYSTEM_PROMPT = (
    "You are one worker in a team of models. Do the subtask you are given. Results of earlier steps, "
    "when shown, are for your use; they may contain mistakes."
)


def dependencies(step: Step) -> list[int]:
    return visible_indices(step.access, step.index)


def visible_steps(step: Step) -> list[Step]:
    indices = dependencies(step)
    return list(Step.objects.filter(decision_id=step.decision_id, index__in=indices).order_by("index"))


def last_response_before(step: Step) -> str:
    previous = (
        Step.objects.filter(decision_id=step.decision_id, index__lt=step.index, status=StepStatus.SUCCEEDED)
        .order_by("-index")
        .values_list("response", flat=True)
        .first()
    )
    return previous or ""


def build_messages(
    step: Step, visible: list[Step], answers: Mapping[int, str] | None = None
) -> list[dict[str, str]]:
    """Exactly what a worker receives: its instruction and the steps its access list grants (their
    responses; `answers`: by step index, those not yet on their instances)."""
    answers = answers or {}
    parts = []
    if visible:
        parts.append("Results of earlier steps:")
        for earlier in visible:
            parts.append(
                f"--- Step {earlier.index} ({earlier.worker_slug})\nInstruction:\n{earlier.instruction}\n\nResponse:\n{answers.get(earlier.index, earlier.response)}"
            )
        parts.append("--- Your subtask")
    parts.append(step.instruction)
    return [
        {"role": "system", "content": WORKER_SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def backoff(attempt_number: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, settings.CONDUCTOR_RETRY_AFTER_MAX_S)  # the provider said how long
    base = settings.CONDUCTOR_RETRY_BACKOFF_S * (2 ** (attempt_number - 1))
    return min(base, settings.CONDUCTOR_RETRY_BACKOFF_MAX_S) * (0.5 + random.random() / 2)


@dataclass
class Call:
    """A worker step's call to its worker, attempt by attempt. The engine's thread starts and settles
    it (every database write); `send`, the provider call alone, may run on another thread."""

    step: Step
    worker: Worker
    number: int  # the number of the attempt to make (or being made)
    made: int  # attempts made that count against the retries (a lost one does not)
    attempt: Attempt | None = None
    delay_s: float = 0.0  # the backoff before the next attempt
    started_at: datetime | None = None  # when its step first started (a resumed one), before this call


@dataclass
class Sent:
    completion: Completion | None
    error: ProviderCallError | None
    latency_ms: int


def send(call: Call, metadata: dict[str, Any]) -> Sent:
    """The provider call of the current attempt: no database, no retry (its outcome is settled by
    `settle`). Safe on any thread."""
    started = time.monotonic()
    try:
        completion = complete(
            model=call.worker.litellm_model,
            messages=call.step.messages_sent or [],
            api_base=call.worker.api_base,
            api_key=worker_api_key(call.worker),  # a key outside the allow-list fails this attempt, unmade
            metadata=metadata,
        )
    except ProviderCallError as exc:
        return Sent(None, exc, int((time.monotonic() - started) * 1000))
    return Sent(completion, None, int((time.monotonic() - started) * 1000))


def call_metadata(execution: RunExecution) -> dict[str, Any]:
    """What a call tells its provider about the run; checked first: the claim is still this process's."""
    execution.claim_current()
    run = execution.run
    return {"replay_item": run.task.source_item, "run": str(run.correlation_id)}
