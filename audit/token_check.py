"""API tokens against the events that record them: a token row is what its `token.created` event
recorded (its user, role, expiry, name, prefix and key, audit.grants.token_created_payload), and is
revoked once a `token.revoked` event says so. A token inserted by SQL has no event; one whose role or
expiry was changed by SQL differs from it.

Two uses of one comparison: every request a token authenticates is refused when its token differs
(accounts.authentication, one query through the events' object index), and the full verification
names every token that differs (a registered row check; a run's proof has no tokens).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from accounts.models import ApiToken
from audit.grants import token_created_payload

from .actions import Action
from .models import GLOBAL_CHAIN, AuditEvent
from .verify import Problem, hash_short

TOKEN_EVENTS = (Action.TOKEN_CREATED, Action.TOKEN_REVOKED)
# What a token's row must still say as its token.created event recorded it. An event written before
# a field was recorded (user_id, key_hash_sha256) binds the others.
BOUND = ("user_id", "role", "expires_at", "name", "prefix", "key_hash_sha256")
HASHES = ("key_hash_sha256",)


@dataclass(frozen=True)
class Difference:
    event: AuditEvent | None  # the event that recorded otherwise; None: no event records it
    detail: str


def _recorded_form(payload: dict[str, Any]) -> dict[str, Any]:
    """A payload as its event stores it (datetimes as DjangoJSONEncoder writes them)."""
    return json.loads(json.dumps(payload, cls=DjangoJSONEncoder))  # type: ignore[no-any-return]


def _shown(field: str, value: Any) -> Any:
    return hash_short(value) if field in HASHES and isinstance(value, str) else value


def token_differences(token: ApiToken, events: list[AuditEvent]) -> Iterator[Difference]:
    """How `token`'s row differs from its events (`events`: its token.created and token.revoked)."""
    named = f"token {token.prefix}… (id {token.pk}) of {token.user.get_username()}"
    created = next((e for e in events if e.action == Action.TOKEN_CREATED), None)
    if created is None:
        yield Difference(
            None, f"{named} carries the role {token.role}, but no token.created event records it"
        )
        return
    now = _recorded_form(token_created_payload(token))
    for field in BOUND:
        if field in created.payload and created.payload[field] != now[field]:
            yield Difference(
                created,
                f"{named}: its {field} is {_shown(field, now[field])!r} in its row; this token.created"
                f" event recorded {_shown(field, created.payload[field])!r}",
            )
    revoked = next((e for e in events if e.action == Action.TOKEN_REVOKED), None)
    if revoked is not None and token.revoked_at is None:
        yield Difference(revoked, f"{named} is not revoked in its row; this token.revoked event revoked it")
    if revoked is None and token.revoked_at is not None:
        yield Difference(
            created,
            f"{named} is revoked in its row ({token.revoked_at:%Y-%m-%d %H:%M} UTC), but no token.revoked event records it",
        )


def _events() -> Any:
    """Every token's events, in order (one token's: filter by object_id, which the index serves)."""
    return (
        AuditEvent.objects.filter(
            chain=GLOBAL_CHAIN, object_type=ApiToken._meta.model_name, action__in=TOKEN_EVENTS
        )
        .only("pk", "chain", "seq", "action", "object_id", "payload")
        .order_by("id")
    )


def token_refusal(token: ApiToken) -> str | None:
    """Registered with accounts.authentication: why `token` may not authenticate for its record, or
    None. One query, through the events' (object_type, object_id) index."""
    events = list(_events().filter(object_id=str(token.pk)))
    if next(token_differences(token, events), None) is None:
        return None
    return "this token is not the one the audit record describes; make a new one at /audit/tokens/"


def token_rows_problems(chains: list[str] | None) -> Iterator[Problem]:
    """The registered row check: every token against its events (full verification only)."""
    if chains is not None:
        return
    recorded: dict[str, list[AuditEvent]] = defaultdict(list)
    for event in _events().iterator(chunk_size=1000):
        recorded[event.object_id].append(event)
    for token in ApiToken.objects.select_related("user").order_by("pk").iterator(chunk_size=1000):
        for difference in token_differences(token, recorded[str(token.pk)]):
            event = difference.event
            yield Problem(
                "token",
                event.pk if event else None,
                GLOBAL_CHAIN,
                event.seq if event else None,
                difference.detail,
            )
