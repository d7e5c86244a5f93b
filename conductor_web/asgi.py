import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (Django must be set up first)

application = ProtocolTypeRouter({"http": django_asgi_app})
