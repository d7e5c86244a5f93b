"""A run chain's end and its seal on the way (audit.seals): a chain whose last event ended its run
(whose append sealed it) and that has no run.sealed event in the global chain is sound only while its
pending seal waits, matching the chain's last event, and is not overdue.

Overdue: older than AUDIT_SEAL_GRACE_S, or passed over: the sealer takes pending seals in id order, so
a later one sealed well after this one was made (COMMIT_SLACK, the time a run's end takes to commit the
row it made) means the sealer went past this one. A sealed chain's seal is checked as before
(chains._seal_problems); here, only that its pending row, if it has one, names that seal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from ..actions import Action
from ..models import GLOBAL_CHAIN, AuditEvent, PendingSeal
from .report import Problem, hash_short

# The events that end a run: their append seals its chain (services.event_record(seal=True)).
RUN_ENDS = (Action.RUN_SUCCEEDED, Action.RUN_FAILED)
# A run's end commits the pending row it made within this (the row's created_at is taken just before
# the end's statement); a later row sealed after that means this one was committed, and skipped.
COMMIT_SLACK = timedelta(seconds=5)
BATCH = 1000  # chains whose pending rows and named events are read per query


@dataclass(frozen=True)
class ChainEnd:
    """One run chain's end as verification found it."""

    chain: str
    tail: AuditEvent | None  # its last event (None: it has none)
    sealed_by: int | None  # the first run.sealed event of the global chain that names the chain
    pending: PendingSeal | None
    named: AuditEvent | None  # the event its pending row names as its seal (None: none, or gone)


def end_problems(end: ChainEnd, *, now: datetime) -> Iterator[Problem]:
    """What does not hold of a chain's end and its pending seal."""
    row, tail = end.pending, end.tail
    if row is None:
        if end.sealed_by is None and tail is not None and tail.action in RUN_ENDS:
            yield Problem(
                "unsealed",
                None,
                end.chain,
                tail.seq,
                f"its chain ended at seq {tail.seq} ({tail.action}, event #{tail.pk}), but has neither a "
                "seal in the global chain nor a pending seal",
                expected="a run.sealed event, or its pending seal",
                near_id=tail.pk,
            )
        return
    if row.seal_event_id is not None:
        why = _not_its_seal(row, end.named)
        late = _unlogged(row, now=now) if row.leaf_index is None else None
        if late is not None:
            yield Problem(
                "unlogged",
                None,
                end.chain,
                row.seq,
                f"its seal #{row.seal_event_id} is in the global chain, but it has no leaf in the log: {late}",
                expected="its leaf in the log's Merkle tree (the sealer adds it with the seal)",
                near_id=row.seal_event_id,
            )
        if why is not None:
            yield Problem(
                "pending",
                end.named.pk if end.named is not None else None,
                end.chain,
                row.seq,
                f"its pending seal (row {row.pk}) names event #{row.seal_event_id} as its seal, but {why}",
                expected=f"a run.sealed event of the global chain closing the chain at seq {row.seq} "
                f"with hash {hash_short(row.hash)}",
                near_id=end.sealed_by,
            )
        return
    if end.sealed_by is not None:
        yield Problem(
            "pending",
            None,
            end.chain,
            row.seq,
            f"its pending seal (row {row.pk}) is not marked sealed, though seal #{end.sealed_by} is in the "
            "global chain: the sealer would seal the chain twice",
            expected=f"row {row.pk} marked with event #{end.sealed_by}",
            near_id=end.sealed_by,
        )
        return
    if tail is None or (tail.seq, tail.hash) != (row.seq, row.hash):
        found = "it has no events" if tail is None else f"it ends at seq {tail.seq} (event #{tail.pk})"
        yield Problem(
            "pending",
            None,
            end.chain,
            row.seq,
            f"its pending seal (row {row.pk}) no longer matches its chain: the row says seq {row.seq} "
            f"with hash {hash_short(row.hash)}, {found}"
            + ("" if tail is None else f" with hash {hash_short(tail.hash)}"),
            expected=f"seq {row.seq} with hash {hash_short(row.hash)}",
            near_id=tail.pk if tail is not None else None,
        )
    late = _overdue(row, now=now)
    if late is not None:
        yield Problem(
            "overdue",
            None,
            end.chain,
            row.seq,
            f"its pending seal (row {row.pk}, made {row.created_at.isoformat()}) is overdue: {late}",
            expected="a run.sealed event in the global chain",
            near_id=tail.pk if tail is not None else None,
        )


def _not_its_seal(row: PendingSeal, event: AuditEvent | None) -> str | None:
    """Why `event` (what the row's seal_event_id names) is not the row's seal, or None."""
    if event is None:
        return "no such event exists"
    if event.chain != GLOBAL_CHAIN:
        return f"that is an event of chain {event.chain}"
    if event.action != Action.RUN_SEALED:
        return f"that is a {event.action} event"
    payload = event.payload if isinstance(event.payload, dict) else {}
    if (payload.get("chain"), payload.get("seq"), payload.get("hash")) != (row.chain, row.seq, row.hash):
        return (
            f"that seal closes {payload.get('chain')} at seq {payload.get('seq')} "
            f"with hash {hash_short(str(payload.get('hash') or ''))}"
        )
    return None


def _overdue(row: PendingSeal, *, now: datetime) -> str | None:
    """Why a pending seal not yet sealed is late, or None."""
    grace = timedelta(seconds=settings.AUDIT_SEAL_GRACE_S)
    waited = now - row.created_at
    if waited > grace:
        return (
            f"it has waited {int(waited.total_seconds())} s, longer than AUDIT_SEAL_GRACE_S "
            f"({settings.AUDIT_SEAL_GRACE_S} s)"
        )
    later = _passed_over(row)
    if later is not None:
        later_id, sealed_at = later
        return (
            f"the later pending seal row {later_id} was sealed at {sealed_at.isoformat()}, "
            f"{int((sealed_at - row.created_at).total_seconds())} s after this one was made"
        )
    return None


def _unlogged(row: PendingSeal, *, now: datetime) -> str | None:
    """Why a sealed row's missing leaf is late (the sealer gives each row its leaf in id order, with its
    seal or, for a row sealed before the log, at its next batch), or None."""
    waited = now - row.created_at
    if waited > timedelta(seconds=settings.AUDIT_SEAL_GRACE_S) and not _sealed_before_the_log(row):
        return f"it has waited {int(waited.total_seconds())} s, longer than AUDIT_SEAL_GRACE_S"
    later = (
        PendingSeal.objects.filter(pk__gt=row.pk, leaf_index__isnull=False)
        .values_list("pk", flat=True)
        .first()
    )
    if later is not None:
        return f"the later pending seal row {later} has its leaf: the sealer passed this one over"
    return None


def _sealed_before_the_log(row: PendingSeal) -> bool:
    """A row sealed before the log had any leaf waits for the sealer's next batch, however old."""
    return not PendingSeal.objects.filter(leaf_index__isnull=False).exists()


# The first pending seal after `row_id` (in id order) whose seal occurred after `settled_at`.
_PASSED_OVER = (
    "SELECT l.id, s.occurred_at FROM audit_pendingseal l JOIN audit_auditevent s ON s.id = l.seal_event_id "
    "WHERE l.id > %(row_id)s AND l.seal_event_id IS NOT NULL AND s.occurred_at > %(settled_at)s "
    "ORDER BY l.id LIMIT 1"
)


def _passed_over(row: PendingSeal) -> tuple[int, datetime] | None:
    with connection.cursor() as cursor:
        cursor.execute(_PASSED_OVER, {"row_id": row.pk, "settled_at": row.created_at + COMMIT_SLACK})
        found = cursor.fetchone()
    return (found[0], found[1]) if found is not None else None


def run_end_problems(name: str, events: list[AuditEvent], sealed_by: int | None) -> Iterator[Problem]:
    """One run chain's end (its events in seq order; its first seal's id, if any): one run's proof."""
    row = PendingSeal.objects.filter(chain=name).first()
    named = None
    if row is not None and row.seal_event_id is not None:
        named = AuditEvent.objects.filter(pk=row.seal_event_id).first()
    end = ChainEnd(
        chain=name, tail=events[-1] if events else None, sealed_by=sealed_by, pending=row, named=named
    )
    yield from end_problems(end, now=timezone.now())


# The chains of a full verification whose end may not hold (verify_tail: each chain's last event):
# an ended run chain with neither a seal nor a pending row; a pending row not yet sealed; a pending row
# whose seal_event_id does not name a seal of its chain at its seq and hash; a sealed row with no leaf. Each with its last event's
# id, its first seal's id and its pending row's id.
_CANDIDATES = """
    SELECT coalesce(t.chain, p.chain), t.id,
        (SELECT min(s.id) FROM audit_auditevent s WHERE s.chain = %(global_chain)s
            AND s.action = 'run.sealed' AND s.payload->>'chain' = coalesce(t.chain, p.chain)),
        p.id
    FROM (verify_tail t JOIN audit_auditevent e ON e.id = t.id)
    FULL JOIN audit_pendingseal p ON p.chain = t.chain
    LEFT JOIN audit_auditevent n ON n.id = p.seal_event_id
    WHERE (p.id IS NULL AND t.chain LIKE 'run:%%' AND e.action = ANY(%(ends)s)
            AND NOT EXISTS (SELECT 1 FROM audit_auditevent s WHERE s.chain = %(global_chain)s
                AND s.action = 'run.sealed' AND s.payload->>'chain' = t.chain))
        OR (p.id IS NOT NULL AND (p.seal_event_id IS NULL OR p.leaf_index IS NULL))
        OR (p.seal_event_id IS NOT NULL AND (n.id IS NULL OR n.chain <> %(global_chain)s
            OR n.action <> 'run.sealed' OR n.payload->>'chain' IS DISTINCT FROM p.chain
            OR n.payload->>'seq' IS DISTINCT FROM p.seq::text OR n.payload->>'hash' IS DISTINCT FROM p.hash))
    ORDER BY 1
"""


def all_end_problems() -> Iterator[Problem]:
    """Every run chain's end (a full verification; verify_tail filled): only the chains whose end may
    not hold come back from the database, a batch at a time."""
    now = timezone.now()
    params: dict[str, Any] = {"global_chain": GLOBAL_CHAIN, "ends": [str(a) for a in RUN_ENDS]}
    with connection.chunked_cursor() as cursor:
        cursor.execute(_CANDIDATES, params)
        while batch := cursor.fetchmany(BATCH):
            tails = AuditEvent.objects.in_bulk([t for _, t, _, _ in batch if t is not None])
            pending = PendingSeal.objects.in_bulk([p for *_, p in batch if p is not None])
            named = AuditEvent.objects.in_bulk(
                [r.seal_event_id for r in pending.values() if r.seal_event_id is not None]
            )
            for name, tail_id, sealed_by, pending_id in batch:
                row = pending.get(pending_id) if pending_id is not None else None
                end = ChainEnd(
                    chain=name,
                    tail=tails.get(tail_id) if tail_id is not None else None,
                    sealed_by=sealed_by,
                    pending=row,
                    named=named.get(row.seal_event_id) if row and row.seal_event_id else None,
                )
                yield from end_problems(end, now=now)
