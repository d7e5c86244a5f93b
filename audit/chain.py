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


def append(*, chain: str, **fields: Any) -> AuditEvent:
    """Append one event to a chain. The caller's transaction holds the chain head until it commits.
    Its action must be one of audit.actions.Action (stored as the plain string)."""
    try:
        fields["action"] = str(Action(fields["action"]))
    except ValueError:
        raise ValueError(
            f"unknown audit action {fields['action']!r}: declare it in audit.actions.Action"
        ) from None
    head = _lock_head(chain)
    if head.sealed:
        raise RuntimeError(f"audit chain {chain} is sealed; no event may be added to it")
    occurred_at = timezone.now()
    seq = head.seq + 1
    content = content_of(chain=chain, seq=seq, occurred_at=occurred_at, **fields)
    event_hash = digest(head.hash, content)
    event = AuditEvent(
        chain=chain, seq=seq, prev_hash=head.hash, hash=event_hash, occurred_at=occurred_at, **fields
    )
    _insert_advancing_head(event)
    return event


def _insert_advancing_head(event: AuditEvent) -> None:
    """INSERT the event and move its chain's head to it, in one statement (the head is locked)."""
    fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    values = [f.get_db_prep_save(getattr(event, f.attname), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH e AS (INSERT INTO {AuditEvent._meta.db_table} ({columns}) "  # noqa: S608 - names, not data
            f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING id) "
            f"UPDATE {ChainHead._meta.db_table} SET seq = %s, hash = %s, updated_at = %s WHERE chain = %s "
            "RETURNING (SELECT id FROM e)",
            [*values, event.seq, event.hash, event.occurred_at, event.chain],
        )
        row = cursor.fetchone()
    if row is None:  # the head was locked by this transaction: it cannot have gone
        raise RuntimeError(f"audit chain {event.chain} has no head")
    event.pk = row[0]
    event._state.adding = False


def seal(*, chain: str) -> ChainHead:
    """Close a run chain; returns its final head, which the caller records in the global chain."""
    head = _lock_head(chain)
    # updated_at moves too: the next checkpoint signs the sealed head.
    ChainHead.objects.filter(chain=chain).update(sealed=True, updated_at=timezone.now())
    head.sealed = True
    return head
