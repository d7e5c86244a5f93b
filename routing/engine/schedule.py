"""The DAG of a plan: steps run as soon as the steps they see have succeeded, independent ones
concurrently (up to CONDUCTOR_STEP_CONCURRENCY), in this thread when one is ready.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from audit.actions import Action

from ..hashing import content_hash
from ..models import (
    Decision,
    Run,
    Step,
    StepStatus,
    StopReason,
)
from .calls import build_messages, call_worker, dependencies, visible_steps
from .record import RunStopped, record_event
from .recursion import execute_conductor_step

log = logging.getLogger(__name__)


def execute_plan(run: Run, decision: Decision) -> None:
    """Run the plan's steps; independent steps run concurrently. Raises RunStopped on failure."""
    steps = {s.index: s for s in decision.steps.all()}
    done = {i for i, s in steps.items() if s.status == StepStatus.SUCCEEDED}
    in_flight: dict[Future[None], int] = {}
    with ThreadPoolExecutor(
        max_workers=settings.CONDUCTOR_STEP_CONCURRENCY, thread_name_prefix=f"run{run.pk}"
    ) as pool:
        first_error: RunStopped | None = None
        while True:
            if first_error is None:
                ready = [
                    index
                    for index, step in sorted(steps.items())
                    if index not in done
                    and index not in in_flight.values()
                    and all(dep in done for dep in dependencies(step))
                ]
                if len(ready) == 1 and not in_flight:
                    # One step and nothing else running: here, on this thread's connection, not on a
                    # new thread with a new connection.
                    try:
                        execute_step(run, steps[ready[0]].pk)
                        done.add(ready[0])
                    except RunStopped as stop:
                        first_error = stop
                    continue
                for index in ready:
                    # The step's thread logs with the run's ids (routing.log_context): a copy of this context.
                    context = contextvars.copy_context()
                    in_flight[pool.submit(context.run, _in_thread, execute_step, run, steps[index].pk)] = (
                        index
                    )
            if not in_flight:
                break
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in finished:
                index = in_flight.pop(future)
                try:
                    future.result()
                    done.add(index)
                except RunStopped as stop:
                    first_error = first_error or stop
        if first_error is not None:
            raise first_error
    if len(done) != len(steps):  # pragma: no cover - the schedule above always reaches every step
        raise RunStopped("some steps could not be scheduled", stop_reason=StopReason.INTERNAL)


def _in_thread(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    finally:
        connections.close_all()  # each thread has its own connection; do not leak them


def start_step(run: Run, step_id: int) -> Step | None:
    with transaction.atomic():
        step = (
            Step.objects.select_for_update(of=("self",)).select_related("worker", "decision").get(pk=step_id)
        )
        if step.status == StepStatus.SUCCEEDED:
            return None
        visible = visible_steps(step)
        step.status = StepStatus.RUNNING
        step.started_at = step.started_at or timezone.now()
        if not step.is_conductor:
            step.messages_sent = build_messages(step, visible)
        step.save(update_fields=["status", "started_at", "messages_sent"])
        record_event(  # its fence beats the run's heartbeat
            run,
            Action.STEP_STARTED,
            step,
            {
                "index": step.index,
                "depth": step.depth,
                "worker": step.worker_slug,
                "vendor": step.vendor,
                "model": step.worker.litellm_model if step.worker else None,
                "classification": run.task.classification,
                "sees_steps": [s.pk for s in visible],
                "sees_step_hashes": {str(s.pk): content_hash(s.response) for s in visible},
                "messages_sha256": content_hash(step.messages_sent) if step.messages_sent else None,
            },
        )
    return step


def execute_step(run: Run, step_id: int) -> None:
    step = start_step(run, step_id)
    if step is None:
        return
    if step.is_conductor:
        execute_conductor_step(run, step)
    else:
        call_worker(run, step)
