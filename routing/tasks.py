"""Celery tasks: thin, they take ids and call the engine or a service."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from . import engine
from .models import Run, RunStatus

log = logging.getLogger(__name__)


@shared_task(name="routing.tasks.run_workflow", acks_late=True, reject_on_worker_lost=True)
def run_workflow(run_id: int) -> None:
    engine.execute_run(run_id)


@shared_task(name="routing.tasks.requeue_stalled_runs")
def requeue_stalled_runs() -> list[int]:
    """Queue again the runs no process is executing: a lost message, or a whole worker host that died.

    A run is stalled when it has not moved for CONDUCTOR_STALLED_AFTER_S and nobody holds its lock.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.CONDUCTOR_STALLED_AFTER_S)
    candidates = Run.objects.filter(
        status__in=[RunStatus.QUEUED, RunStatus.RUNNING],
        created_at__lt=cutoff,
    ).exclude(heartbeat_at__gte=cutoff)
    requeued = []
    for run_id in candidates.values_list("pk", flat=True)[:500]:
        if not engine.run_is_locked(run_id):
            # Touch the heartbeat so that a run waiting in a long backlog is not queued again every minute.
            Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now())
            run_workflow.delay(run_id)
            requeued.append(run_id)
    if requeued:
        log.warning("requeued stalled runs %s", requeued)
    return requeued
