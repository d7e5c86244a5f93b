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
from ..models import CONDUCTOR_SLUG, Attempt, Step, StepStatus, StopReason
from ..models.transitions import Change as By
from ..providers import Completion, ProviderCallError
from .calls import Call, Sent, backoff
from .changes import Change, Cost, Event, moved, then
from .execution import Assumed, RunExecution, RunStopped
from .executor import apply


def settle(
    execution: RunExecution,
    call: Call,
    sent: Sent,
    *,
    with_next: Callable[[Assumed, Change], Change] | None = None,
) -> Change | None:
    """Record an attempt's outcome. A success returns its change as applied (with `with_next`, the
    change applied with it: the next step's start). None: retry it (after call.delay_s). Raises
    RunStopped when the step failed for good."""
    assert call.attempt is not None
    exc = sent.error
    if exc is None:
        success = Success.of(call, sent)
        return apply(execution, success.change if with_next is None else then(success.change, with_next))
    call.made += 1
    last = not exc.retryable or call.made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS
    apply(execution, lambda assumed: attempt_failed(call.step, call.attempt, exc, latency_ms=sent.latency_ms))  # type: ignore[arg-type]
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
        apply(execution, lambda assumed: step_failed(step, message))
        raise RunStopped(message, stop_reason=exc.code or StopReason.STEP_FAILED) from exc
    call.delay_s = backoff(call.made, exc.retry_after)
    call.number += 1
    call.attempt = None
    return None


def attempt_failed(step: Step, attempt: Attempt, exc: ProviderCallError, *, latency_ms: int) -> Change:
    """An attempt failed (its step is tried again, or fails: another change)."""
    return Change(
        by=(By.ATTEMPT_FAILED,),
        updates=(
            moved(
                attempt,
                By.ATTEMPT_FAILED,
                status=exc.status,
                http_status=exc.http_status,
                error=str(exc),
                latency_ms=latency_ms,
                finished_at=timezone.now(),
            ),
        ),
        events=(
            Event(
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
            ),
        ),
    )


@dataclass(frozen=True)
class Success:
    """An attempt that succeeded: what it adds to the run's totals, and the step's answer."""

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
        assert attempt is not None and completion is not None
        cost = call.worker.cost_of(
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

    def change(self, assumed: Assumed | None = None) -> Change:
        """The attempt succeeded, and its step with it (`step_succeeded`)."""
        return step_succeeded(self.step, response=self.completion.text, now=self.now, success=self)


def step_succeeded(
    step: Step, *, response: str, now: datetime, note: str = "", success: Success | None = None
) -> Change:
    """A step succeeded with `response`: a worker step by its attempt's `success` (the attempt, the
    step's totals, the run's), a conductor step by its nested plan's answer (`note` says how)."""
    latency_ms = int((now - step.started_at).total_seconds() * 1000) if step.started_at else None
    values: dict[str, Any] = {
        "status": StepStatus.SUCCEEDED,
        "response": response,
        "finished_at": now,
        "error": "",
        "note": note,
    }
    updates = []
    cost = Cost()
    if success is not None:
        completion = success.completion
        updates.append(
            moved(
                success.attempt,
                By.STEP_SUCCEEDED,
                status=Attempt.Status.SUCCEEDED,
                input_tokens=completion.input_tokens,
                output_tokens=completion.output_tokens,
                cost_usd=success.cost,
                latency_ms=success.latency_ms,
                provider_request_id=completion.request_id[:200],
                finished_at=now,
            )
        )
        values |= {
            "cost_usd": success.totals["cost"],
            "input_tokens": success.totals["input_tokens"],
            "output_tokens": success.totals["output_tokens"],
            "latency_ms": latency_ms if latency_ms is not None else success.latency_ms,
        }
        cost = Cost(success.cost, completion.input_tokens, completion.output_tokens)
    else:
        values["latency_ms"] = latency_ms
    updates.append(moved(step, By.STEP_SUCCEEDED, **values))
    return Change(
        by=(By.STEP_SUCCEEDED,),
        updates=tuple(updates),
        events=(Event(Action.STEP_SUCCEEDED, step, succeeded_payload(step, response, note, success)),),
        cost=cost,
    )


def succeeded_payload(step: Step, response: str, note: str, success: Success | None) -> dict[str, Any]:
    """The payload of step.succeeded: a worker step's with its attempt, a conductor step's with the
    note that says how its nested plan answered."""
    payload: dict[str, Any] = {
        "index": step.index,
        "worker": CONDUCTOR_SLUG if step.is_conductor else step.worker_slug,
        "response_sha256": content_hash(response),
    }
    if success is None:
        return payload | {"note": note}
    completion = success.completion
    return payload | {
        "vendor": step.vendor,
        "attempt": success.attempt.number,
        "input_tokens": completion.input_tokens,
        "output_tokens": completion.output_tokens,
        "cost_usd": success.cost,
        "latency_ms": success.latency_ms,
    }


def step_failed(
    step: Step, message: str, *, note: str = "", by: By = By.STEP_FAILED, now: Any = None
) -> Change:
    """A step failed (`by` its run's end too: one it interrupted), with its event."""
    now = now or timezone.now()
    return Change(
        by=(by,),
        updates=(moved(step, by, status=StepStatus.FAILED, error=message, note=note, finished_at=now),),
        events=(
            Event(
                Action.STEP_FAILED,
                step,
                failed_payload(step, message, note, settled_with_run=by != By.STEP_FAILED),
            ),
        ),
    )


def failed_payload(step: Step, message: str, note: str, *, settled_with_run: bool) -> dict[str, Any]:
    """The payload of step.failed."""
    return {
        "index": step.index,
        "depth": step.depth,
        "worker": step.worker_slug,
        "error": message,
        "note": note,
        "settled_with_run": settled_with_run,
    }
