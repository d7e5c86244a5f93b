"""Roles: auditor (read everything, export, change nothing), operator (submit, manage the pool),
ML staff (datasets, training, promotion), admin (everything). A user's roles are the Django groups of
the same names (superusers are admins); an API token carries one role, at most its user's.

Here, not in utilities: `Role` and `ApiToken` are audit's models, and granting a role or making a
token is an audit event."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable
from datetime import timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from rest_framework.permissions import BasePermission

from .actions import Action
from .models import ApiToken, Role
from .services import Actor, event_record

EVERYONE = (Role.AUDITOR, Role.OPERATOR, Role.ML_STAFF, Role.ADMIN)
AUDIT_ROLES = (Role.AUDITOR,)  # the auditors' pages (admin passes every role check)


def user_roles(user: Any) -> set[str]:
    if user is None or not user.is_authenticated or not user.is_active:
        return set()
    if user.is_superuser:
        return set(Role.values)
    names = {g.name for g in user.groups.all()}
    return names & set(Role.values)


def request_roles(request: Any) -> set[str]:
    """The roles this request acts with: a role token narrows its user's roles to the token's role."""
    cached = getattr(request, "_conductor_roles", None)
    if cached is not None:
        return cached
    roles = user_roles(request.user)
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken):
        roles = {auth.role} & roles
    request._conductor_roles = roles
    return roles


def has_role(request: Any, roles: Iterable[str]) -> bool:
    held = request_roles(request)
    return Role.ADMIN in held or bool(held & set(roles))


def role_required(*roles: str) -> Callable:
    """View decorator: log in first, then one of `roles` (admins always pass), else 403."""

    def decorator(view: Callable) -> Callable:
        @login_required
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not has_role(request, roles):
                raise PermissionDenied(f"this page needs one of the roles: {', '.join(roles)}")
            return view(request, *args, **kwargs)

        wrapped.required_roles = roles  # type: ignore[attr-defined]
        return wrapped

    return decorator


class HasRole(BasePermission):
    """DRF permission: the view declares `required_roles` = {"GET": (...), "POST": (...)}."""

    message = "your role does not allow this"

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        declared = getattr(view, "required_roles", {})
        # A method a view did not list: reads are open to every role, writes to admins only.
        default = EVERYONE if request.method in ("GET", "HEAD", "OPTIONS") else (Role.ADMIN,)
        return has_role(request, declared.get(request.method, default))


def user_set_roles(*, user: Any, roles: Iterable[str]) -> None:
    wanted = set(roles)
    unknown = wanted - set(Role.values)
    if unknown:
        raise ValueError(f"unknown roles: {sorted(unknown)}")
    with transaction.atomic():
        groups = [Group.objects.get_or_create(name=name)[0] for name in sorted(wanted)]
        user.groups.remove(*Group.objects.filter(name__in=Role.values).exclude(name__in=wanted))
        user.groups.add(*groups)


# --- API tokens -----------------------------------------------------------------------------------
# A token is "cw_" and 43 URL-safe characters (256 random bits). The database keeps its sha256 and its
# first TOKEN_PREFIX_CHARS characters, never the token: whoever reads the database (a backup, a replica,
# the admin site) cannot use a token they find there.

TOKEN_MARK = "cw_"  # noqa: S105  (a marker, not a secret)
TOKEN_PREFIX_CHARS = 10


def token_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


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
    key = TOKEN_MARK + secrets.token_urlsafe(32)
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
            payload={
                "user": user.get_username(),
                "role": role,
                "name": name,
                "prefix": token.prefix,
                "expires_at": token.expires_at,
            },
        )
    token.key = key  # type: ignore[attr-defined]  # the one time it is known
    return token


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


def tokens_visible(user: Any):
    """The tokens `user` may see and revoke: its own; every token for the admin role."""
    qs = ApiToken.objects.select_related("user")
    return qs if Role.ADMIN in user_roles(user) else qs.filter(user=user)
