"""Helpers for the audit tests: tampering as a database superuser would, and the verify command."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from typing import Any

from django.core.management import call_command
from django.db import connection

from audit.models import AuditEvent
from audit.seals import seal_pending
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
    """Execute the run here, then append its pending seal to the global chain, as beat's sealer does
    within a second of the run's end (audit.seals)."""
    engine.execute_run(run.pk)
    seal_pending()
    run.refresh_from_db()
    return run


def expected_hash(event: AuditEvent) -> str:
    """sha256(previous hash + canonical content), written out here independently of audit.chain."""
    content = {
        "chain": event.chain,
        "seq": event.seq,
        "occurred_at": event.occurred_at.astimezone(UTC).isoformat(),
        "actor_type": event.actor_type,
        "actor_id": event.actor_id,
        "actor_name": event.actor_name,
        "action": event.action,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "task_id": str(event.task_id) if event.task_id else None,
        "correlation_id": str(event.correlation_id) if event.correlation_id else None,
        "payload": event.payload,
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(event.prev_hash.encode() + canonical.encode()).hexdigest()


def rehash(chain_name: str, from_seq: int, change=None) -> list[AuditEvent]:
    """Rewrite a chain from one event on and recompute every hash after it, as an insider with the
    code and superuser rights could: the chain then links up perfectly. `change(event)` edits one."""
    events = list(AuditEvent.objects.filter(chain=chain_name, seq__gte=from_seq).order_by("seq"))
    previous = events[0].prev_hash
    with triggers_off():
        for event in events:
            if change is not None:
                change(event)
            event.prev_hash = previous
            event.hash = expected_hash(event)
            AuditEvent.objects.filter(pk=event.pk).update(
                payload=event.payload, prev_hash=event.prev_hash, hash=event.hash, seq=event.seq
            )
            previous = event.hash
    return events
