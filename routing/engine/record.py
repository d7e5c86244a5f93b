"""What every part of the engine writes through: the audit event of a change (which also fences
the claim), the cost roll-up, and the errors that stop a run or a process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

import psycopg
from django import db as django_db
from django.db import connection, transaction
from django.db.models import F, OuterRef, Subquery, Sum
from django.utils import timezone

from audit import policies
from audit.services import ENGINE, event_record

from .. import live, log_context
from ..models import Run

log = logging.getLogger(__name__)
events_log = logging.getLogger("routing.events")  # a line per engine event: what log platforms join on


class Fenced(Exception):
    """This process's claim on the run is no longer current (another process claimed it, or the lock's
    connection died): it must write nothing more and make no more calls."""


class InfrastructureError(Exception):
    """The database (or its connection) failed under the run: not the run's fault. The run is left as it
    is, for the next delivery to resume; the Celery task retries the message."""


INFRASTRUCTURE_ERRORS = (django_db.OperationalError, django_db.InterfaceError, psycopg.OperationalError)


class RunStopped(Exception):
    """The run cannot go on: a step failed, a plan stayed invalid, or a budget was reached."""

    def __init__(self, message: str, *, stop_reason: str):
        super().__init__(message)
        self.stop_reason = stop_reason


@dataclass(frozen=True)
class Fence:
    spent: Decimal  # the run's totals, the cost just added included
    input_tokens: int
    output_tokens: int
    rules_stamp: str  # the policy rules' stamp, when asked for (audit.policies.rules_as_of)


@contextmanager
def fenced_write(
    run: Run,
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
    rules: bool = False,
) -> Iterator[Fence]:
    """A write transaction of the engine, fenced in its first statement: the run row is locked, a cost
    added to its totals, and the claim checked (`fence`). Yields what the run
    has spent so far (this cost included), for budget checks, and with `rules` the policy rules' stamp.
    The events recorded inside it do not fence again."""
    with transaction.atomic():
        fenced = fence(run, cost=cost, input_tokens=input_tokens, output_tokens=output_tokens, rules=rules)
        run._fenced = True  # type: ignore[attr-defined]
        try:
            yield fenced
        finally:
            run._fenced = False  # type: ignore[attr-defined]


def record_event(run: Run, action: str, obj: Any, payload: dict[str, Any]) -> None:
    """An engine event on the run's chain; call inside the transaction of the change it records.

    Watchers of the task get a small live event after commit, numbered by the event's place in the
    run's chain (gap-free), so a page can tell when it missed one.

    Every write transaction of the engine records an event, so this is also where the claim is fenced
    (unless the transaction is a `fenced_write`, which did it first): the run row is locked and its
    claim epoch must still be this process's, or the whole transaction (the change with its event)
    rolls back.
    """
    if not getattr(run, "_fenced", False):
        fence(run)
    event = event_record(
        actor=ENGINE,
        action=action,
        obj=obj,
        task_id=run.task_id,
        correlation_id=run.correlation_id,
        payload=payload,
    )
    live.publish_on_commit(
        task_id=run.task_id,
        event={
            "run": run.pk,
            "seq": event.seq,
            "action": action,
            "object": event.object_type,
            "id": event.object_id,
        },
    )
    # One JSON-ready log line per committed event, with the run's ids and trace id (log_context).
    fields = {"event": action, "object": event.object_type, "object_id": event.object_id, "seq": event.seq}
    transaction.on_commit(
        partial(
            events_log.info,
            "%s %s %s",
            action,
            event.object_type,
            event.object_id,
            extra={**fields, **log_context.ids_of(run)},
        )
    )


def fence(
    run: Run,
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
    rules: bool = False,
) -> Fence:
    """Inside a write transaction: lock the run row and check that this process's claim is current.
    One statement, which also adds a cost to the run's totals and (`rules`) reads the policy rules'
    stamp. Returns the totals and the stamp.

    It does not beat the run's heartbeat (the keeper does, on the lock's connection): heartbeat_at is
    indexed, so an UPDATE of it writes a new version of the row into each of the run's indexes, and a
    step's fences did that several times over. A fence with no cost only locks the row; one with a
    cost changes columns no index holds (PostgreSQL can update it in place: HOT)."""
    stamp = policies.RULES_STAMP_SQL if rules else "NULL"
    lost = getattr(run, "_claim_lost", None)
    if lost is not None and lost.is_set():
        raise Fenced(f"run {run.pk}: the lock's connection was lost; this process stops")
    returning = f"claim_epoch, cost_usd, input_tokens, output_tokens, {stamp}"
    with connection.cursor() as cursor:
        if cost or input_tokens or output_tokens:
            cursor.execute(
                "UPDATE routing_run SET cost_usd = cost_usd + %s, input_tokens = input_tokens + %s, "  # noqa: S608 - no data in it
                f"output_tokens = output_tokens + %s WHERE id = %s RETURNING {returning}",
                [cost, input_tokens, output_tokens, run.pk],
            )
        else:
            cursor.execute(f"SELECT {returning} FROM routing_run WHERE id = %s FOR UPDATE", [run.pk])  # noqa: S608
        row = cursor.fetchone()
    epoch = row[0] if row else None
    if epoch != run.claim_epoch:
        raise Fenced(f"run {run.pk} was claimed again (epoch {epoch}, this process holds {run.claim_epoch})")
    return Fence(spent=row[1], input_tokens=row[2], output_tokens=row[3], rules_stamp=row[4] or "")


def claim_current(run: Run) -> None:
    """Before a provider call: stop if the lock's connection was lost (no database round trip)."""
    lost = getattr(run, "_claim_lost", None)
    if lost is not None and lost.is_set():
        raise Fenced(f"run {run.pk}: the lock's connection was lost; this process stops before its next call")


def add_cost(run: Run, *, cost: Decimal, input_tokens: int, output_tokens: int) -> None:
    """Add a cost to the run's totals, in the caller's transaction (its task's: when the run ends)."""
    if not (cost or input_tokens or output_tokens):
        return
    Run.objects.filter(pk=run.pk).update(
        cost_usd=F("cost_usd") + cost,
        input_tokens=F("input_tokens") + input_tokens,
        output_tokens=F("output_tokens") + output_tokens,
        heartbeat_at=timezone.now(),
    )


def task_totals() -> dict[str, Subquery]:
    """A task's totals, for its UPDATE when one of its runs ends: the sum of its runs' (so a run still
    going counts once it ends, and totals never drift from the runs they sum)."""
    runs = Run.objects.filter(task_id=OuterRef("pk")).order_by().values("task_id")
    return {
        field: Subquery(runs.annotate(total=Sum(field)).values("total"))
        for field in ("cost_usd", "input_tokens", "output_tokens")
    }
