"""A run stops: its failure, with every step left settled, its chain sealed into the global chain."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import rows
from audit.actions import Action
from audit.services import run_chain_seal

from .. import rollups
from ..models import Run, RunStatus, Step, StepStatus
from .events import announce_end
from .execution import RunExecution
from .fence import record_event
from .task_totals import task_ended


def fail_run(execution: RunExecution, message: str, stop_reason: str) -> None:
    """The run failed: one transaction, which run_finished's receivers join."""
    run = execution.run
    now = timezone.now()
    with transaction.atomic():
        settle_steps(execution, now, reason=f"the run stopped ({stop_reason}): {message}")
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.FAILED, error=message, stop_reason=stop_reason, finished_at=now, heartbeat_at=now
        )
        ended: dict[str, object] = {}
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            ended = {"status": RunStatus.FAILED, "error": message, "finished_at": now}
        task_ended(run.task_id, ended)
        last_event = record_event(
            execution,
            Action.RUN_FAILED,
            run,
            {"error": message, "stop_reason": stop_reason},
            seal=True,
        )
        run_chain_seal(run=run, task_id=run.task_id, last=last_event)
        rollups.run_waits(run.pk)
        announce_end(run, now)


def settle_steps(execution: RunExecution, now: Any, *, reason: str) -> None:
    """Every step of an ending run, nested levels included, ends in a terminal state with the reason.

    Call inside the transaction that ends the run, before its chain is sealed. A step that never
    started is skipped; one left running (an unexpected error stopped the run mid-step) failed. Each
    change is an engine event, like any other change of a step's state.
    """
    run = execution.run
    with rows.prepared_cursor() as cursor:  # mostly none: a prepared look before the ORM's query
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM routing_step WHERE run_id = %(run_id)s "
            "AND status IN (%(pending)s, %(running)s))",
            {"run_id": run.pk, "pending": StepStatus.PENDING, "running": StepStatus.RUNNING},
        )
        if not cursor.fetchone()[0]:
            return
    unsettled = list(
        Step.objects.select_for_update(of=("self",))
        .filter(run=run, status__in=[StepStatus.PENDING, StepStatus.RUNNING])
        .order_by("depth", "decision_id", "index")
    )
    for step in unsettled:
        if step.status == StepStatus.PENDING:
            step.status = StepStatus.SKIPPED
            step.note = f"not run: {reason}"
            action = Action.STEP_SKIPPED
        else:
            step.status = StepStatus.FAILED
            step.error = f"interrupted: {reason}"
            action = Action.STEP_FAILED
        step.finished_at = now
        step.save(update_fields=["status", "note", "error", "finished_at"])
        record_event(
            execution,
            action,
            step,
            {
                "index": step.index,
                "depth": step.depth,
                "worker": step.worker_slug,
                "error": step.error if action == Action.STEP_FAILED else "",
                "note": step.note if action == Action.STEP_SKIPPED else "",
                "settled_with_run": True,
            },
        )
