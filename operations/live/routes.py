"""Websocket URLs: a task's live events; any other path is refused at the handshake (not a 500)."""

from django.urls import path, re_path

from operations.live.consumers import NoSuchSocket, TaskEventsConsumer

websocket_urlpatterns = [
    path("ws/tasks/<str:task_id>/", TaskEventsConsumer.as_asgi()),
    re_path(r"", NoSuchSocket.as_asgi()),
]
