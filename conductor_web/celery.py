"""The Celery app, the embedded servers started when a worker or beat starts, and the command lines the demo and tests use to start them."""

import logging
import os
import sys
from typing import Any

from celery import Celery, signals
from celery.worker.consumer import Consumer as CeleryConsumer
from django.conf import settings

from conductor_web.embedded import start_unless_set

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")

logger = logging.getLogger(__name__)


class Consumer(CeleryConsumer):
    """Celery's consumer, surviving a broker restart while it holds unacknowledged messages.

    Celery 5.7.0, on a lost connection, collects the connection (which detaches its transport) and
    then closes it; closing the default channel restores its unacknowledged messages through the
    detached transport and raises AttributeError ('NoneType' object has no attribute 'hostname'),
    which is not a connection error: the worker died ("Unrecoverable error") and the runs it held
    waited for a worker nobody restarted. Here that close's AttributeError is logged and the consumer
    reconnects as Celery means it to. The messages stay in the broker's unacked index, where the
    resume sweep finds their runs (routing.tasks.runs_held) and the visibility timeout restores them.
    """

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        if connection is not None:
            close = connection.close

            def guarded_close(*args: Any, **kwargs: Any) -> Any:
                try:
                    return close(*args, **kwargs)
                except AttributeError as error:
                    logger.warning("closing the lost broker connection: %r (reconnecting)", error)
                    return None

            connection.close = guarded_close  # this connection only; it is dropped after this call
        super().on_connection_error_after_connected(exc)


app = Celery("conductor_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.celeryd_init.connect
@signals.beat_init.connect
def _embedded_servers(**_kwargs) -> None:
    """`celery -A conductor_web worker` (or beat) is an entry point: with DATABASE_URL or REDIS_URL
    unset, the embedded servers start (or are found running) before the worker connects to either.
    Importing the app (every import of the package does) starts nothing."""
    start_unless_set()


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
