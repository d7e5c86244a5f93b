"""Recursion: a conductor step plans again one level deeper, or passes an earlier answer through."""

from __future__ import annotations

import logging

from django.utils import timezone

from ..models import Step
from .calls import last_response_before
from .execution import RunExecution, RunStopped
from .executor import apply
from .planning import ensure_plan
from .schedule import schedule_steps
from .step_settle import step_failed, step_succeeded

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
        _failed(execution, step, str(stop))
        raise
    if not child.decision.plan or not child.decision.plan["steps"]:
        _step_passed_through(execution, step, note="the conductor passed the last response through")
        return
    try:
        last = schedule_steps(execution, child).step
    except RunStopped as stop:
        _failed(execution, step, str(stop))
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
    apply(execution, lambda assumed: step_succeeded(step, response=response, now=timezone.now(), note=note))


def _failed(execution: RunExecution, step: Step, message: str) -> None:
    apply(execution, lambda assumed: step_failed(step, message))
