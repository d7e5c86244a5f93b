"""What an audit event's hash is, defined once and without Django: the app writes and verifies its
chains with it (audit.chain), and the standalone bundle verifier (audit.bundle) checks an exported
dossier with it and nothing else.

An event's hash is sha256(previous hash + canonical JSON of its content); the first event of a chain
links to GENESIS. A value an event does not carry (a prompt, a response) is recorded by content_hash.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

GENESIS = "0" * 64


def canonical(fields: Any) -> bytes:
    """The bytes that are hashed and signed: sorted keys, no spaces, UTF-8."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def content_hash(value: Any) -> str:
    """The sha256 an event records for a JSON value it does not carry (messages, a response, a text)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


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
    """An event's content, as its hash covers it (times in UTC, ids as text)."""
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


def body_digest(body: dict[str, Any]) -> str:
    """A checkpoint body's digest (the next checkpoint links to it)."""
    return hashlib.sha256(canonical(body)).hexdigest()


def money(value: Any) -> Decimal | None:
    """A USD amount an event recorded (a string or a number), or None when there is none or it is not one."""
    try:
        return Decimal(str(value)) if value is not None else None
    except InvalidOperation:
        return None


def seal_leaf(*, chain: str, seq: int, hash_: str, object_type: str, object_id: str, task_id: Any) -> bytes:
    """The leaf of the audit log (audit.merkle) that records run chain `chain` closed at (`seq`,
    `hash_`): the run's seal, as the canonical JSON of what its pending seal holds. A bundle's verifier
    rebuilds it from the chain's last event and the run it names."""
    return canonical(
        {
            "chain": chain,
            "seq": seq,
            "hash": hash_,
            "object_type": object_type,
            "object_id": str(object_id),
            "task_id": str(task_id) if task_id else None,
        }
    )
