"""A call's outcome settles: its attempt succeeded (the attempt, its step's answer and totals, the
run's totals, the event, in one write), failed and is tried again after a backoff, or failed for
good (the step failed, and the run stops).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from audit.actions import Action

from ..hashing import content_hash
from ..models import Attempt, Step, StepStatus, StopReason
from ..providers import Completion, ProviderCallError
from .calls import Call, Sent, backoff
from .execution import Assumed, RunExecution, RunStopped
from .fence import write_once
from .statement import Writes


def settle(
    execution: RunExecution, call: Call, sent: Sent, *, then: Callable[[Assumed, Writes], None] | None = None
) -> bool:
    """Record an attempt's outcome. True: the step succeeded (and `then` ran in the same transaction,
    assumed with the rules' stamp). False: retry it (after call.delay_s). Raises RunStopped when the step
    failed for good."""
    assert call.attempt is not None
    exc = sent.error
    if exc is None:
        _attempt_succeeded(execution, call, sent, then=then)
        return True
    call.made += 1
    last = not exc.retryable or call.made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS
    _attempt_failed(execution, call.step, call.attempt, exc, latency_ms=sent.latency_ms)
    if last:
        step = call.step
        if exc.code:  # a known outcome (the replay pool has no answer): its own words, its own reason
            message = f"step {step.index} ({step.worker_slug}): {exc}"
        else:
            message = (
                f"step {step.index} ({step.worker_slug}) failed after {call.made} attempt(s): {exc.status}"
                + (f" (HTTP {exc.http_status})" if exc.http_status else "")
                + f": {exc}"
            )
        step_failed(execution, step, message)
        raise RunStopped(message, stop_reason=exc.code or StopReason.STEP_FAILED) from exc
    call.delay_s = backoff(call.made, exc.retry_after)
    call.number += 1
    call.attempt = None
    return False


def _attempt_failed(
    execution: RunExecution, step: Step, attempt: Attempt, exc: ProviderCallError, *, latency_ms: int
) -> None:
    def stage(assumed: Assumed, writes: Writes) -> None:
        writes.update(
            attempt,
            status=exc.status,
            http_status=exc.http_status,
            error=str(exc),
            latency_ms=latency_ms,
            finished_at=timezone.now(),
        )
        writes.event(
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

    write_once(execution, stage)


@dataclass(frozen=True)
class Success:
    """An attempt that succeeded, to be staged in a write (`stage`): what it adds to the run's totals,
    and the step's answer."""

    step: Step
    attempt: Attempt
    completion: Completion
    latency_ms: int
    cost: Decimal
    totals: dict[str, Any]  # the step's: its attempts' cost and tokens, this one's included
    now: datetime

    @classmethod
    def of(cls, call: Call, sent: Sent) -> Success:
        step, attempt, completion = call.step, call.attempt, sent.completion
        assert step.worker is not None and attempt is not None and completion is not None
        cost = step.worker.cost_of(
            input_tokens=completion.input_tokens, output_tokens=completion.output_tokens
        )
        if attempt.number == 1:  # the step's only attempt: its totals are this call's
            totals = {
                "cost": cost,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
            }
        else:  # earlier ones may have cost something (a lost call's estimate)
            earlier = step.attempts.exclude(pk=attempt.pk).aggregate(
                cost=Sum("cost_usd"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens")
            )
            totals = {
                "cost": (earlier["cost"] or Decimal(0)) + cost,
                "input_tokens": (earlier["input_tokens"] or 0) + completion.input_tokens,
                "output_tokens": (earlier["output_tokens"] or 0) + completion.output_tokens,
            }
        return cls(step, attempt, completion, sent.latency_ms, cost, totals, timezone.now())

    def stage(self, writes: Writes) -> None:
        """The attempt, its step and its event, staged (the run's totals ride on the write's fence)."""
        step, attempt, completion, now = self.step, self.attempt, self.completion, self.now
        writes.update(
            attempt,
            status=Attempt.Status.SUCCEEDED,
            input_tokens=completion.input_tokens,
            output_tokens=completion.output_tokens,
            cost_usd=self.cost,
            latency_ms=self.latency_ms,
            provider_request_id=completion.request_id[:200],
            finished_at=now,
        )
        writes.update(
            step,
            status=StepStatus.SUCCEEDED,
            response=completion.text,
            cost_usd=self.totals["cost"],
            input_tokens=self.totals["input_tokens"],
            output_tokens=self.totals["output_tokens"],
            latency_ms=int((now - step.started_at).total_seconds() * 1000)
            if step.started_at
            else self.latency_ms,
            finished_at=now,
            error="",
        )
        writes.event(
            Action.STEP_SUCCEEDED,
            step,
            {
                "index": step.index,
                "worker": step.worker_slug,
                "vendor": step.vendor,
                "attempt": attempt.number,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
                "cost_usd": self.cost,
                "latency_ms": self.latency_ms,
                "response_sha256": content_hash(completion.text),
            },
        )


def _attempt_succeeded(
    execution: RunExecution, call: Call, sent: Sent, *, then: Callable[[Assumed, Writes], None] | None = None
) -> None:
    """The attempt, its step and the run's totals, in one transaction (the cost rides on the fence),
    then `then` in it (staged in its writes)."""
    success = Success.of(call, sent)

    def stage(assumed: Assumed, writes: Writes) -> None:
        success.stage(writes)
        if then is not None:
            then(assumed, writes)

    write_once(
        execution,
        stage,
        cost=success.cost,
        input_tokens=success.completion.input_tokens,
        output_tokens=success.completion.output_tokens,
    )


def step_failed(execution: RunExecution, step: Step, message: str, *, note: str = "") -> None:
    write_once(execution, lambda assumed, writes: mark_failed(step, message, writes, note=note))


def mark_failed(step: Step, message: str, writes: Writes, *, note: str = "") -> None:
    """A step failed, with its event: staged in the writes of the caller's transaction."""
    writes.update(step, status=StepStatus.FAILED, error=message, note=note, finished_at=timezone.now())
    writes.event(
        Action.STEP_FAILED,
        step,
        {"index": step.index, "worker": step.worker_slug, "error": message, "note": note},
    )
