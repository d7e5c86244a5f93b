"""The Celery app, the embedded servers started when a worker or beat starts, and the command lines the demo and tests use to start them."""

import os
import sys
from typing import Any

import redis
from celery import Celery, signals
from django.conf import settings
from django.db import close_old_connections
from kombu.transport import redis as kombu_redis

from conductor_web.embedded import start_unless_set

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")


def _guard_detached_channels() -> None:
    """Celery 5.7.0 with kombu 5.7.0 lets a worker die when the Redis broker restarts.

    On a lost connection the consumer collects the connection, which detaches its transport, and
    then closes it; a message of the old channel may also still be acknowledged or rejected after it.
    Either way the old channel asks its detached transport for connection parameters and raises
    AttributeError ('NoneType' object has no attribute 'hostname'), which is not a connection
    error: the worker died ("Unrecoverable error") and the runs it held waited for a worker nobody
    restarted. Here that request raises the broker's ConnectionError instead, which Celery and kombu
    handle (log, reconnect). The old channel's unacknowledged messages stay in the broker's unacked
    index, where the resume sweep finds their runs (routing.tasks.runs_held).
    """
    original = kombu_redis.Channel._connparams
    if getattr(original, "guarded", False):
        return

    def connparams(self: Any, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("this broker channel's connection was closed")
        return original(self, asynchronous=asynchronous)

    connparams.guarded = True  # type: ignore[attr-defined]
    kombu_redis.Channel._connparams = connparams


_guard_detached_channels()

app = Celery("conductor_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.celeryd_init.connect
@signals.beat_init.connect
def _embedded_servers(**_kwargs) -> None:
    """`celery -A conductor_web worker` (or beat) is an entry point: with DATABASE_URL or REDIS_URL
    unset, the embedded servers start (or are found running) before the worker connects to either.
    Importing the app (every import of the package does) starts nothing. A broker that would lose
    its queues at a restart is refused here (broker_persistence_problem)."""
    start_unless_set()
    problem = broker_persistence_problem(settings.CELERY_BROKER_URL)
    if problem and not settings.CONDUCTOR_ALLOW_VOLATILE_BROKER:
        raise SystemExit(f"conductor: refusing to start: {problem}")


def broker_persistence_problem(url: str) -> str | None:
    """Why a Redis broker would lose the runs queued in it at a restart, or None.

    A Redis with neither an append-only file nor snapshots keeps its queues in memory only; after a
    restart their runs would wait for the broker's visibility timeout (hours) before the resume sweep
    sent them again. Other brokers, and a Redis that will not say (CONFIG refused), pass."""
    if not url.startswith(("redis://", "rediss://", "redis+socket://", "unix://")):
        return None
    client = redis.Redis.from_url(url.replace("redis+socket://", "unix://", 1), socket_timeout=5)
    try:
        appendonly = client.config_get("appendonly").get("appendonly", "")
        snapshots = client.config_get("save").get("save", "")
    except redis.ResponseError:
        return None
    finally:
        client.close()
    if appendonly == "yes" or snapshots.strip():
        return None
    where = client.connection_pool.connection_kwargs.get(
        "path"
    ) or client.connection_pool.connection_kwargs.get("host")
    return (
        f"the Redis broker at {where} keeps its queues in memory only (appendonly no, no snapshots): runs"
        f" queued at its restart would wait {settings.CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout']} s"
        " before they are sent again. Turn on its append-only file (appendonly yes), or set"
        " CONDUCTOR_ALLOW_VOLATILE_BROKER=1 to accept that"
    )


@signals.worker_ready.connect
def _announce_presence(**_kwargs) -> None:
    """The worker's main process holds its presence lock while it lives: a run whose pool process
    died is sent again by this process; one whose whole worker died, by the sweep at once."""
    # load order: this module loads before Django's apps (conductor_web/__init__ imports it)
    from routing import presence

    presence.announce()


@signals.task_prerun.connect
@signals.task_postrun.connect
def _connections_kept_as_django_keeps_them(task: Any = None, **_kwargs: Any) -> None:
    """Around each task, as around each request: a connection older than CONN_MAX_AGE, or one that
    failed, is closed (the next query opens a new one, health-checked first); any other is kept, with
    the statements it has prepared (settings.CELERY_DB_REUSE_MAX). Not around a task run eagerly, in
    its caller's process (and perhaps its transaction), as Celery's own fixup does not."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    close_old_connections()


@signals.worker_process_shutdown.connect
def _send_what_is_queued(**_kwargs) -> None:
    """A pool process that is about to exit sends the live events and the run traces it has queued."""
    # load order: this module loads before Django's apps
    from observability import telemetry
    from routing import live_events  # load order: as above

    live_events.flush(5.0)
    telemetry.shutdown()


def worker_command(
    *,
    concurrency: int,
    loglevel: str = "INFO",
    hostname: str = "",
    quiet: bool = False,
    queues: tuple[str, ...] = ("runs",),
) -> list[str]:
    """The command line of a `celery worker` for this app on this interpreter (demo, tests, benchmarks).

    queues: "runs" (workflow runs), "training" (training jobs), "maintenance" (the resume sweep,
    checkpoints, retention), prefixed as configured. A runs worker also consumes "resume" and
    "maintenance", ahead of "runs": kombu takes the queues in turn, so neither waits behind a backlog.
    quiet: no gossip, mingle or heartbeat between workers, for short-lived local workers.
    """

    command = [sys.executable, "-m", "celery", "-A", "conductor_web", "worker", "--loglevel", loglevel]
    command += ["--concurrency", str(concurrency), "--pool", "prefork"]
    if "runs" in queues:  # runs sent again after their process died go ahead of the backlog
        queues = tuple(dict.fromkeys(("resume", "maintenance", *queues)))
    command += ["--queues", ",".join(settings.CONDUCTOR_QUEUE_PREFIX + q for q in queues)]
    if hostname:
        command += ["--hostname", hostname]
    if quiet:
        command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return command


def beat_command(*, schedule: str, loglevel: str = "INFO") -> list[str]:
    """The command line of `celery beat` for this app on this interpreter (demo, benchmarks)."""

    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "conductor_web",
        "beat",
        "--loglevel",
        loglevel,
        "--schedule",
        schedule,
    ]
