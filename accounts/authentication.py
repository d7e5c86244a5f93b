"""API tokens: only their hash is stored; an expired or revoked token authenticates nobody."""

from datetime import timedelta

from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .models import ApiToken
from .tokens import token_hash

# How stale `last_used_at` may get before a request writes it again (not on every request).
LAST_USED_GRANULARITY = timedelta(minutes=1)


class RoleTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`; the request acts with the token's role only.

    Tokens are looked up by their sha256 (the database holds no token); an expired or revoked one is
    refused, saying so."""

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
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_GRANULARITY:
            # Bookkeeping for the token list (which tokens are still in use), not an audit event.
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        return token.user, token
