"""Celery tasks: thin, they take ids and call the engine or a service.

Delivery: a run's message is sent once (Run.enqueued_at records it) and sent again only when no
process can be executing the run and no message is on its way. Every message sent again goes to the
`resume` queue, which runs workers consume before `runs`, so it takes the next free slot instead of
waiting behind the backlog:
- its pool process died (killed, out of memory): the worker that ran it sends it again as soon as it
  calls the process lost (CELERY_WORKER_LOST_WAIT), and acknowledges the original;
- the database failed under it: the task retries itself with backoff;
- the whole worker died (a host, a container): nobody is left to send it, so the sweep does, as soon as
  the worker's presence lock is gone with its main process (routing.presence) and the run's own lock
  with its pool process, once its heartbeat is older than CONDUCTOR_HEARTBEAT_S;
- a run whose message a worker took and died with, before it claimed the run (a retry waiting for its
  countdown, a message just taken): the Redis transport keeps such a message unacknowledged until the
  visibility timeout (hours). The sweep reads kombu's index of unacknowledged messages and sends
  again a run of one taken longer ago than a live worker would need to claim it, unless the run is
  locked, ended, or was sent since;
- a `queued` run whose message never reached the broker (an outage at submission), or whose message
  is older than the broker's visibility timeout (lost): the sweep sends it to `runs`.
A run merely waiting in a long queue is never sent twice. A duplicate delivery is harmless anyway:
the run lock and the claim epoch make it a no-op.
"""

from __future__ import annotations

import base64
import json
import logging
import random
from datetime import UTC, datetime, timedelta

from celery import Task, shared_task
from django.conf import settings
from django.db import connection, connections
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import KombuError

from . import engine, presence
from .models import Run, RunStatus
from .retention import retention_purge as purge

log = logging.getLogger(__name__)

# Errors of a broker that cannot be reached (kombu wraps most; a socket error may come through).
BROKER_ERRORS = (KombuError, OSError)


def resume_queue() -> str:
    return settings.CONDUCTOR_QUEUE_PREFIX + "resume"


class RunTask(Task):
    """A run's task: whatever Celery sends again (a retry, a pool process lost) goes to `resume`."""

    def signature_from_request(self, request=None, args=None, kwargs=None, queue=None, **options):
        return super().signature_from_request(request, args, kwargs, queue=queue or resume_queue(), **options)

    def on_retry(self, exc, task_id, args, kwargs, einfo) -> None:
        """A message was sent again (a lost pool process, a database failure): recorded as run_send
        records its sends, so the sweep does not send the run a second time while it waits for a slot."""
        if args:
            Run.objects.filter(pk=args[0]).update(enqueued_at=timezone.now())


@shared_task(
    bind=True,
    base=RunTask,
    name="routing.tasks.run_workflow",
    acks_late=True,
    # A lost pool process: Celery sends the message again (to `resume`, at once) and acknowledges the
    # original; rejecting it instead would put it back at the end of the backlog.
    retry_on_worker_lost=True,
    default_retry_delay=0,
    reject_on_worker_lost=True,  # only if that send fails
    max_retries=None,
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


def orphan_grace() -> timedelta:
    """How long an unlocked running run is left to its own worker, which sends it again itself when
    only the pool process died: a heartbeat interval, the worker's lost wait and a second."""
    return timedelta(seconds=settings.CONDUCTOR_HEARTBEAT_S + settings.CELERY_WORKER_LOST_WAIT + 1)


def held_grace() -> timedelta:
    """How long a live worker may hold a run's message before it claims the run: the longest retry
    countdown, plus the orphan grace."""
    return timedelta(seconds=settings.CONDUCTOR_RETRY_BACKOFF_MAX_S) + orphan_grace()


def runs_held(older_than: timedelta) -> dict[int, datetime]:
    """Runs whose message a worker took from the broker longer ago than `older_than` and has not
    acknowledged: {run id: when it was taken}. Read from the Redis transport's index of unacknowledged
    messages; other brokers (RabbitMQ) deliver a dead consumer's messages again themselves."""
    held: dict[int, datetime] = {}
    with run_workflow.app.connection_for_read() as conn:
        channel = conn.default_channel
        index_key = getattr(channel, "unacked_index_key", None)
        if index_key is None:
            return held
        client = channel.client
        before = timezone.now() - older_than
        tags = client.zrangebyscore(index_key, "-inf", before.timestamp(), withscores=True)
        if not tags:
            return held
        for (_tag, taken), raw in zip(
            tags, client.hmget(channel.unacked_key, [t for t, _ in tags]), strict=True
        ):
            run_id = _run_of(raw)
            if run_id is not None:
                when = datetime.fromtimestamp(taken, tz=UTC)
                held[run_id] = max(when, held.get(run_id, when))
    return held


def _run_of(raw: bytes | None) -> int | None:
    """The run id of a run_workflow message as the Redis transport stores it, or None."""
    try:
        message = json.loads(raw)[0]
        if message["headers"]["task"] != run_workflow.name:
            return None
        args = json.loads(base64.b64decode(message["body"]))[0]
        return int(args[0])
    except (TypeError, ValueError, KeyError, IndexError):
        return None


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
    orphans = Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__lt=now - orphan_grace())
    orphans = orphans.filter(
        # Not yet sent since its last claim (the claim moves heartbeat_at past enqueued_at), or the
        # message sent is older than the broker keeps an unacknowledged one.
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=F("heartbeat_at")) | Q(enqueued_at__lt=lost_message)
    )
    waiting = Run.objects.filter(status=RunStatus.QUEUED, created_at__lt=never_sent).filter(
        Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=lost_message)
    )
    locked = runs_locked()
    sent = []
    # A run whose whole worker died (its main process's presence lock is gone with it): nobody is left
    # to send it again, so it goes now, without the orphan grace below (which leaves a run whose pool
    # process died to its living worker). A heartbeat this fresh means its process may still be writing.
    alive = presence.present()
    abandoned = Run.objects.filter(
        status=RunStatus.RUNNING,
        worker_ppid__isnull=False,
        heartbeat_at__lt=now - timedelta(seconds=settings.CONDUCTOR_HEARTBEAT_S),
    ).filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=F("heartbeat_at")))
    for run_id, previous, host, ppid in abandoned.values_list(
        "pk", "enqueued_at", "worker_host", "worker_ppid"
    )[:500]:
        if run_id in locked or presence.presence_key(host, ppid) in alive:
            continue
        if run_send(run_id, previous=previous, queue=resume_queue()):
            sent.append(run_id)
    fields = ("pk", "enqueued_at", "status")
    for run_id, previous, status in list(
        orphans.values_list(*fields).union(waiting.values_list(*fields))[:500]
    ):
        if run_id in locked or run_id in sent:
            continue
        queue = resume_queue() if status == RunStatus.RUNNING else None
        if run_send(run_id, previous=previous, queue=queue):
            sent.append(run_id)
    # Messages a dead worker took before it claimed their run (see the module).
    held = runs_held(held_grace())
    for run_id, previous, taken in Run.objects.filter(
        pk__in=list(held), status__in=[RunStatus.QUEUED, RunStatus.RUNNING]
    ).values_list("pk", "enqueued_at", "heartbeat_at"):
        if run_id in locked or run_id in sent:
            continue
        if previous is not None and previous >= held[run_id]:
            continue  # sent again since that message was taken
        if taken is not None and taken > held[run_id]:
            continue  # claimed after the message was taken: the orphan rule above owns it
        if run_send(run_id, previous=previous, queue=resume_queue()):
            sent.append(run_id)
    if sent:
        log.warning("sent stalled runs again %s", sent)
    return sent


@shared_task(name="routing.tasks.retention_purge")
def retention_purge() -> int:
    """Hourly: the content of tasks past their data class's retention, and their run chains."""

    return len(purge())
