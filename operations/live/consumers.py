"""WebSocket: a task's live events. Login and a role are required, as for the task's page."""

from __future__ import annotations

import uuid

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer

from accounts.roles import EVERYONE, user_roles
from routing.live_events import task_group, unwatch, watch


class TaskEventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        try:
            self.task_id = uuid.UUID(self.scope["url_route"]["kwargs"]["task_id"])
        except ValueError:
            await self.close(code=4404)
            return
        roles = await database_sync_to_async(user_roles)(user)
        if not roles & set(EVERYONE):
            await self.close(code=4403)
            return
        self.group = task_group(self.task_id)
        await watch(self.channel_layer, self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await unwatch(self.channel_layer, self.group, self.channel_name)

    async def run_event(self, message: dict) -> None:
        await self.send_json(message["event"])


class NoSuchSocket(AsyncWebsocketConsumer):
    """A websocket path that serves nothing: refused at the handshake, as an unknown task is."""

    async def connect(self) -> None:
        await self.close(code=4404)
