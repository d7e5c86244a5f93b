"""Websocket URLs: a task's live events."""

from django.urls import path

from .consumers import TaskEventsConsumer

websocket_urlpatterns = [path("ws/tasks/<str:task_id>/", TaskEventsConsumer.as_asgi())]
