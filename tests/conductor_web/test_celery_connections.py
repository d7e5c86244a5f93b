"""A worker's database connection outlives its tasks (as a request's does under CONN_MAX_AGE): with
it, the statements the engine prepared on it. Celery's own Django fixup, as a worker installs it,
would close every connection before and after each task."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from celery import signals
from celery.fixups.django import DjangoWorkerFixup
from django.db import connection

from audit.rows import prepared_cursor
from conductor_web.celery import app
from routing.tasks import run_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def around_a_task(fixup: DjangoWorkerFixup) -> None:
    """What a worker does around each task: the fixup's handlers, then the app's own."""
    task = SimpleNamespace(request=SimpleNamespace(is_eager=False))
    fixup.on_task_prerun(sender=task)
    signals.task_prerun.send(sender=run_workflow, task_id="t", task=run_workflow, args=(), kwargs={})
    fixup.on_task_postrun(sender=task)
    signals.task_postrun.send(sender=run_workflow, task_id="t", task=run_workflow, args=(), kwargs={})


def test_a_workers_connection_and_its_prepared_statements_outlive_its_tasks():
    fixup = DjangoWorkerFixup(app)
    with prepared_cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid() + %s", [0])
        backend = cursor.fetchone()[0]
    raw = connection.connection

    for _ in range(3):
        around_a_task(fixup)

    assert connection.connection is raw and not raw.closed
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] == backend
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        assert [row[0] for row in cursor.fetchall()] == ["SELECT pg_backend_pid() + $1"]


def test_a_task_run_eagerly_leaves_its_callers_connection_alone():
    connection.ensure_connection()
    raw = connection.connection
    connection.close_at = time.monotonic() - 1  # past its age: a worker's would be closed
    eager = SimpleNamespace(request=SimpleNamespace(is_eager=True))

    signals.task_postrun.send(sender=run_workflow, task_id="t", task=eager, args=(), kwargs={})

    assert connection.connection is raw and not raw.closed


def test_a_connection_older_than_its_max_age_is_closed_around_a_task():
    fixup = DjangoWorkerFixup(app)
    connection.ensure_connection()
    raw = connection.connection
    connection.close_at = time.monotonic() - 1  # CONN_MAX_AGE has passed

    around_a_task(fixup)

    assert connection.connection is None and raw.closed
