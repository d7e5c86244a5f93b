"""Roles: auditor (read everything, export, change nothing), operator (submit, manage the pool),
ML staff (datasets, training, promotion), admin (everything). A user's roles are the Django groups of
the same names (superusers are admins); an API token carries one role, at most its user's.

The checks here only read. Granting a role is audit.grants.user_set_roles, recorded by audit."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission

from .models import ApiToken, Role

EVERYONE = (Role.AUDITOR, Role.OPERATOR, Role.ML_STAFF, Role.ADMIN)
AUDIT_ROLES = (Role.AUDITOR,)  # the auditors' pages (admin passes every role check)


def recorded_user(user: Any) -> Any:
    """The user a row records as its author: None for an anonymous caller or a service."""
    return user if getattr(user, "is_authenticated", False) else None


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
