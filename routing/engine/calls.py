"""Calls to workers: the messages a step is sent (what it may see), the budget checks, one retry loop
with backoff for timeouts, 429 and 5xx, and an attempt row with its cost per call.
"""

from __future__ import annotations

import logging
import random
import time
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from audit import policies
from audit.actions import Action

from ..hashing import content_hash
from ..models import (
    Attempt,
    Run,
    Step,
    StepStatus,
    StopReason,
)
from ..plans import visible_indices
from ..providers import ProviderCallError, complete, worker_api_key
from .record import RunStopped, add_cost, claim_current, fence, record_event

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


def build_messages(step: Step, visible: list[Step]) -> list[dict[str, str]]:
    """Exactly what a worker receives: its instruction and the steps its access list grants."""
    parts = []
    if visible:
        parts.append("Results of earlier steps:")
        for earlier in visible:
            parts.append(
                f"--- Step {earlier.index} ({earlier.worker_slug})\nInstruction:\n{earlier.instruction}\n\nResponse:\n{earlier.response}"
            )
        parts.append("--- Your subtask")
    parts.append(step.instruction)
    return [
        {"role": "system", "content": WORKER_SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _spent(run: Run) -> Decimal:
    return Run.objects.filter(pk=run.pk).values_list("cost_usd", flat=True).get()


def check_cost_budget(run: Run, step: Step) -> None:
    spent = _spent(run)
    if spent >= run.task.max_usd:
        message = f"cost budget of ${run.task.max_usd} reached (spent ${spent}) before step {step.index} ({step.worker_slug})"
        step_failed(run, step, message, note="cost budget")
        raise RunStopped(message, stop_reason=StopReason.COST_BUDGET)


def backoff(attempt_number: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, settings.CONDUCTOR_RETRY_AFTER_MAX_S)  # the provider said how long
    base = settings.CONDUCTOR_RETRY_BACKOFF_S * (2 ** (attempt_number - 1))
    return min(base, settings.CONDUCTOR_RETRY_BACKOFF_MAX_S) * (0.5 + random.random() / 2)


def call_worker(run: Run, step: Step) -> None:
    worker = step.worker
    if worker is None or not worker.enabled:
        message = (
            f"step {step.index} names worker {step.worker_slug!r}, which is not registered or not enabled"
        )
        step_failed(run, step, message)
        raise RunStopped(message, stop_reason=StopReason.UNKNOWN_WORKER)
    verdict = policies.judge(worker, run.task.classification, policies.active_rules())
    if not verdict.allowed:  # a rule may have changed since the plan was checked
        message = f"step {step.index} blocked by policy '{verdict.rule}' before the call: {verdict.reason}"
        step_failed(run, step, message, note=f"policy {verdict.rule}")
        raise RunStopped(message, stop_reason=StopReason.POLICY_BLOCKED)
    # Attempts made so far (a lost one was never answered: it does not count against the retries).
    earlier = step.attempts.aggregate(
        made=Count("pk", filter=~Q(status=Attempt.Status.LOST)), last=Max("number")
    )
    made = earlier["made"]
    number = (earlier["last"] or 0) + 1
    while True:
        check_cost_budget(run, step)
        claim_current(run)
        with transaction.atomic():
            fence(run)
            attempt = Attempt.objects.create(step=step, number=number, started_at=timezone.now())
        started = time.monotonic()
        try:
            completion = complete(
                model=worker.litellm_model,
                messages=step.messages_sent or [],
                api_base=worker.api_base,
                api_key=worker_api_key(worker),  # a key outside the allow-list fails this attempt, unmade
                metadata={"replay_item": run.task.source_item, "run": str(run.correlation_id)},
            )
        except ProviderCallError as exc:
            made += 1
            latency_ms = int((time.monotonic() - started) * 1000)
            last = not exc.retryable or made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS
            _attempt_failed(run, step, attempt, exc, latency_ms=latency_ms)
            if last:
                if exc.code:  # a known outcome (the replay pool has no answer): its own words, its own reason
                    message = f"step {step.index} ({step.worker_slug}): {exc}"
                else:
                    message = (
                        f"step {step.index} ({step.worker_slug}) failed after {made} attempt(s): {exc.status}"
                        + (f" (HTTP {exc.http_status})" if exc.http_status else "")
                        + f": {exc}"
                    )
                step_failed(run, step, message)
                raise RunStopped(message, stop_reason=exc.code or StopReason.STEP_FAILED) from exc
            time.sleep(backoff(made, exc.retry_after))
            number += 1
            continue
        latency_ms = int((time.monotonic() - started) * 1000)
        _attempt_succeeded(run, step, attempt, completion, latency_ms=latency_ms)
        return


def _attempt_failed(
    run: Run, step: Step, attempt: Attempt, exc: ProviderCallError, *, latency_ms: int
) -> None:
    with transaction.atomic():
        attempt.status = exc.status
        attempt.http_status = exc.http_status
        attempt.error = str(exc)
        attempt.latency_ms = latency_ms
        attempt.finished_at = timezone.now()
        attempt.save(update_fields=["status", "http_status", "error", "latency_ms", "finished_at"])
        record_event(
            run,
            Action.ATTEMPT_FAILED,
            attempt,
            {
                "step_id": step.pk,
                "number": attempt.number,
                "status": exc.status,
                "http_status": exc.http_status,
                "error": str(exc),
                "code": exc.code,
                "vendor": step.vendor,
                "retryable": exc.retryable,
            },
        )


def _attempt_succeeded(run: Run, step: Step, attempt: Attempt, completion: Any, *, latency_ms: int) -> None:
    assert step.worker is not None
    cost = step.worker.cost_of(input_tokens=completion.input_tokens, output_tokens=completion.output_tokens)
    now = timezone.now()
    with transaction.atomic():
        attempt.status = Attempt.Status.SUCCEEDED
        attempt.input_tokens = completion.input_tokens
        attempt.output_tokens = completion.output_tokens
        attempt.cost_usd = cost
        attempt.latency_ms = latency_ms
        attempt.provider_request_id = completion.request_id[:200]
        attempt.finished_at = now
        attempt.save()
        if attempt.number == 1:  # the step's only attempt: its totals are this call's
            totals = {
                "cost": cost,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
            }
        else:  # earlier ones may have cost something (a lost call's estimate)
            totals = step.attempts.aggregate(
                cost=Sum("cost_usd"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens")
            )
        Step.objects.filter(pk=step.pk).update(
            status=StepStatus.SUCCEEDED,
            response=completion.text,
            cost_usd=totals["cost"],
            input_tokens=totals["input_tokens"],
            output_tokens=totals["output_tokens"],
            latency_ms=int((now - step.started_at).total_seconds() * 1000) if step.started_at else latency_ms,
            finished_at=now,
            error="",
        )
        add_cost(run, cost=cost, input_tokens=completion.input_tokens, output_tokens=completion.output_tokens)
        record_event(
            run,
            Action.STEP_SUCCEEDED,
            step,
            {
                "index": step.index,
                "worker": step.worker_slug,
                "vendor": step.vendor,
                "attempt": attempt.number,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
                "cost_usd": cost,
                "latency_ms": latency_ms,
                "response_sha256": content_hash(completion.text),
            },
        )


def step_failed(run: Run, step: Step, message: str, *, note: str = "") -> None:
    with transaction.atomic():
        Step.objects.filter(pk=step.pk).update(
            status=StepStatus.FAILED, error=message, note=note, finished_at=timezone.now()
        )
        record_event(
            run,
            Action.STEP_FAILED,
            step,
            {"index": step.index, "worker": step.worker_slug, "error": message, "note": note},
        )
