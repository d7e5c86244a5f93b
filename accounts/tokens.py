"""API tokens' keys and who sees which token.

A token is "cw_" and 43 URL-safe characters (256 random bits). The database keeps its sha256 and its
first TOKEN_PREFIX_CHARS characters, never the token: whoever reads the database (a backup, a replica,
the admin site) cannot use a token they find there. Making and revoking one are audit events
(audit.grants.token_create, token_revoke)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from .models import ApiToken, Role
from .roles import user_roles

TOKEN_MARK = "cw_"  # noqa: S105  (a marker, not a secret)
TOKEN_PREFIX_CHARS = 10


def token_key_new() -> str:
    return TOKEN_MARK + secrets.token_urlsafe(32)


def token_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tokens_visible(user: Any):
    """The tokens `user` may see and revoke: its own; every token for the admin role."""
    qs = ApiToken.objects.select_related("user")
    return qs if Role.ADMIN in user_roles(user) else qs.filter(user=user)
