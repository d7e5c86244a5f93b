"""Calls to workers: the messages a step is sent (what it may see), the budget and policy checks,
retries with backoff for timeouts, 429 and 5xx, and an attempt row with its cost per call.

A call is started and settled on the engine's thread, which makes every database write of the run
(on one connection); only `send`, the provider call itself, runs on a pool thread when steps run
side by side.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
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
    Worker,
)
from ..plans import visible_indices
from ..providers import Completion, ProviderCallError, complete, worker_api_key
from .record import Fence, RunStopped, Writes, claim_current, write_once
from .workers import workers_as_of

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


def call_metadata(run: Run) -> dict[str, Any]:
    """What a call tells its provider about the run; checked first: the claim is still this process's."""
    claim_current(run)
    return {"replay_item": run.task.source_item, "run": str(run.correlation_id)}


def begin_step(run: Run, step: Step, visible: list[Step]) -> Call:
    """Start a worker step and its first attempt, in one transaction: the step running with the exact
    messages it is sent, the attempt started, the event. The checks come first, on what the write's
    statement checks is still so: the worker is still registered and enabled, the policy rules still
    let it have the task's data (either may have changed since the plan was checked: their stamps
    ride on the statement, and they are read again when one moved), and the cost budget is not
    reached. Raises RunStopped (the step failed) when one says no."""
    if step.started_at is None:  # never started: no attempts yet
        call = Call(step=step, worker=step.worker, number=1, made=0)  # type: ignore[arg-type]  # checked in _start
    else:  # resumed: attempts made so far (a lost one was never answered: it does not count)
        earlier = step.attempts.aggregate(
            made=Count("pk", filter=~Q(status=Attempt.Status.LOST)), last=Max("number")
        )
        call = Call(
            step=step,
            worker=step.worker,  # type: ignore[arg-type]  # checked in _start
            number=(earlier["last"] or 0) + 1,
            made=earlier["made"],
            started_at=step.started_at,
        )
    stopped = write_once(run, partial(_start, run, call, visible))
    if stopped is not None:
        raise stopped
    return call


def starts_with_the_last(step: Step) -> bool:
    """Whether a step can start in the transaction that records the step before it succeeded (a worker
    step never started, its worker enabled): the one transaction a step of a sequence costs."""
    return (
        not step.is_conductor and step.worker is not None and step.worker.enabled and step.started_at is None
    )


def begin_next(
    run: Run, step: Step, visible: list[Step], fenced: Fence, writes: Writes
) -> tuple[Call, RunStopped | None]:
    """`begin_step` for a step that `starts_with_the_last`, staged in that transaction's writes (on its
    totals and rules' stamp). Returns the call and, when a check said no, why the run stops (raise it
    after the transaction: the step before it succeeded, and that stays)."""
    assert step.worker is not None
    call = Call(step=step, worker=step.worker, number=1, made=0)
    return call, _start(run, call, visible, fenced, writes)


def begin_with_plan(run: Run, steps: list[Step], fenced: Fence, writes: Writes) -> dict[int, Call]:
    """The plan's first steps (those that see no other), started in the plan's own statement when
    every one of them may start (`_refused` says nothing against it, on the statement's stamps and
    totals). Staged in the plan's writes; returns their calls by index, or none (then the schedule
    starts each as usual, and records why one may not)."""
    first = [step for step in steps if not dependencies(step)]
    if not first or not all(starts_with_the_last(s) and _refused(run, s, fenced) is None for s in first):
        return {}
    begun = {}
    for step in first:
        call = Call(step=step, worker=step.worker, number=1, made=0)  # type: ignore[arg-type]  # checked above
        stopped = _start(run, call, [], fenced, writes)
        assert stopped is None  # refused above, on the same stamps, if it were
        begun[step.index] = call
    return begun


def _refused(run: Run, step: Step, fenced: Fence) -> tuple[RunStopped, str] | None:
    """Why a step may not start as of a write's stamps and totals (the run's stop, and the step's
    note), or None: its worker is no longer registered and enabled (or is another row of that name),
    the policy rules no longer let it have the task's data, or the cost budget is reached."""
    worker = workers_as_of(fenced.workers_stamp).get(step.worker_slug)  # as it is now: enabled, or None
    if worker is None or worker.pk != step.worker_id:
        message = (
            f"step {step.index} names worker {step.worker_slug!r}, which is not registered or not enabled"
        )
        return RunStopped(message, stop_reason=StopReason.UNKNOWN_WORKER), ""
    verdict = policies.judge(worker, run.task.classification, policies.rules_as_of(fenced.rules_stamp))
    if not verdict.allowed:
        message = f"step {step.index} blocked by policy '{verdict.rule}' before the call: {verdict.reason}"
        return RunStopped(message, stop_reason=StopReason.POLICY_BLOCKED), f"policy {verdict.rule}"
    if fenced.spent >= run.task.max_usd:
        return _budget_stop(run, step, fenced.spent), BUDGET_NOTE
    return None


def _start(run: Run, call: Call, visible: list[Step], fenced: Fence, writes: Writes) -> RunStopped | None:
    step = call.step
    refused = _refused(run, step, fenced)
    if refused is not None:
        stop, note = refused
        mark_failed(run, step, str(stop), writes, note=note)
        return stop
    step.worker = call.worker = workers_as_of(fenced.workers_stamp)[step.worker_slug]
    step.messages_sent = build_messages(step, visible)
    writes.update(
        step,
        status=StepStatus.RUNNING,
        # A resumed step keeps its first start; a start staged again is now again, not the first try's.
        started_at=call.started_at or timezone.now(),
        messages_sent=step.messages_sent,
    )
    writes.event(Action.STEP_STARTED, step, started_payload(run, step, visible))
    call.attempt = writes.insert(Attempt(step=step, number=call.number, started_at=timezone.now()))
    return None


def started_payload(run: Run, step: Step, visible: list[Step]) -> dict[str, Any]:
    return {
        "index": step.index,
        "depth": step.depth,
        "worker": step.worker_slug,
        "vendor": step.vendor,
        "model": step.worker.litellm_model if step.worker else None,
        "classification": run.task.classification,
        "sees_steps": [s.pk for s in visible],
        "sees_step_hashes": {str(s.pk): content_hash(s.response) for s in visible},
        "messages_sha256": content_hash(step.messages_sent) if step.messages_sent else None,
    }


def begin_retry(run: Run, call: Call) -> None:
    """The next attempt of a call, after its backoff: started unless the budget is reached."""

    def stage(fenced: Fence, writes: Writes) -> RunStopped | None:
        if fenced.spent >= run.task.max_usd:
            return _budget_reached(run, call.step, fenced.spent, writes)
        call.attempt = writes.insert(Attempt(step=call.step, number=call.number, started_at=timezone.now()))
        return None

    stopped = write_once(run, stage)
    if stopped is not None:
        raise stopped


BUDGET_NOTE = "cost budget"


def _budget_stop(run: Run, step: Step, spent: Decimal) -> RunStopped:
    message = f"cost budget of ${run.task.max_usd} reached (spent ${spent}) before step {step.index} ({step.worker_slug})"
    return RunStopped(message, stop_reason=StopReason.COST_BUDGET)


def _budget_reached(run: Run, step: Step, spent: Decimal, writes: Writes) -> RunStopped:
    stop = _budget_stop(run, step, spent)
    mark_failed(run, step, str(stop), writes, note=BUDGET_NOTE)
    return stop


def settle(run: Run, call: Call, sent: Sent, *, then: Callable[[Fence, Writes], None] | None = None) -> bool:
    """Record an attempt's outcome. True: the step succeeded (and `then` ran in the same transaction,
    fenced with the rules' stamp). False: retry it (after call.delay_s). Raises RunStopped when the step
    failed for good."""
    assert call.attempt is not None
    exc = sent.error
    if exc is None:
        _attempt_succeeded(run, call, sent, then=then)
        return True
    call.made += 1
    last = not exc.retryable or call.made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS
    _attempt_failed(run, call.step, call.attempt, exc, latency_ms=sent.latency_ms)
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
        step_failed(run, step, message)
        raise RunStopped(message, stop_reason=exc.code or StopReason.STEP_FAILED) from exc
    call.delay_s = backoff(call.made, exc.retry_after)
    call.number += 1
    call.attempt = None
    return False


def _attempt_failed(
    run: Run, step: Step, attempt: Attempt, exc: ProviderCallError, *, latency_ms: int
) -> None:
    def stage(fenced: Fence, writes: Writes) -> None:
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

    write_once(run, stage)


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
    run: Run, call: Call, sent: Sent, *, then: Callable[[Fence, Writes], None] | None = None
) -> None:
    """The attempt, its step and the run's totals, in one transaction (the cost rides on the fence),
    then `then` in it (staged in its writes)."""
    success = Success.of(call, sent)

    def stage(fenced: Fence, writes: Writes) -> None:
        success.stage(writes)
        if then is not None:
            then(fenced, writes)

    write_once(
        run,
        stage,
        cost=success.cost,
        input_tokens=success.completion.input_tokens,
        output_tokens=success.completion.output_tokens,
    )


def step_failed(run: Run, step: Step, message: str, *, note: str = "") -> None:
    write_once(run, lambda fenced, writes: mark_failed(run, step, message, writes, note=note))


def mark_failed(run: Run, step: Step, message: str, writes: Writes, *, note: str = "") -> None:
    """A step failed, with its event: staged in the writes of the caller's transaction."""
    writes.update(step, status=StepStatus.FAILED, error=message, note=note, finished_at=timezone.now())
    writes.event(
        Action.STEP_FAILED,
        step,
        {"index": step.index, "worker": step.worker_slug, "error": message, "note": note},
    )
