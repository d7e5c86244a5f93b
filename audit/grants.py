"""Granting roles and making or revoking API tokens: each is an audit event, written in the
transaction of the change. The roles themselves, the checks views make with them and the tokens'
keys are accounts' (accounts.roles, accounts.tokens); this module records who changed them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken, Role
from accounts.roles import user_roles
from accounts.tokens import TOKEN_PREFIX_CHARS, token_hash, token_key_new
from audit.actions import Action
from audit.services import Actor, event_record


def user_set_roles(*, user: Any, roles: Iterable[str]) -> None:
    """Give `user` exactly `roles` (its groups of those names). audit.user_events records the change
    in this transaction."""
    wanted = set(roles)
    unknown = wanted - set(Role.values)
    if unknown:
        raise ValueError(f"unknown roles: {sorted(unknown)}")
    with transaction.atomic():
        groups = [Group.objects.get_or_create(name=name)[0] for name in sorted(wanted)]
        user.groups.remove(*Group.objects.filter(name__in=Role.values).exclude(name__in=wanted))
        user.groups.add(*groups)


# --- API tokens -----------------------------------------------------------------------------------


def token_create(
    *, user: Any, role: str, name: str = "", days: int | None = None, actor: Any = None
) -> ApiToken:
    """Make an API token carrying `role` (one of the user's) for `days` (API_TOKEN_DEFAULT_DAYS unless
    given; at most API_TOKEN_MAX_DAYS); audited as `token.created` by `actor` (the user, unless given).

    Returns the saved row with the token itself in `.key`: on this object only, never stored, so it
    can be shown once. A row read back from the database has no `.key`."""

    if role not in user_roles(user):
        raise ValueError(f"{user} does not hold the role {role!r}")
    days = settings.API_TOKEN_DEFAULT_DAYS if days is None else days
    if not 1 <= days <= settings.API_TOKEN_MAX_DAYS:
        raise ValueError(f"a token lasts 1 to {settings.API_TOKEN_MAX_DAYS} days, not {days}")
    key = token_key_new()
    with transaction.atomic():
        token = ApiToken.objects.create(
            key_hash=token_hash(key),
            prefix=key[:TOKEN_PREFIX_CHARS],
            user=user,
            role=role,
            name=name,
            expires_at=timezone.now() + timedelta(days=days),
        )
        event_record(
            actor=actor or Actor.for_user(user),
            action=Action.TOKEN_CREATED,
            obj=token,
            payload=token_created_payload(token),
        )
    token.key = key  # type: ignore[attr-defined]  # the one time it is known
    return token


def token_created_payload(token: ApiToken) -> dict[str, Any]:
    """What `token.created` records of a token: the one definition, which verification and every
    request the token authenticates compare its row with (audit.token_check). Its key by the hash of
    its stored hash, so that the record names no value found in the table."""
    return {
        "user": token.user.get_username(),
        "user_id": token.user_id,
        "role": token.role,
        "name": token.name,
        "prefix": token.prefix,
        "expires_at": token.expires_at,
        "key_hash_sha256": hashlib.sha256(token.key_hash.encode()).hexdigest(),
    }


def token_revoke(*, token: ApiToken, actor: Any) -> bool:
    """Revoke a token (audited as `token.revoked`); False when it was revoked already."""

    with transaction.atomic():
        row = ApiToken.objects.select_for_update().select_related("user").get(pk=token.pk)
        if row.revoked_at is not None:
            return False
        row.revoked_at = timezone.now()
        row.revoked_by = actor.name
        row.save(update_fields=["revoked_at", "revoked_by"])
        event_record(
            actor=actor,
            action=Action.TOKEN_REVOKED,
            obj=row,
            payload={
                "user": row.user.get_username(),
                "role": row.role,
                "name": row.name,
                "prefix": row.prefix,
            },
        )
    token.revoked_at, token.revoked_by = row.revoked_at, row.revoked_by
    return True
