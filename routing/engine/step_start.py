"""A worker step starts: the checks first (its worker still registered and enabled, the policy rules
still letting it have the task's data, the cost budget not reached), then the step running with the
exact messages it is sent, its attempt started, and the event, in one write. Also the next attempt of
a call after its backoff.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from functools import partial
from typing import Any

from django.db.models import Count, Max, Q
from django.utils import timezone

from audit import policies
from audit.actions import Action

from ..hashing import content_hash
from ..models import Attempt, Step, StepStatus, StopReason
from ..models.transitions import Change as By
from .calls import Call, build_messages, dependencies
from .changes import Change, Event, inserted, moved
from .execution import Assumed, RunExecution, RunStopped
from .executor import apply
from .step_settle import step_failed
from .workers import workers_as_of


def begin_step(execution: RunExecution, step: Step, visible: list[Step]) -> Call:
    """Start a worker step and its first attempt, in one change (`step_started`). Raises RunStopped
    (the step failed) when a check says no."""
    if step.started_at is None:  # never started: no attempts yet
        call = Call(step=step, worker=step.worker, number=1, made=0)  # type: ignore[arg-type]  # checked in step_started
    else:  # resumed: attempts made so far (a lost one was never answered: it does not count)
        earlier = step.attempts.aggregate(
            made=Count("pk", filter=~Q(status=Attempt.Status.LOST)), last=Max("number")
        )
        call = Call(
            step=step,
            worker=step.worker,  # type: ignore[arg-type]  # checked in step_started
            number=(earlier["last"] or 0) + 1,
            made=earlier["made"],
            started_at=step.started_at,
        )
    change = apply(execution, partial(step_started, execution, call, visible, {}))
    if change.stops is not None:
        raise change.stops
    return change.result  # type: ignore[no-any-return]


def starts_with_the_last(step: Step) -> bool:
    """Whether a step can start in the change that records the step before it succeeded (a worker
    step never started, its worker enabled): the one transaction a step of a sequence costs."""
    return (
        not step.is_conductor and step.worker is not None and step.worker.enabled and step.started_at is None
    )


def first_call(step: Step) -> Call:
    """The call of a step that never started."""
    return Call(step=step, worker=step.worker, number=1, made=0)  # type: ignore[arg-type]  # starts_with_the_last


def begin_with_plan(execution: RunExecution, steps: list[Step], assumed: Assumed) -> Change | None:
    """The start of the plan's first steps (those that see no other), for the change that records
    the plan, when every one of them may start (`_refused` says nothing against it, on the run as the
    plan's change finds it); else None (the schedule starts each as usual, and records why one may
    not). Its result: their calls, by step index."""
    first = [step for step in steps if not dependencies(step)]
    if not first or not all(
        starts_with_the_last(s) and _refused(execution, s, assumed) is None for s in first
    ):
        return None
    started = [step_started(execution, first_call(step), [], {}, assumed) for step in first]
    change = started[0]
    for more in started[1:]:
        change = change + more
    return replace(change, result={call.step.index: call for call in (c.result for c in started)})


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


def step_started(
    execution: RunExecution,
    call: Call | None,
    visible: list[Step],
    answers: Mapping[int, str],
    assumed: Assumed,
    *,
    step: Step | None = None,
) -> Change:
    """A step starts: the checks first (a worker step's worker still registered and enabled, the
    policy rules still letting it have the task's data, the cost budget not reached: either may have
    changed since the plan was checked; the change is built on the stamps and totals the write finds),
    then the step running with the exact messages it is sent, its attempt started (`call`'s), and the
    event. A conductor step (`step`, no call) starts with no attempt: its nested plan is its work.
    `answers`: responses of visible steps not yet on their instances (recorded by the change this one
    is applied with). A check that says no makes it the step's failure, and the run stops
    (`Change.stops`). Its result: the call."""
    if call is None:  # a conductor step
        assert step is not None and step.is_conductor
        values: dict[str, Any] = {"started_at": step.started_at or timezone.now()}
        messages: list[dict[str, str]] = []
        inserts: tuple[Attempt, ...] = ()
        started = None
    else:
        step = call.step
        refused = _refused(execution, step, assumed)
        if refused is not None:
            stop, note = refused
            return replace(step_failed(step, str(stop), note=note), stops=stop)
        messages = build_messages(step, visible, answers)
        # A resumed step keeps its first start; a start built again is now again, not the first try's.
        values = {"started_at": call.started_at or timezone.now(), "messages_sent": messages}
        attempt = Attempt(step=step, number=call.number, started_at=timezone.now())
        inserted(attempt, By.STEP_STARTED)
        inserts = (attempt,)
        worker = workers_as_of(assumed.workers_stamp)[step.worker_slug]
        started = replace(call, worker=worker, attempt=attempt)  # type: ignore[arg-type]
    return Change(
        by=(By.STEP_STARTED,),
        updates=(moved(step, By.STEP_STARTED, status=StepStatus.RUNNING, **values),),
        inserts=inserts,
        events=(
            Event(Action.STEP_STARTED, step, started_payload(execution, step, visible, answers, messages)),
        ),
        result=started,
    )


def started_payload(
    execution: RunExecution,
    step: Step,
    visible: list[Step],
    answers: Mapping[int, str],
    messages: list[dict[str, str]],
) -> dict[str, Any]:
    """The payload of step.started."""
    return {
        "index": step.index,
        "depth": step.depth,
        "worker": step.worker_slug,
        "vendor": step.vendor,
        "model": step.worker.litellm_model if step.worker else None,
        "classification": execution.run.task.classification,
        "sees_steps": [s.pk for s in visible],
        "sees_step_hashes": {str(s.pk): content_hash(answers.get(s.index, s.response)) for s in visible},
        "messages_sha256": content_hash(messages) if messages else None,
    }


def begin_retry(execution: RunExecution, call: Call) -> Call:
    """The next attempt of a call, after its backoff: started unless the budget is reached."""
    change = apply(execution, partial(attempt_started, execution, call))
    if change.stops is not None:
        raise change.stops
    return change.result  # type: ignore[no-any-return]


def attempt_started(execution: RunExecution, call: Call, assumed: Assumed) -> Change:
    """A call's next attempt started; or, with the budget reached, the step failed (the run stops)."""
    if assumed.spent >= execution.run.task.max_usd:
        stop = _budget_stop(execution, call.step, assumed.spent)
        return replace(step_failed(call.step, str(stop), note=BUDGET_NOTE), stops=stop)
    attempt = Attempt(step=call.step, number=call.number, started_at=timezone.now())
    inserted(attempt, By.ATTEMPT_STARTED)
    return Change(by=(By.ATTEMPT_STARTED,), inserts=(attempt,), result=replace(call, attempt=attempt))


BUDGET_NOTE = "cost budget"


def _budget_stop(execution: RunExecution, step: Step, spent: Decimal) -> RunStopped:
    message = f"cost budget of ${execution.run.task.max_usd} reached (spent ${spent}) before step {step.index} ({step.worker_slug})"
    return RunStopped(message, stop_reason=StopReason.COST_BUDGET)
