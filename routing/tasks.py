"""Celery tasks: thin, they take ids and call the engine or a service.

Delivery: a run's message is sent once (Run.enqueued_at records it) and sent again only when no
process can be executing the run and no message is on its way:
- a `running` run whose lock nobody holds: its process died (a killed child, a whole worker host).
  It is sent at once to the `resume` queue, which every runs worker also consumes, so it does not
  wait behind the backlog;
- a `queued` run whose message never reached the broker (an outage at submission), or whose message
  is older than the broker's visibility timeout (lost).
A run merely waiting in a long queue is never sent twice. A duplicate delivery is harmless anyway:
the run lock and the claim epoch make it a no-op.
"""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import connection, connections
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import KombuError

from . import engine
from .models import Run, RunStatus

log = logging.getLogger(__name__)

# Errors of a broker that cannot be reached (kombu wraps most; a socket error may come through).
BROKER_ERRORS = (KombuError, OSError)


def resume_queue() -> str:
    return settings.CONDUCTOR_QUEUE_PREFIX + "resume"


@shared_task(
    bind=True, name="routing.tasks.run_workflow", acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def run_workflow(self, run_id: int) -> None:
    try:
        engine.execute_run(run_id)
    except engine.InfrastructureError as exc:
        # The database failed under the run (a restart, a dropped connection): nothing was lost. The
        # message is sent again with backoff rather than dropped; the run resumes where it was.
        connections.close_all()
        countdown = min(settings.CONDUCTOR_RETRY_BACKOFF_MAX_S, 2.0 ** min(self.request.retries, 6))
        log.warning("run %s: %s; retrying in %.1fs", run_id, exc, countdown)
        raise self.retry(exc=exc, countdown=countdown * (0.5 + random.random() / 2)) from exc


def run_send(run_id: int, *, previous: datetime | None, queue: str | None = None) -> bool:
    """Send a run's message unless someone else sent one since `previous` (compare-and-set on
    enqueued_at). False when another sender won or the broker cannot be reached (left for the sweep)."""
    now = timezone.now()
    claimed = Run.objects.filter(pk=run_id)
    claimed = claimed.filter(enqueued_at=previous) if previous else claimed.filter(enqueued_at__isnull=True)
    if not claimed.update(enqueued_at=now):
        return False
    try:
        run_workflow.apply_async((run_id,), queue=queue)
    except BROKER_ERRORS as exc:
        Run.objects.filter(pk=run_id, enqueued_at=now).update(enqueued_at=previous)
        log.warning("run %s: the broker cannot be reached (%s); the sweep will send it", run_id, exc)
        return False
    return True


def runs_locked() -> set[int]:
    """The runs whose lock some process holds, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2 AND granted",
            [engine.ADVISORY_LOCK_NAMESPACE],
        )
        return {int(row[0]) for row in cursor.fetchall()}


@shared_task(name="routing.tasks.requeue_stalled_runs")
def requeue_stalled_runs() -> list[int]:
    """Send again the runs no process is executing and no message will reach (see the module)."""
    now = timezone.now()
    never_sent = now - timedelta(seconds=settings.CONDUCTOR_SEND_GRACE_S)
    lost_message = now - timedelta(seconds=settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"])
    orphans = Run.objects.filter(status=RunStatus.RUNNING).filter(
        # Not yet sent since its last claim (the claim moves heartbeat_at past enqueued_at), or the
        # message sent is older than the broker keeps an unacknowledged one.
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=F("heartbeat_at")) | Q(enqueued_at__lt=lost_message)
    )
    waiting = Run.objects.filter(status=RunStatus.QUEUED, created_at__lt=never_sent).filter(
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=lost_message)
    )
    locked = runs_locked()
    sent = []
    fields = ("pk", "enqueued_at", "status")
    for run_id, previous, status in list(
        orphans.values_list(*fields).union(waiting.values_list(*fields))[:500]
    ):
        if run_id in locked:
            continue
        queue = resume_queue() if status == RunStatus.RUNNING else None
        if run_send(run_id, previous=previous, queue=queue):
            sent.append(run_id)
    if sent:
        log.warning("sent stalled runs again %s", sent)
    return sent
