"""Who may do what, against the events that record it: each user's roles (its groups that are roles)
and its `is_active`, `is_staff` and `is_superuser` flags, replayed from the global chain's user and
group events (audit.user_events, grant_role), compared with `auth_user`, `auth_user_groups` and
`auth_group` as they are. A grant made by SQL (`INSERT INTO auth_user_groups ...`, `UPDATE auth_user
SET is_superuser = true`) writes no event, and is named here.

A registered row check: it runs in the full verification only (a run's proof has no users).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q

from accounts.models import Role

from .actions import Action
from .models import GLOBAL_CHAIN, AuditEvent
from .user_events import FLAGS
from .verify import Problem

ROLES = frozenset(Role.values)
_EVENTS = (
    Action.USER_CREATED,
    Action.USER_DELETED,
    Action.USER_FLAGS_CHANGED,
    Action.USER_GROUPS_CHANGED,
    Action.USER_ROLES_SET,
    Action.GROUP_RENAMED,
    Action.GROUP_DELETED,
)


class _Recorded:
    """A user's roles and flags as the events say, and the last event that said so."""

    def __init__(self, event: AuditEvent):
        self.flags: dict[str, Any] = {f: event.payload.get(f) for f in FLAGS}
        self.roles: set[str] = set()
        self.event = event


def recorded_grants() -> dict[str, _Recorded]:
    """Each user's roles and flags (by user id) from the global chain's events, in order."""
    users: dict[str, _Recorded] = {}
    events = (
        AuditEvent.objects.filter(chain=GLOBAL_CHAIN, action__in=_EVENTS)
        .only("pk", "chain", "seq", "action", "object_id", "payload")
        .order_by("seq")
    )
    for event in events.iterator(chunk_size=1000):
        p, user = event.payload, users.get(event.object_id)
        if event.action == Action.USER_CREATED:
            users[event.object_id] = _Recorded(event)
        elif event.action == Action.USER_DELETED:
            users.pop(event.object_id, None)
        elif event.action == Action.GROUP_RENAMED:
            for known in users.values():
                if p.get("from") in known.roles:
                    known.roles.discard(p["from"])
                    known.roles.add(p.get("to"))
        elif event.action == Action.GROUP_DELETED:
            for known in users.values():
                known.roles.discard(p.get("name"))
        elif user is None:
            continue  # a user created before its events were recorded: compared with nothing
        elif event.action == Action.USER_FLAGS_CHANGED:
            for flag, (_, after) in (p.get("changed") or {}).items():
                user.flags[flag] = after
            user.event = event
        elif event.action == Action.USER_GROUPS_CHANGED:
            user.roles = set(p.get("groups") or []) & ROLES
            user.event = event
        elif event.action == Action.USER_ROLES_SET:
            user.roles = set(p.get("roles") or []) & ROLES
            user.event = event
    return users


def grants_problems(chains: list[str] | None) -> Iterator[Problem]:
    """The registered check: every user's roles and flags against the events (full verification only)."""
    if chains is not None:
        return
    recorded = recorded_grants()
    model = get_user_model()
    users = model.objects.filter(
        Q(groups__name__in=ROLES)
        | Q(is_staff=True)
        | Q(is_superuser=True)
        | Q(pk__in=[int(k) for k in recorded if k.isdigit()])
    )
    for user in users.distinct().prefetch_related("groups").order_by("pk"):
        known = recorded.get(str(user.pk))
        roles = {g.name for g in user.groups.all()} & ROLES
        if known is None:
            if roles or user.is_staff or user.is_superuser:
                yield Problem(
                    "grant",
                    None,
                    GLOBAL_CHAIN,
                    None,
                    f"user {user.get_username()} (id {user.pk}) holds {_held(roles, user)}, but no user.created event records it",
                )
            continue
        event = known.event
        if roles != known.roles:
            yield Problem(
                "grant",
                event.pk,
                GLOBAL_CHAIN,
                event.seq,
                f"user {user.get_username()}'s roles are {sorted(roles)} in auth_user_groups; the events record {sorted(known.roles)}",
            )
        for flag in FLAGS:
            if known.flags.get(flag) is not None and getattr(user, flag) != known.flags[flag]:
                yield Problem(
                    "grant",
                    event.pk,
                    GLOBAL_CHAIN,
                    event.seq,
                    f"user {user.get_username()}'s {flag} is {getattr(user, flag)} in auth_user; the events record {known.flags[flag]}",
                )


def _held(roles: set[str], user: Any) -> str:
    flags = [f for f in ("is_staff", "is_superuser") if getattr(user, f)]
    return ", ".join([*(f"role {r}" for r in sorted(roles)), *flags])
