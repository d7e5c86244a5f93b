"""A watcher's websocket stays up while nothing happens, through the real Redis channel layer.

channels-redis waits for a message with a blocking pop (BZPOPMIN) that returns after
`RedisChannelLayer.brpop_timeout` seconds when nothing came; redis-py 8 gives every connection a
5 s socket timeout unless told otherwise. A read timeout no longer than the blocking pop makes the
idle wait raise `redis.exceptions.TimeoutError`, which would kill the consumer and close the
socket, dropping pages every few seconds; the test holds a socket idle past two pops. With
DATABASE_URL/REDIS_URL unset (how the suite runs) the layer talks to the embedded Redis over its
Unix socket.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.conf import settings

from accounts.models import Role
from routing import live_events
from tests.operations.test_live import communicator, session_headers

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_S = 12  # two blocking pops and more: past a 5 s socket timeout


def test_the_channel_layer_reads_for_longer_than_its_blocking_pop():
    hosts = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    layer = get_channel_layer()
    assert isinstance(layer, RedisChannelLayer)
    for pool_kwargs in hosts:
        timeout = pool_kwargs.get("socket_timeout") if isinstance(pool_kwargs, dict) else None
        assert timeout is not None, f"{pool_kwargs!r} leaves redis-py's default socket timeout"
        assert timeout > layer.brpop_timeout


def test_an_idle_websocket_stays_connected_and_still_receives_events(make_user):
    assert settings.REDIS_URL.startswith("unix://"), "meant for the embedded Redis (a Unix socket)"
    make_user("ivy", Role.AUDITOR)
    headers = session_headers("ivy")
    task_id = uuid.uuid4()  # the group is all that matters here

    def publish() -> None:
        live_events.publish(task_id=task_id, event={"run": 1, "seq": 7, "action": "test.after_idle"})
        assert live_events.flush()

    async def scenario():
        ws = communicator(task_id, headers)
        connected, _ = await ws.connect()
        assert connected
        try:
            # receive_nothing re-raises what the application raised (the TimeoutError of the bug)
            # and reports a close frame as output.
            loop = asyncio.get_running_loop()
            started = loop.time()
            quiet = await ws.receive_nothing(timeout=IDLE_S, interval=0.2)
            idle = loop.time() - started
            await sync_to_async(publish, thread_sensitive=False)()
            event = await ws.receive_json_from(timeout=5)
        finally:
            await ws.disconnect()
        return quiet, idle, event

    quiet, idle, event = async_to_sync(scenario)()
    assert quiet, "the socket sent or closed something while idle"
    assert idle >= IDLE_S - 0.5
    assert event["action"] == "test.after_idle" and event["seq"] == 7
