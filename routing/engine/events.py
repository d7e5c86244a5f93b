"""The engine's audit events: their fields on the run's chain, and who hears of them once they
commit (the task's live watchers, the log)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import transaction

from audit.models import AuditEvent
from audit.services import ENGINE, event_fields
from routing import live_events
from utilities import structured_logs

from ..models import Run
from ..signals import run_finished, written_at_end
from .execution import RunExecution

if TYPE_CHECKING:
    from .changes import Event

log = logging.getLogger(__name__)
events_log = logging.getLogger("routing.events")  # a line per engine event: what log platforms join on


def announce_end(run: Run, now: Any) -> None:
    """run_finished, from the transaction that writes the run's end (or after the statement that was
    it). Where a receiver writes for the run's kind (signals.written_at_end) the receivers hear inside
    that transaction, and one that fails takes the end back; for any other kind they hear once it
    committed, and one that fails is logged (the run has ended)."""
    if written_at_end(run.kind):
        run_finished.send(sender=Run, run=run, now=now)
    else:
        transaction.on_commit(lambda: _heard_after_commit(run, now))


def _heard_after_commit(run: Run, now: Any) -> None:
    for receiver, outcome in run_finished.send_robust(sender=Run, run=run, now=now):
        if isinstance(outcome, Exception):
            log.error(
                "run %s ended; a receiver of run_finished failed after it: %r",
                run.pk,
                receiver,
                exc_info=outcome,
            )


def engine_event_fields(run: Run, events: Iterable[Event]) -> list[dict[str, Any]]:
    """The fields of the engine's events on the run's chain."""
    return [
        event_fields(
            actor=ENGINE,
            action=event.action,
            obj=event.obj,
            payload=dict(event.payload),
            task_id=run.task_id,
            correlation_id=run.correlation_id,
        )
        for event in events
    ]


def announce(execution: RunExecution, *events: AuditEvent) -> None:
    """After the events' transaction commits: a small live event each for the task's watchers, numbered
    by the event's place in the run's chain (gap-free, so a page can tell when it missed one), and one
    JSON-ready log line each with the run's ids and trace id (log_context), what log platforms join
    on. One callback each for all the events of a statement (the log lines only when logged)."""
    run = execution.run
    shown = [
        {"run": run.pk, "seq": e.seq, "action": e.action, "object": e.object_type, "id": e.object_id}
        for e in events
    ]
    live_events.publish_on_commit(task_id=run.task_id, events=shown)
    if not events_log.isEnabledFor(logging.INFO):
        return
    if execution.log_ids is None:
        execution.log_ids = structured_logs.ids_of(run)
    ids = execution.log_ids

    def log_lines() -> None:
        for event in shown:
            events_log.info(
                "%s %s %s",
                event["action"],
                event["object"],
                event["id"],
                extra={
                    "event": event["action"],
                    "object": event["object"],
                    "object_id": event["id"],
                    "seq": event["seq"],
                    **ids,
                },
            )

    transaction.on_commit(log_lines)
