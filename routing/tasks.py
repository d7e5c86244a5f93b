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
  visibility timeout (hours). The sweep sends again a run of one taken longer ago than a live worker
  would need to claim it;
- a `queued` run whose message is nowhere: it never reached the broker (an outage at submission, a
  process killed between its commit and its send), or it was taken and lost (a task that failed before
  its claim, acknowledged on its way out). The sweep sends it once its last send is older than
  CONDUCTOR_SEND_GRACE_S: to `runs` if it was never sent, to `resume` if it was.
Each rule asks the broker where the run's messages are (routing.broker), not whether a send was
recorded: a send recorded after its message was already taken (a retry's on_retry, written once the
database was back) once left a run queued for the visibility timeout.
A run merely waiting in a long queue is never sent twice. A duplicate delivery is harmless anyway:
the run lock and the claim epoch make it a no-op.
"""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta

from celery import Task, shared_task
from django.conf import settings
from django.db import DatabaseError, connection, connections
from django.db.models import Q
from django.utils import timezone
from kombu.exceptions import KombuError

from . import engine, presence
from .broker import Sent, run_messages
from .models import Run, RunStatus

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
        records its sends (a broker the sweep cannot read relies on it). The database may be the
        failure itself: the message is sent whatever this write does, so a failed write is only logged."""
        if not args:
            return
        try:
            Run.objects.filter(pk=args[0]).update(enqueued_at=timezone.now())
        except DatabaseError as error:
            connections.close_all()
            log.warning("run %s: its retry was sent, its send not recorded (%s)", args[0], error)


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


def run_queues() -> list[str]:
    """The queues a run's message is sent to: `runs` first, `resume` when sent again."""
    return [settings.CELERY_TASK_DEFAULT_QUEUE, resume_queue()]


def runs_held(older_than: timedelta) -> dict[int, datetime]:
    """Runs whose message a worker took from the broker longer ago than `older_than` and has not
    acknowledged: {run id: when it was taken} (Redis only; see routing.broker)."""
    return run_messages(run_workflow.app, run_queues()).held(before=timezone.now() - older_than)


def runs_locked() -> set[int]:
    """The runs whose lock some process holds, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objsubid = 2 AND granted",
            [engine.ADVISORY_LOCK_NAMESPACE],
        )
        return {int(row[0]) for row in cursor.fetchall()}


SENT_FIELDS = ("pk", "enqueued_at", "heartbeat_at")
# Candidates read per rule and sweep: a sweep every few seconds catches up with a larger number.
SWEEP_BATCH = 500


@shared_task(name="routing.tasks.requeue_stalled_runs")
def requeue_stalled_runs() -> list[int]:
    """Send again the runs no process is executing and no message will reach (see the module): each
    candidate is checked against where its messages are in the broker, not against a recorded send."""
    now = timezone.now()
    hold = held_grace()
    locked = runs_locked()
    # Read after the locks: a message taken from now on is claimed by a process that then holds the
    # lock, or is taken too recently to count as held by a dead worker.
    messages = run_messages(run_workflow.app, run_queues())
    sent: list[int] = []

    def send(run: Sent, queue: str | None, *, since: datetime, waiting_in: str | None = None) -> None:
        """Send `run` to `queue` unless it is locked, was sent by this sweep, or has a message that
        will reach a worker: one taken after `since` (later than a dead worker could have), or one
        waiting in `waiting_in` (any queue when None)."""
        if run.run_id in locked or run.run_id in sent:
            return
        if messages.pending(run, since=since, queue=waiting_in):
            return
        if run_send(run.run_id, previous=run.enqueued_at, queue=queue):
            sent.append(run.run_id)

    # A run whose whole worker died (its main process's presence lock is gone with it): nobody is left
    # to send it again, so it goes now, without the orphan grace below (which leaves a run whose pool
    # process died to its living worker). A heartbeat this fresh means its process may still be writing.
    # The dead worker took its message before the run's last heartbeat; one taken since is a new one.
    alive = presence.present()
    abandoned = Run.objects.filter(
        status=RunStatus.RUNNING,
        worker_ppid__isnull=False,
        heartbeat_at__lt=now - timedelta(seconds=settings.CONDUCTOR_HEARTBEAT_S),
    )
    for *fields, host, ppid in abandoned.values_list(*SENT_FIELDS, "worker_host", "worker_ppid")[
        :SWEEP_BATCH
    ]:
        if presence.presence_key(host, ppid) not in alive:
            run = Sent(*fields)
            send(run, resume_queue(), since=run.heartbeat_at, waiting_in=resume_queue())
    # A running run nobody has heartbeaten for the orphan grace: its worker did not send it again.
    # A running run counts only its messages on `resume`: one left on `runs` is stale (its first
    # message was taken to claim it; a broker restarted from its append-only file, which keeps the
    # last second of writes at risk, can bring a taken one back) and waits behind the backlog.
    orphans = Run.objects.filter(status=RunStatus.RUNNING, heartbeat_at__lt=now - orphan_grace())
    for fields in orphans.values_list(*SENT_FIELDS)[:SWEEP_BATCH]:
        run = Sent(*fields)
        send(run, resume_queue(), since=max(run.heartbeat_at, now - hold), waiting_in=resume_queue())
    # A queued run last sent longer ago than a send takes (or never: the broker was down), or whose
    # message a worker took longer ago than a live worker needs to claim it. One sent before goes to
    # `resume`: it already waited its turn once.
    grace = now - timedelta(seconds=settings.CONDUCTOR_SEND_GRACE_S)
    held = messages.held(before=now - hold)
    waiting = Run.objects.filter(status=RunStatus.QUEUED).filter(
        Q(enqueued_at__isnull=True, created_at__lt=grace) | Q(enqueued_at__lt=grace) | Q(pk__in=list(held))
    )
    for fields in waiting.order_by("pk").values_list(*SENT_FIELDS)[:SWEEP_BATCH]:
        run = Sent(*fields)
        send(run, resume_queue() if run.enqueued_at else None, since=now - hold)
    if sent:
        log.warning("sent stalled runs again %s", sent)
    return sent
