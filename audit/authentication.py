from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .models import ApiToken


class RoleTokenAuthentication(TokenAuthentication):
    """`Authorization: Token <key>`; the request acts with the token's role only."""

    model = ApiToken

    def authenticate_credentials(self, key):
        token = ApiToken.objects.select_related("user").filter(key=key, revoked_at__isnull=True).first()
        if token is None:
            raise AuthenticationFailed("invalid or revoked token")
        if not token.user.is_active:
            raise AuthenticationFailed("user inactive")
        return token.user, token
