"""requeue_stalled_runs against the real PostgreSQL (advisory locks) and the real Redis broker."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from routing.engine import run_lock
from routing.models import Run, RunStatus, Task
from routing.services import TaskSubmission, conductor_active, task_submit
from routing.tasks import requeue_stalled_runs
from tests.conftest import clear_queues

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    clear_queues()
    yield client
    clear_queues()
    client.close()


def queued_run_ids(client: redis.Redis) -> list[int]:
    """The run ids of the run_workflow messages waiting in the broker's queue (kombu's Redis list)."""
    run_ids = []
    for raw in client.lrange(settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == "routing.tasks.run_workflow"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        run_ids.append(args[0])
    return sorted(run_ids)


def make_run(client: redis.Redis, *, status: str, age_s: float, heartbeat_age_s: float | None) -> Run:
    """A submitted run, then aged: created age_s ago, last heartbeat heartbeat_age_s ago (None: never)."""
    conductor_active()
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    run = task.runs.get()
    # Submitting queued it (on commit); start every test from an empty queue.
    assert run.pk in queued_run_ids(client)
    clear_queues()
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=status,
        created_at=now - timedelta(seconds=age_s),
        heartbeat_at=None if heartbeat_age_s is None else now - timedelta(seconds=heartbeat_age_s),
    )
    return run


def stale() -> float:
    return settings.CONDUCTOR_STALLED_AFTER_S + 60


def test_a_stalled_running_run_is_queued_again(broker):
    run = make_run(broker, status=RunStatus.RUNNING, age_s=stale() * 3, heartbeat_age_s=stale())
    assert broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0

    assert requeue_stalled_runs() == [run.pk]

    assert broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 1
    assert queued_run_ids(broker) == [run.pk]


def test_a_queued_run_whose_message_was_lost_is_queued_again(broker):
    run = make_run(broker, status=RunStatus.QUEUED, age_s=stale(), heartbeat_age_s=None)

    assert requeue_stalled_runs() == [run.pk]
    assert queued_run_ids(broker) == [run.pk]


def test_a_run_whose_lock_is_held_is_left_alone(broker):
    locked = make_run(broker, status=RunStatus.RUNNING, age_s=stale() * 3, heartbeat_age_s=stale())
    other = make_run(broker, status=RunStatus.RUNNING, age_s=stale() * 3, heartbeat_age_s=stale())

    with run_lock(locked.pk) as acquired:
        assert acquired
        assert requeue_stalled_runs() == [other.pk]
        assert queued_run_ids(broker) == [other.pk]

    # Once the holder is gone, the same run counts as stalled: the lock was the only reason. The run
    # queued a moment ago is not queued again at the next tick.
    clear_queues()
    assert requeue_stalled_runs() == [locked.pk]
    assert queued_run_ids(broker) == [locked.pk]
    assert requeue_stalled_runs() == []


@pytest.mark.parametrize(
    ("status", "age", "heartbeat_age"),
    [
        # Ages as functions of CONDUCTOR_STALLED_AFTER_S.
        (RunStatus.RUNNING, lambda s: 10, lambda s: 10),  # just submitted
        (RunStatus.QUEUED, lambda s: 10, None),  # just submitted, not yet picked up
        (RunStatus.RUNNING, lambda s: s * 3, lambda s: 10),  # old, but its worker beat recently
        (RunStatus.RUNNING, lambda s: s - 30, lambda s: s + 60),  # created after the cutoff
    ],
    ids=["recent-running", "recent-queued", "fresh-heartbeat", "created-after-cutoff"],
)
def test_a_run_that_moved_recently_is_not_requeued(broker, status, age, heartbeat_age):
    after = settings.CONDUCTOR_STALLED_AFTER_S
    make_run(
        broker,
        status=status,
        age_s=age(after),
        heartbeat_age_s=None if heartbeat_age is None else heartbeat_age(after),
    )

    assert requeue_stalled_runs() == []
    assert broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED])
def test_finished_runs_are_not_requeued(broker, status):
    make_run(broker, status=status, age_s=stale() * 3, heartbeat_age_s=stale() * 2)
    make_run(broker, status=status, age_s=stale() * 3, heartbeat_age_s=None)

    assert requeue_stalled_runs() == []
    assert broker.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0


def test_only_the_stalled_run_of_a_mixed_set_is_requeued(broker):
    stalled = make_run(broker, status=RunStatus.RUNNING, age_s=stale() * 3, heartbeat_age_s=stale())
    make_run(broker, status=RunStatus.RUNNING, age_s=stale() * 3, heartbeat_age_s=5)
    make_run(broker, status=RunStatus.SUCCEEDED, age_s=stale() * 3, heartbeat_age_s=stale())
    make_run(broker, status=RunStatus.QUEUED, age_s=5, heartbeat_age_s=None)

    assert requeue_stalled_runs() == [stalled.pk]
    assert queued_run_ids(broker) == [stalled.pk]
