"""Writing audit events. Callers pass the actor and run inside the transaction of the change."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from . import chain
from .actions import Action
from .models import AuditEvent, LegalHold


@dataclass(frozen=True)
class Actor:
    type: str
    id: str
    name: str

    @classmethod
    def for_user(cls, user: Any) -> Actor:
        if user is None or not getattr(user, "is_authenticated", False):
            return cls(type=AuditEvent.ActorType.USER, id="", name="anonymous")
        return cls(type=AuditEvent.ActorType.USER, id=str(user.pk), name=user.get_username())

    @classmethod
    def service(cls, name: str) -> Actor:
        return cls(type=AuditEvent.ActorType.SERVICE, id="", name=name)


ENGINE = Actor.service("engine")


def _jsonable(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as stored: Decimals and datetimes become strings exactly as written (no float
    rounding of money), NUL characters (which jsonb cannot hold, and model output may contain)
    replaced. A payload of JSON's own types is only walked, not encoded and parsed again."""
    try:
        return _native(payload)  # type: ignore[no-any-return]
    except _NotNative:
        return _native(json.loads(json.dumps(payload, cls=DjangoJSONEncoder)))  # type: ignore[no-any-return]


class _NotNative(Exception):
    pass


def _native(value: Any) -> Any:
    """`value` with its NULs replaced, when it holds only JSON's own types (as json.loads gives them
    back, tuples as lists); raises _NotNative for anything else."""
    kind = type(value)
    if kind is str:
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if value is None or kind is int or kind is bool or kind is float:
        return value
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise _NotNative
        return {k: _native(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_native(v) for v in value]
    raise _NotNative


def event_record(
    *,
    actor: Actor,
    action: str,
    obj: Any,
    payload: dict[str, Any] | None = None,
    task_id: uuid.UUID | None = None,
    correlation_id: uuid.UUID | None = None,
    seal: bool = False,
) -> AuditEvent:
    """Append one event. Must run inside the transaction that makes the change it describes.

    Events of a run (with its correlation id) go to the run's chain; all others to the global chain.
    `seal`: the run's last event, its chain sealed by the same statement (its pending seal: audit.seals).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit events must be written inside the transaction of the change")
    return chain.append(
        chain=chain.chain_for(correlation_id),
        seal=seal,
        **event_fields(
            actor=actor,
            action=action,
            obj=obj,
            payload=payload,
            task_id=task_id,
            correlation_id=correlation_id,
        ),
    )


def event_fields(
    *,
    actor: Actor,
    action: str,
    obj: Any,
    payload: dict[str, Any] | None = None,
    task_id: uuid.UUID | None = None,
    correlation_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    """An event's fields, as `chain.append` and `chain.plan` take them (for a caller that writes its
    change and its events in one statement: the engine)."""
    return {
        "actor_type": actor.type,
        "actor_id": actor.id,
        "actor_name": actor.name,
        "action": action,
        "object_type": obj._meta.model_name,
        "object_id": str(obj.pk),
        "task_id": task_id,
        "correlation_id": correlation_id,
        "payload": _jsonable(payload or {}),
    }


def run_chain_seal_fields(*, run: Any, task_id: uuid.UUID | None, last: AuditEvent) -> dict[str, Any]:
    """The fields of the run.sealed event of a run whose chain's last event is `last`."""
    return run_seal_fields(
        object_type=run._meta.model_name,
        object_id=str(run.pk),
        task_id=task_id,
        chain=last.chain,
        seq=last.seq,
        hash_=last.hash,
    )


def run_seal_fields(
    *, object_type: str, object_id: str, task_id: uuid.UUID | None, chain: str, seq: int, hash_: str
) -> dict[str, Any]:
    """The fields of the run.sealed event that records run chain `chain` closed at (`seq`, `hash_`):
    the one definition (the sealer appends it: audit.seals.seal_pending). Every reader of seals reads these fields."""
    return {
        "actor_type": ENGINE.type,
        "actor_id": ENGINE.id,
        "actor_name": ENGINE.name,
        "action": Action.RUN_SEALED,
        "object_type": object_type,
        "object_id": object_id,
        "task_id": task_id,
        "correlation_id": None,
        "payload": {"chain": chain, "seq": seq, "hash": hash_},
    }


def record_viewed(*, request: Any, task: Any, view: str) -> AuditEvent:
    """Who looked at a task's record, and where (page, dossier, API, export)."""
    with transaction.atomic():
        return event_record(
            actor=Actor.for_user(request.user),
            action=Action.RECORD_VIEWED,
            obj=task,
            task_id=task.pk,
            payload={"view": view, "path": request.path[:300], "ip": request.META.get("REMOTE_ADDR", "")},
        )


def legal_hold_place(*, task: Any, actor: Actor, reason: str) -> Any:

    with transaction.atomic():
        hold = LegalHold.objects.create(task_id=task.pk, reason=reason, placed_by=actor.name)
        event_record(
            actor=actor, action=Action.LEGALHOLD_PLACED, obj=hold, task_id=task.pk, payload={"reason": reason}
        )
    return hold


def legal_hold_release(*, task: Any, actor: Actor) -> int:

    with transaction.atomic():
        holds = list(LegalHold.objects.select_for_update().filter(task_id=task.pk, released_at__isnull=True))
        for hold in holds:
            hold.released_at = timezone.now()
            hold.released_by = actor.name
            hold.save(update_fields=["released_at", "released_by"])
            event_record(
                actor=actor,
                action=Action.LEGALHOLD_RELEASED,
                obj=hold,
                task_id=task.pk,
                payload={"reason": hold.reason},
            )
    return len(holds)
