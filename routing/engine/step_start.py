"""A worker step starts: the checks first (its worker still registered and enabled, the policy rules
still letting it have the task's data, the cost budget not reached), then the step running with the
exact messages it is sent, its attempt started, and the event, in one write. Also the next attempt of
a call after its backoff.
"""

from __future__ import annotations

from decimal import Decimal
from functools import partial
from typing import Any

from django.db.models import Count, Max, Q
from django.utils import timezone

from audit import policies
from audit.actions import Action

from ..hashing import content_hash
from ..models import Attempt, Step, StepStatus, StopReason
from .calls import Call, build_messages, dependencies
from .execution import Assumed, RunExecution, RunStopped
from .fence import write_once
from .statement import Writes
from .step_settle import mark_failed
from .workers import workers_as_of


def begin_step(execution: RunExecution, step: Step, visible: list[Step]) -> Call:
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
    stopped = write_once(execution, partial(_start, execution, call, visible))
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
    execution: RunExecution, step: Step, visible: list[Step], assumed: Assumed, writes: Writes
) -> tuple[Call, RunStopped | None]:
    """`begin_step` for a step that `starts_with_the_last`, staged in that transaction's writes (on its
    totals and rules' stamp). Returns the call and, when a check said no, why the run stops (raise it
    after the transaction: the step before it succeeded, and that stays)."""
    assert step.worker is not None
    call = Call(step=step, worker=step.worker, number=1, made=0)
    return call, _start(execution, call, visible, assumed, writes)


def begin_with_plan(
    execution: RunExecution, steps: list[Step], assumed: Assumed, writes: Writes
) -> dict[int, Call]:
    """The plan's first steps (those that see no other), started in the plan's own statement when
    every one of them may start (`_refused` says nothing against it, on the statement's stamps and
    totals). Staged in the plan's writes; returns their calls by index, or none (then the schedule
    starts each as usual, and records why one may not)."""
    first = [step for step in steps if not dependencies(step)]
    if not first or not all(
        starts_with_the_last(s) and _refused(execution, s, assumed) is None for s in first
    ):
        return {}
    begun = {}
    for step in first:
        call = Call(step=step, worker=step.worker, number=1, made=0)  # type: ignore[arg-type]  # checked above
        stopped = _start(execution, call, [], assumed, writes)
        assert stopped is None  # refused above, on the same stamps, if it were
        begun[step.index] = call
    return begun


def _refused(execution: RunExecution, step: Step, assumed: Assumed) -> tuple[RunStopped, str] | None:
    """Why a step may not start as of a write's stamps and totals (the run's stop, and the step's
    note), or None: its worker is no longer registered and enabled (or is another row of that name),
    the policy rules no longer let it have the task's data, or the cost budget is reached."""
    worker = workers_as_of(assumed.workers_stamp).get(step.worker_slug)  # as it is now: enabled, or None
    if worker is None or worker.pk != step.worker_id:
        message = (
            f"step {step.index} names worker {step.worker_slug!r}, which is not registered or not enabled"
        )
        return RunStopped(message, stop_reason=StopReason.UNKNOWN_WORKER), ""
    verdict = policies.judge(
        worker, execution.run.task.classification, policies.rules_as_of(assumed.rules_stamp)
    )
    if not verdict.allowed:
        message = f"step {step.index} blocked by policy '{verdict.rule}' before the call: {verdict.reason}"
        return RunStopped(message, stop_reason=StopReason.POLICY_BLOCKED), f"policy {verdict.rule}"
    if assumed.spent >= execution.run.task.max_usd:
        return _budget_stop(execution, step, assumed.spent), BUDGET_NOTE
    return None


def _start(
    execution: RunExecution, call: Call, visible: list[Step], assumed: Assumed, writes: Writes
) -> RunStopped | None:
    step = call.step
    refused = _refused(execution, step, assumed)
    if refused is not None:
        stop, note = refused
        mark_failed(step, str(stop), writes, note=note)
        return stop
    step.worker = call.worker = workers_as_of(assumed.workers_stamp)[step.worker_slug]
    step.messages_sent = build_messages(step, visible)
    writes.update(
        step,
        status=StepStatus.RUNNING,
        # A resumed step keeps its first start; a start staged again is now again, not the first try's.
        started_at=call.started_at or timezone.now(),
        messages_sent=step.messages_sent,
    )
    writes.event(Action.STEP_STARTED, step, started_payload(execution, step, visible))
    call.attempt = writes.insert(Attempt(step=step, number=call.number, started_at=timezone.now()))
    return None


def started_payload(execution: RunExecution, step: Step, visible: list[Step]) -> dict[str, Any]:
    return {
        "index": step.index,
        "depth": step.depth,
        "worker": step.worker_slug,
        "vendor": step.vendor,
        "model": step.worker.litellm_model if step.worker else None,
        "classification": execution.run.task.classification,
        "sees_steps": [s.pk for s in visible],
        "sees_step_hashes": {str(s.pk): content_hash(s.response) for s in visible},
        "messages_sha256": content_hash(step.messages_sent) if step.messages_sent else None,
    }


def begin_retry(execution: RunExecution, call: Call) -> None:
    """The next attempt of a call, after its backoff: started unless the budget is reached."""

    def stage(assumed: Assumed, writes: Writes) -> RunStopped | None:
        if assumed.spent >= execution.run.task.max_usd:
            return _budget_reached(execution, call.step, assumed.spent, writes)
        call.attempt = writes.insert(Attempt(step=call.step, number=call.number, started_at=timezone.now()))
        return None

    stopped = write_once(execution, stage)
    if stopped is not None:
        raise stopped


BUDGET_NOTE = "cost budget"


def _budget_stop(execution: RunExecution, step: Step, spent: Decimal) -> RunStopped:
    message = f"cost budget of ${execution.run.task.max_usd} reached (spent ${spent}) before step {step.index} ({step.worker_slug})"
    return RunStopped(message, stop_reason=StopReason.COST_BUDGET)


def _budget_reached(execution: RunExecution, step: Step, spent: Decimal, writes: Writes) -> RunStopped:
    stop = _budget_stop(execution, step, spent)
    mark_failed(step, str(stop), writes, note=BUDGET_NOTE)
    return stop
