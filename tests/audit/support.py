"""Helpers for the audit tests: tampering as a database superuser would, and the verify command."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management import call_command
from django.db import connection

from routing import engine
from routing.models import Run, Task
from routing.services import TaskSubmission, task_submit


def sql(statement: str, params: list[Any] | tuple[Any, ...] = ()) -> int:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


@contextmanager
def triggers_off() -> Iterator[None]:
    """What a superuser with direct database access can do: switch the append-only triggers off."""
    sql("SET session_replication_role = replica")
    try:
        yield
    finally:
        sql("SET session_replication_role = origin")


def audit_verify(*args: str) -> tuple[int, str, str]:
    """Run `manage.py audit_verify`; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def submit(text: str = "What is 6 * 7?", **kwargs: Any) -> Run:
    task, _ = task_submit(submission=TaskSubmission(text=text, **kwargs), source=Task.Source.API)
    return task.runs.get()


def run_now(run: Run) -> Run:
    engine.execute_run(run.pk)
    run.refresh_from_db()
    return run
