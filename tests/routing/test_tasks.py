"""The delivery sweep (requeue_stalled_runs) and sending a run, against the real PostgreSQL (advisory
locks) and the real Redis broker: a run is sent again once when no process executes it and no message
will reach it, never while it waits in the queue."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
import yaml
from django.conf import settings
from django.utils import timezone

from routing.engine import run_lock
from routing.models import Run, RunStatus, Task
from routing.services import TaskSubmission, conductor_active, task_submit
from routing.tasks import orphan_grace, requeue_stalled_runs, resume_queue, run_send, run_workflow
from tests.conftest import clear_queues, queued_run_ids

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    clear_queues()
    yield client
    clear_queues()
    client.close()


def resumed(client: redis.Redis) -> list[int]:
    return queued_run_ids(client, resume_queue())


def make_run(
    client: redis.Redis,
    *,
    status: str,
    age_s: float = 600,
    heartbeat_age_s: float | None = None,
    sent_age_s=0.0,
) -> Run:
    """A submitted run, then aged: created age_s ago, last heartbeat heartbeat_age_s ago, its message
    sent sent_age_s ago (None: never sent)."""
    conductor_active()
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    run = task.runs.get()
    # Submitting sent it (on commit) and recorded when; start every test from an empty queue.
    assert run.pk in queued_run_ids(client)
    assert Run.objects.get(pk=run.pk).enqueued_at is not None
    clear_queues()
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=status,
        created_at=now - timedelta(seconds=age_s),
        heartbeat_at=None if heartbeat_age_s is None else now - timedelta(seconds=heartbeat_age_s),
        enqueued_at=None
        if sent_age_s is None
        else now - timedelta(seconds=sent_age_s + (age_s if status == RunStatus.QUEUED else 0)),
    )
    return run


def test_a_running_run_whose_process_died_is_sent_once_to_the_resume_queue(broker):
    grace = orphan_grace().total_seconds()
    # Its worker claimed it (heartbeat after the message was sent), then died: nobody holds its lock.
    # Within the grace it is left to its own worker, which sends it again itself if only its pool
    # process died.
    run = make_run(broker, status=RunStatus.RUNNING, heartbeat_age_s=grace - 1, sent_age_s=60)
    assert requeue_stalled_runs() == []
    assert resumed(broker) == []

    # Past the grace the whole worker is taken for dead: the sweep sends it.
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=grace + 1))
    assert requeue_stalled_runs() == [run.pk]
    assert resumed(broker) == [run.pk] and queued_run_ids(broker) == []
    # The message waits in the queue: the next sweeps send nothing more.
    assert requeue_stalled_runs() == []
    assert requeue_stalled_runs() == []
    assert resumed(broker) == [run.pk]

    # Claimed again (its message taken), and its process died again: sent again, once.
    clear_queues()
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        enqueued_at=now - timedelta(seconds=grace + 10), heartbeat_at=now - timedelta(seconds=grace + 1)
    )
    assert requeue_stalled_runs() == [run.pk]
    assert requeue_stalled_runs() == []


def test_a_running_run_whose_stale_message_is_back_on_the_runs_queue_is_sent_ahead_of_the_backlog(broker):
    # A broker restarted from its append-only file (the last second of writes at risk) can bring
    # back a message a worker had taken. Behind a backlog on `runs`, it once kept a run whose worker
    # died waiting 108 s: for a running run only a message on `resume` counts as on its way.
    grace = orphan_grace().total_seconds()
    run = make_run(broker, status=RunStatus.RUNNING, heartbeat_age_s=grace + 1, sent_age_s=60)
    run_workflow.apply_async((run.pk,))  # the stale copy, on `runs`

    assert requeue_stalled_runs() == [run.pk]
    assert resumed(broker) == [run.pk]
    assert requeue_stalled_runs() == []


def test_housekeeping_has_a_queue_of_its_own_that_runs_workers_take_first():
    from conductor_web.celery import app, worker_command

    prefix = settings.CONDUCTOR_QUEUE_PREFIX
    for name in (
        "routing.tasks.requeue_stalled_runs",
        "audit.tasks.checkpoint_create",
        "governance.tasks.retention_purge",
    ):
        assert app.amqp.router.route({}, name)["queue"].name == prefix + "maintenance", name
    assert app.amqp.router.route({}, "routing.tasks.run_workflow")["queue"].name == prefix + "runs"
    command = worker_command(concurrency=1)
    queues = command[command.index("--queues") + 1].split(",")
    assert queues == [prefix + "resume", prefix + "maintenance", prefix + "runs"]
    # The compose file's workers consume the same queues (no prefix there).
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
    consumed = {
        name: service["command"][service["command"].index("--queues") + 1]
        for name, service in compose["services"].items()
        if "worker" in service.get("command", []) and "--queues" in service["command"]
    }
    assert sorted(consumed.values()) == ["maintenance,training", "resume,maintenance,runs"], consumed


def test_a_running_run_whose_lock_is_held_is_left_alone(broker):
    locked = make_run(broker, status=RunStatus.RUNNING, heartbeat_age_s=600, sent_age_s=700)
    with run_lock(locked.pk) as lock_conn:
        assert lock_conn is not None
        assert requeue_stalled_runs() == []
    assert requeue_stalled_runs() == [locked.pk]


def test_a_queued_run_waiting_in_a_long_queue_is_never_sent_twice(broker):
    waiting = make_run(broker, status=RunStatus.QUEUED, age_s=3600, sent_age_s=0)
    run_workflow.apply_async((waiting.pk,))  # its message, still in the queue an hour later

    assert requeue_stalled_runs() == []
    assert queued_run_ids(broker) == [waiting.pk] and resumed(broker) == []


def test_a_queued_run_whose_message_was_taken_and_lost_is_sent_again_after_the_grace(broker):
    # Sent a minute ago, and its message is nowhere: a task that failed before it claimed the run
    # was acknowledged on its way out, or the sender died between recording the send and making it.
    # Its recorded send is no proof of a message: once, such a run waited for the visibility timeout.
    lost = make_run(broker, status=RunStatus.QUEUED, age_s=60, sent_age_s=0)
    just_sent = make_run(broker, status=RunStatus.QUEUED, age_s=60, sent_age_s=0)
    Run.objects.filter(pk=just_sent.pk).update(enqueued_at=timezone.now())  # a send under way

    assert requeue_stalled_runs() == [lost.pk]
    assert resumed(broker) == [lost.pk]  # it waited its turn once: it goes ahead of the backlog
    assert requeue_stalled_runs() == []


def test_a_queued_run_whose_message_never_reached_the_broker_is_sent_after_the_grace(broker):
    never = make_run(
        broker, status=RunStatus.QUEUED, age_s=settings.CONDUCTOR_SEND_GRACE_S + 5, sent_age_s=None
    )
    young = make_run(broker, status=RunStatus.QUEUED, age_s=1, sent_age_s=None)

    assert requeue_stalled_runs() == [never.pk]
    assert queued_run_ids(broker) == [never.pk]
    assert requeue_stalled_runs() == []
    assert Run.objects.get(pk=young.pk).enqueued_at is None


def test_a_message_older_than_the_visibility_timeout_counts_as_lost(broker):
    timeout = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    lost = make_run(broker, status=RunStatus.QUEUED, age_s=10, sent_age_s=timeout + 60)

    assert requeue_stalled_runs() == [lost.pk]


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED])
def test_finished_runs_are_never_sent_again(broker, status):
    make_run(broker, status=status, heartbeat_age_s=600, sent_age_s=600)
    make_run(broker, status=status, sent_age_s=None)

    assert requeue_stalled_runs() == []
    assert broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0


def test_two_senders_of_the_same_run_send_one_message(broker):
    run = make_run(broker, status=RunStatus.QUEUED, sent_age_s=None)

    assert run_send(run.pk, previous=None) is True
    assert run_send(run.pk, previous=None) is False
    assert queued_run_ids(broker) == [run.pk]
