"""Hash chains of audit events: canonical content, appending under the chain head's lock, sealing."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from .actions import Action
from .models import GLOBAL_CHAIN, AuditEvent, ChainHead

GENESIS = "0" * 64


def run_chain(correlation_id: uuid.UUID | str) -> str:
    return f"run:{correlation_id}"


def chain_for(correlation_id: uuid.UUID | None) -> str:
    return run_chain(correlation_id) if correlation_id else GLOBAL_CHAIN


def canonical(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def content_of(
    *,
    chain: str,
    seq: int,
    occurred_at: datetime,
    actor_type: str,
    actor_id: str,
    actor_name: str,
    action: str,
    object_type: str,
    object_id: str,
    task_id: Any,
    correlation_id: Any,
    payload: dict[str, Any],
) -> dict[str, Any]:
    return {
        "chain": chain,
        "seq": seq,
        "occurred_at": occurred_at.astimezone(UTC).isoformat(),
        "actor_type": actor_type,
        "actor_id": actor_id,
        "actor_name": actor_name,
        "action": action,
        "object_type": object_type,
        "object_id": object_id,
        "task_id": str(task_id) if task_id else None,
        "correlation_id": str(correlation_id) if correlation_id else None,
        "payload": payload,
    }


def digest(prev_hash: str, content: dict[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(content)).hexdigest()


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
            "INSERT INTO audit_chainhead (chain, seq, hash, sealed, updated_at) VALUES (%s, 0, %s, false, now()) "
            "ON CONFLICT (chain) DO NOTHING",
            [chain, GENESIS],
        )
    return ChainHead.objects.select_for_update().get(chain=chain)


# The last head this process wrote or read, per chain: a guess, checked by the statement that uses it.
_HEADS: dict[str, tuple[int, str]] = {}
_HEADS_KEPT = 4096


def _remember(chain: str, seq: int, hash_: str) -> None:
    if len(_HEADS) >= _HEADS_KEPT and chain not in _HEADS:
        _HEADS.clear()  # a bound, not an LRU: a guess lost costs one locked read
    _HEADS[chain] = (seq, hash_)


def append(*, chain: str, **fields: Any) -> AuditEvent:
    """Append one event to a chain. The caller's transaction holds the chain head until it commits.
    Its action must be one of audit.actions.Action (stored as the plain string).

    One statement when this process wrote the chain's last event (a run's chain: its engine): the event
    is built on the head it remembers, and inserted only if the head is still that one, moved in the
    same statement (which locks it). Anything else (a head another process moved, a rolled-back
    append, a new chain) takes the head's lock first and builds on what it reads.
    """
    try:
        fields["action"] = str(Action(fields["action"]))
    except ValueError:
        raise ValueError(
            f"unknown audit action {fields['action']!r}: declare it in audit.actions.Action"
        ) from None
    known = _HEADS.get(chain)
    if known is not None:
        event = _event(chain, known[0], known[1], fields)
        if _insert_advancing_head(event, expect=known):
            _remember(chain, event.seq, event.hash)
            return event
    head = _lock_head(chain)
    if head.sealed:
        raise RuntimeError(f"audit chain {chain} is sealed; no event may be added to it")
    event = _event(chain, head.seq, head.hash, fields)
    if not _insert_advancing_head(event):  # the head was locked by this transaction: it cannot have gone
        raise RuntimeError(f"audit chain {chain} has no head")
    _remember(chain, event.seq, event.hash)
    return event


def _event(chain: str, head_seq: int, head_hash: str, fields: dict[str, Any]) -> AuditEvent:
    occurred_at = timezone.now()
    seq = head_seq + 1
    content = content_of(chain=chain, seq=seq, occurred_at=occurred_at, **fields)
    return AuditEvent(
        chain=chain,
        seq=seq,
        prev_hash=head_hash,
        hash=digest(head_hash, content),
        occurred_at=occurred_at,
        **fields,
    )


def _insert_advancing_head(event: AuditEvent, expect: tuple[int, str] | None = None) -> bool:
    """Move the chain's head to the event and INSERT it, in one statement. With `expect`, only if the
    head is still that (seq, hash) and not sealed; the UPDATE locks the head either way. Returns
    whether the event was inserted."""
    fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    values = [f.get_db_prep_save(getattr(event, f.attname), connection) for f in fields]
    guard, guard_params = "", []
    if expect is not None:
        guard, guard_params = " AND seq = %s AND hash = %s AND NOT sealed", list(expect)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH h AS (UPDATE {ChainHead._meta.db_table} SET seq = %s, hash = %s, updated_at = %s "  # noqa: S608 - names, not data
            f"WHERE chain = %s{guard} RETURNING 1) "
            f"INSERT INTO {AuditEvent._meta.db_table} ({columns}) "
            f"SELECT {', '.join(['%s'] * len(fields))} FROM h RETURNING id",
            [event.seq, event.hash, event.occurred_at, event.chain, *guard_params, *values],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    event.pk = row[0]
    event._state.adding = False
    return True


def seal(*, chain: str) -> ChainHead:
    """Close a run chain; returns its final head, which the caller records in the global chain. One
    statement (which locks the head until the caller's transaction ends) for a chain with events."""
    _HEADS.pop(chain, None)
    now = timezone.now()  # updated_at moves too: the next checkpoint signs the sealed head
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ChainHead._meta.db_table} SET sealed = true, updated_at = %s WHERE chain = %s "  # noqa: S608 - a name
            "RETURNING seq, hash",
            [now, chain],
        )
        row = cursor.fetchone()
    if row is None:  # no event yet: the head is made, then sealed
        head = _lock_head(chain)
        ChainHead.objects.filter(chain=chain).update(sealed=True, updated_at=now)
        row = (head.seq, head.hash)
    return ChainHead(chain=chain, seq=row[0], hash=row[1], sealed=True, updated_at=now)
