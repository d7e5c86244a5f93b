"""Hash chains of audit events: canonical content, appending under the chain head's lock, sealing."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.utils import timezone

from . import rows
from .actions import Action
from .models import GLOBAL_CHAIN, AuditEvent, ChainHead
from .proof import GENESIS, canonical, content_of, digest  # noqa: F401 (canonical: re-exported)


def run_chain(correlation_id: uuid.UUID | str) -> str:
    return f"run:{correlation_id}"


def chain_for(correlation_id: uuid.UUID | None) -> str:
    return run_chain(correlation_id) if correlation_id else GLOBAL_CHAIN


def event_content(event: AuditEvent) -> dict[str, Any]:
    return content_of(
        chain=event.chain,
        seq=event.seq,
        occurred_at=event.occurred_at,
        actor_type=event.actor_type,
        actor_id=event.actor_id,
        actor_name=event.actor_name,
        action=event.action,
        object_type=event.object_type,
        object_id=event.object_id,
        task_id=event.task_id,
        correlation_id=event.correlation_id,
        payload=event.payload,
    )


def _lock_head(chain: str) -> ChainHead:
    """Lock the chain's head until the caller's transaction ends; a new chain's head is made first
    (one statement for a chain that exists, which is every event but a run's first)."""
    head = ChainHead.objects.select_for_update().filter(chain=chain).first()
    if head is not None:
        return head
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO audit_chainhead (chain, seq, hash, sealed, updated_at) "
            "VALUES (%(chain)s, 0, %(genesis)s, false, now()) ON CONFLICT (chain) DO NOTHING",
            {"chain": chain, "genesis": GENESIS},
        )
    return ChainHead.objects.select_for_update().get(chain=chain)


def _checked(fields: dict[str, Any]) -> dict[str, Any]:
    try:
        fields["action"] = str(Action(fields["action"]))
    except ValueError:
        raise ValueError(
            f"unknown audit action {fields['action']!r}: declare it in audit.actions.Action"
        ) from None
    return fields


@dataclass
class Planned:
    """Events to append to a chain, built on the head `expect` (seq, hash), each with its row as one
    JSON document (`documents`): written by a statement of `append_text` that moves the head only if
    it is still that one."""

    chain: str
    expect: tuple[int, str]
    events: list[AuditEvent]
    documents: list[str]


def plan(chain: str, events: list[dict[str, Any]], *, head: tuple[int, str] | None = None) -> Planned:
    """Events (their fields, as `append` takes them) built on `head` (seq, hash): the head the caller
    assumes, checked by the statement that appends them (`append_text`). Without one, on the head read
    under its lock (held until the caller's transaction ends). Each action must be one of
    audit.actions.Action."""
    events = [_checked(dict(fields)) for fields in events]
    if head is None:
        head = lock_head(chain)
    built, (seq, hash_) = [], head
    for fields in events:
        event = _event(chain, seq, hash_, fields)
        built.append(event)
        seq, hash_ = event.seq, event.hash
    return Planned(chain=chain, expect=head, events=built, documents=[event_document(e) for e in built])


def lock_head(chain: str) -> tuple[int, str]:
    """The chain's head (seq, hash), locked until the caller's transaction ends (made first for a new
    chain). Raises for a sealed chain: no event may be added to it."""
    head = _lock_head(chain)
    if head.sealed:
        raise RuntimeError(f"audit chain {chain} is sealed; no event may be added to it")
    return head.seq, head.hash


# The names of an append's expressions (append_text), for the statements it is part of.
HEAD_MOVED = "head_moved"


def event_inserted(i: int) -> str:
    """The name of the expression that inserts the append's `i`th event (it returns the event's id)."""
    return f"event_{i}"


def append_params(planned: Planned) -> dict[str, Any]:
    """The values of `append_text`'s parameters for the planned events, by name."""
    last = planned.events[-1]
    head = {
        "head_chain": planned.chain,
        "head_expect_seq": planned.expect[0],
        "head_expect_hash": planned.expect[1],
        "head_seq": last.seq,
        "head_hash": last.hash,
        "head_at": last.occurred_at,
    }
    return head | {event_inserted(i): document for i, document in enumerate(planned.documents)}


def event_document(event: AuditEvent) -> str:
    """An event's row as one JSON document (audit.rows), its id left out."""
    return rows.document((f, getattr(event, f.attname)) for f in _EVENT_FIELDS)


_EVENT_FIELDS = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]


@functools.lru_cache(maxsize=64)
def append_text(events: int, *, guard: str = "", seal: bool = False) -> tuple[str, ...]:
    """The expressions of an append of this many events (their text depends on nothing else; their
    parameters: append_params). `head_moved` moves the chain's head to the last event if it is still
    the one the events were built on and not sealed (`guard`: a further condition), which locks it,
    and with `seal` seals the chain there (its last event); `event_0`, `event_1`, ... insert the
    events, only if the head moved, each RETURNING its id."""
    columns = ", ".join(rows.quoted(f.column) for f in _EVENT_FIELDS)
    sealing = ", sealed = true" if seal else ""
    head = (
        f"{HEAD_MOVED} AS (UPDATE {ChainHead._meta.db_table} "  # noqa: S608 - names, not data
        f"SET seq = %(head_seq)s, hash = %(head_hash)s, updated_at = %(head_at)s{sealing} "
        "WHERE chain = %(head_chain)s AND seq = %(head_expect_seq)s AND hash = %(head_expect_hash)s "
        f"AND NOT sealed{guard} RETURNING 1)"
    )
    inserts = (
        f"{event_inserted(i)} AS (INSERT INTO {AuditEvent._meta.db_table} ({columns}) "  # noqa: S608 - names, not data
        f"SELECT {columns} FROM {rows.populated(AuditEvent, event_inserted(i))} "
        f"WHERE EXISTS (SELECT 1 FROM {HEAD_MOVED}) RETURNING id)"
        for i in range(events)
    )
    return (head, *inserts)


def appended(planned: Planned, ids: list[int]) -> None:
    """The planned events were written, with these ids."""
    for event, pk in zip(planned.events, ids, strict=True):
        event.pk = pk
        event._state.adding = False


def append(*, chain: str, seal: bool = False, **fields: Any) -> AuditEvent:
    """Append one event to a chain, on its head read under its lock (the caller's transaction holds it
    until it commits). Its action must be one of audit.actions.Action (stored as the plain string).
    With `seal`, the event is the chain's last: the same statement seals the chain."""
    planned = plan(chain, [fields])
    ctes = append_text(1, seal=seal)
    with rows.prepared_cursor() as cursor:
        cursor.execute(
            f"WITH {', '.join(ctes)} SELECT id FROM {event_inserted(0)}",  # noqa: S608 - names, not data
            append_params(planned),
        )
        row = cursor.fetchone()
    if row is None:  # pragma: no cover - the head is locked by this transaction: it cannot have moved
        raise RuntimeError(f"audit chain {chain} has no head")
    appended(planned, [row[0]])
    return planned.events[0]


def _event(chain: str, head_seq: int, head_hash: str, fields: dict[str, Any]) -> AuditEvent:
    occurred_at = timezone.now()
    seq = head_seq + 1
    hash_ = digest(head_hash, content_of(chain=chain, seq=seq, occurred_at=occurred_at, **fields))
    return AuditEvent(
        chain=chain, seq=seq, prev_hash=head_hash, hash=hash_, occurred_at=occurred_at, **fields
    )
