"""The ASGI application (daphne): HTTP through Django, websockets through Channels with login and origin checks."""

import os

from django.core.asgi import get_asgi_application

from conductor_web.embedded import start_unless_set

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")
start_unless_set()

django_asgi_app = get_asgi_application()

# Django must be set up before these imports.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from operations.live.routes import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
