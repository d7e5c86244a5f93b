"""A run stops: its failure, with every step left settled, its chain sealed (its seal pending)."""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.actions import Action

from ..models import Run, RunStatus, Step, StepStatus
from ..models.transitions import Change as By
from ..models.transitions import check_move
from .changes import Change, Event, Expect, RunEnd, moved
from .events import announce_end
from .execution import Assumed, RunExecution
from .executor import apply_plainly
from .step_settle import step_failed


def fail_run(execution: RunExecution, message: str, stop_reason: str) -> None:
    """The run failed: one transaction, which run_finished's receivers join."""
    now = timezone.now()
    with transaction.atomic():
        apply_plainly(execution, partial(run_failed, execution, message, stop_reason, now))
        announce_end(execution.run, now)


def run_failed(execution: RunExecution, message: str, stop_reason: str, now: Any, assumed: Assumed) -> Change:
    """The run failed: its steps settled with it, its row and its task's, its last event (which seals
    its chain)."""
    run = execution.run
    check_move(Run, run.status, RunStatus.FAILED, By.RUN_FAILED)
    ended: dict[str, Any] = {}
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
        ended = {"status": RunStatus.FAILED, "error": message, "finished_at": now}
        check_move(type(run.task), run.task.status, RunStatus.FAILED, By.RUN_FAILED)
    settled = settled_with_run(
        execution, assumed, now, reason=f"the run stopped ({stop_reason}): {message}", by=By.RUN_FAILED
    )
    return settled + Change(
        by=(By.RUN_FAILED,),
        events=(Event(Action.RUN_FAILED, run, {"error": message, "stop_reason": stop_reason}),),
        run={
            "status": RunStatus.FAILED,
            "error": message,
            "stop_reason": stop_reason,
            "finished_at": now,
            "heartbeat_at": now,
        },
        expect=Expect(settled=True),
        ends=RunEnd(task=ended, now=now),
    )


def settled_with_run(
    execution: RunExecution, assumed: Assumed, now: Any, *, reason: str, by: By, but: int | None = None
) -> Change:
    """Every step of an ending run, nested levels included, in a terminal state with the reason (but
    `but`, the one the run's end settles itself): a step that never started is skipped; one left
    running (an unexpected error stopped the run mid-step) failed; each with its event. Read only
    under the run's lock (a compiled end expects none: `Expect.settled`)."""
    if not assumed.locked:
        return Change(by=(by,))
    unsettled = (
        Step.objects.filter(run=execution.run, status__in=[StepStatus.PENDING, StepStatus.RUNNING])
        .exclude(pk=but or 0)
        .order_by("depth", "decision_id", "index")
    )
    change = Change(by=(by,))
    for step in unsettled:
        if step.status == StepStatus.PENDING:
            change = change + step_skipped(step, f"not run: {reason}", by=by, now=now)
        else:
            change = change + step_failed(step, f"interrupted: {reason}", by=by, now=now)
    return change


def step_skipped(step: Step, note: str, *, by: By, now: Any) -> Change:
    """A step its run's end settled before it started."""
    return Change(
        by=(by,),
        updates=(moved(step, by, status=StepStatus.SKIPPED, note=note, finished_at=now),),
        events=(Event(Action.STEP_SKIPPED, step, skipped_payload(step, note)),),
    )


def skipped_payload(step: Step, note: str) -> dict[str, Any]:
    """The payload of step.skipped."""
    return {
        "index": step.index,
        "depth": step.depth,
        "worker": step.worker_slug,
        "note": note,
        "settled_with_run": True,
    }
