"""Recursion: a conductor step plans again one level deeper, or passes an earlier answer through."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from audit.actions import Action

from ..hashing import content_hash
from ..models import CONDUCTOR_SLUG, Step, StepStatus
from .calls import last_response_before
from .execution import RunExecution, RunStopped
from .fence import record_event
from .planning import ensure_plan
from .schedule import execute_plan
from .step_settle import step_failed

log = logging.getLogger(__name__)


def execute_conductor_step(execution: RunExecution, step: Step) -> None:
    """The conductor as a worker: plan a nested workflow, run it, and answer with its final response.

    An empty nested plan passes the last response through. Past the depth cap the engine passes it
    through without asking (a plan can only name the conductor while depth < max_depth, so this
    guards against resumed runs whose budgets changed).
    """
    run = execution.run
    child_depth = step.depth + 1
    if child_depth > run.task.max_depth:
        _step_passed_through(
            execution, step, note=f"depth cap of {run.task.max_depth} reached: passed through"
        )
        return
    try:
        child = ensure_plan(execution, parent_step=step, depth=child_depth)
    except RunStopped as stop:
        if stop.stop_reason == "step_budget":
            _step_passed_through(execution, step, note="step budget reached: passed through")
            return
        step_failed(execution, step, str(stop))
        raise
    if not child.decision.plan or not child.decision.plan["steps"]:
        _step_passed_through(execution, step, note="the conductor passed the last response through")
        return
    try:
        last = execute_plan(execution, child)
    except RunStopped as stop:
        step_failed(execution, step, str(stop))
        raise
    _step_answered(
        execution,
        step,
        response=last.response,
        note=f"answered by nested plan (decision {child.decision.pk})",
    )


def _step_passed_through(execution: RunExecution, step: Step, *, note: str) -> None:
    _step_answered(execution, step, response=last_response_before(step), note=note)


def _step_answered(execution: RunExecution, step: Step, *, response: str, note: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        Step.objects.filter(pk=step.pk).update(
            status=StepStatus.SUCCEEDED,
            response=response,
            note=note,
            finished_at=now,
            latency_ms=int((now - step.started_at).total_seconds() * 1000) if step.started_at else None,
        )
        record_event(
            execution,
            Action.STEP_SUCCEEDED,
            step,
            {
                "index": step.index,
                "worker": CONDUCTOR_SLUG,
                "note": note,
                "response_sha256": content_hash(response),
            },
        )
