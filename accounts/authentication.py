"""API tokens: only their hash is stored; an expired or revoked token authenticates nobody, nor one
that the audit record does not describe (a row inserted or changed behind the app's back)."""

from collections.abc import Callable
from datetime import timedelta

from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .models import ApiToken
from .tokens import token_hash

# How stale `last_used_at` may get before a request writes it again (not on every request).
LAST_USED_GRANULARITY = timedelta(minutes=1)

# Why a token is not the one its audit events describe (None: it is). The audit app, above this one,
# registers the check (audit.apps); until one is registered no token authenticates.
RecordCheck = Callable[[ApiToken], str | None]
_record_checks: list[RecordCheck] = []


def token_record_check_register(check: RecordCheck) -> RecordCheck:
    """Register a comparison of a token's row with the events that record it, run on every request
    the token authenticates: it must stay cheap (one indexed query)."""
    if check not in _record_checks:
        _record_checks.append(check)
    return check


def token_record_refusal(token: ApiToken) -> str | None:
    """The reason to refuse `token` for its record, or None."""
    if not _record_checks:
        return "no check of tokens against the audit record is installed"
    for check in _record_checks:
        reason = check(token)
        if reason:
            return reason
    return None


class RoleTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`; the request acts with the token's role only.

    Tokens are looked up by their sha256 (the database holds no token); an expired or revoked one is
    refused, saying so, and so is one whose row is not what its audit events recorded (its creation
    with its role, expiry and key; its revocation): a row written by SQL grants nothing."""

    model = ApiToken

    def authenticate_credentials(self, key):
        token = ApiToken.objects.select_related("user").filter(key_hash=token_hash(key)).first()
        if token is None:
            raise AuthenticationFailed("invalid token")
        if token.revoked_at is not None:
            raise AuthenticationFailed(
                f"this token was revoked on {token.revoked_at:%Y-%m-%d %H:%M} UTC; make a new one at /audit/tokens/"
            )
        now = timezone.now()
        if token.expires_at <= now:
            raise AuthenticationFailed(
                f"this token expired on {token.expires_at:%Y-%m-%d %H:%M} UTC; make a new one at /audit/tokens/"
            )
        if not token.user.is_active:
            raise AuthenticationFailed("user inactive")
        refusal = token_record_refusal(token)
        if refusal:
            raise AuthenticationFailed(refusal)
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_GRANULARITY:
            # Bookkeeping for the token list (which tokens are still in use), not an audit event.
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token.user, token
