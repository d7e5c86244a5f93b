"""Live updates: small events sent to browsers after commit, over Channels.

Each event carries the run's audit-chain sequence number: strictly increasing per run and gap-free,
so a page that sees a gap (or reconnects) knows it missed something and re-reads the task over REST.
PostgreSQL stays the source of truth; a lost live event costs a re-read, never a wrong page.

Most tasks run with nobody watching. A watcher joins its task's group with `watch` (the websocket
consumer does, before it accepts the socket, so before its page's first read), which also announces it
on the layer's watch channel; every process that publishes listens there (`_Watchers`), so an event of
a task nobody watches is dropped where it is made, without a word to Redis.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import os
import threading
import time
from typing import Any

import redis
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer
from django.db import transaction
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)

# Events waiting for the publisher; beyond this many the oldest are dropped (a page that misses one
# sees the gap in its sequence and re-reads), so a channel layer that is down never grows memory.
MAX_PENDING = 10_000
# How long the publisher lets events gather once one is queued: the events of the next few commits go
# in the same batch (one wake-up of its thread and one Redis round trip for all of them, not one each),
# for a few milliseconds more between a commit and the pages.
LINGER_S = 0.005
# Where watchers announce themselves ("+group" on joining, "-group" on leaving), on their group's host.
WATCH_CHANNEL = "live-watch"
# After the watch channel was lost (or never reached): how long the publisher asks Redis per batch
# (as it does for every batch while it does not listen) before it listens again.
RELISTEN_S = 5.0


def task_group(task_id: Any) -> str:
    return f"task.{task_id}"


def publish_on_commit(*, task_id: Any, events: list[dict[str, Any]]) -> None:
    """Send `events` to the task's watchers once the current transaction commits (never before).

    The step path only queues them, and only for a task someone watches: one publisher thread per
    process sends the queued events, in order, over one event loop that keeps its channel-layer
    connection.
    """
    transaction.on_commit(lambda: _publisher().put(task_group(task_id), events))


def publish(*, task_id: Any, event: dict[str, Any]) -> None:
    """Queue `event` for the task's watchers now (outside a transaction: what publish_on_commit does
    once the transaction commits)."""
    _publisher().put(task_group(task_id), [event])


async def watch(layer: Any, group: str, channel: str) -> None:
    """Add `channel` to `group` and tell the publishers that the group has a watcher. Call it before
    the watcher reads what it follows: an event committed after that read reaches it."""
    await layer.group_add(group, channel)
    await _announce(layer, b"+", group)


async def unwatch(layer: Any, group: str, channel: str) -> None:
    """Remove `channel` from `group` and tell the publishers (who keep the group while it has another)."""
    await layer.group_discard(group, channel)
    await _announce(layer, b"-", group)


def _plain_redis(layer: Any) -> bool:
    """A channels-redis layer of plain Redis addresses: the one whose groups the publishers can follow."""
    return type(layer) is RedisChannelLayer and all("address" in host for host in layer.hosts)


def _watch_channel(layer: Any) -> str:
    return f"{layer.prefix}:{WATCH_CHANNEL}"


async def _announce(layer: Any, sign: bytes, group: str) -> None:
    if _plain_redis(layer):
        host = layer.connection(layer.consistent_hash(group))
        await host.publish(_watch_channel(layer), sign + group.encode())


def flush(timeout_s: float = 10.0) -> bool:
    """Wait until every queued event has been sent (tests, a process about to exit); a process that
    never published has nothing to wait for."""
    found = _state.get(os.getpid())
    return found.flush(timeout_s) if found is not None else True


class _Watchers:
    """The groups with a watcher, known by listening on the layer's watch channel (on every host) after
    listing the groups once: what `watch` and `unwatch` announce keeps it up to date. `known` is None
    while it is not listening (before it first listens, after the channel was lost): then the
    publisher asks it (`ask`) for each batch instead. Used under the publisher's lock, but for
    `subscribe` and `ask`, which only read (on the publisher's thread)."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        # A plain Redis client per host of the layer (the publisher's own connections: no event loop).
        self.clients = [
            redis.Redis.from_url(
                host["address"],
                **{"socket_connect_timeout": 5, "health_check_interval": 30}
                | {k: v for k, v in host.items() if k != "address"},
            )
            for host in layer.hosts
        ]
        self.groups: set[str] | None = None
        self.subscriptions: list[Any] = []
        self.listen_after = 0.0  # monotonic time of the next try to listen

    def due(self) -> bool:
        return self.groups is None and time.monotonic() >= self.listen_after

    def subscribe(self) -> tuple[list[Any], set[str]]:
        """Listen on every host, then list the groups that have members (in that order: a watcher who
        joins meanwhile is in the list or in a message). Blocking: the publisher's thread calls it,
        outside the lock; `start` puts its result in place."""
        subscriptions: list[Any] = []
        try:
            for client in self.clients:
                subscription = client.pubsub()
                subscriptions.append(subscription)
                subscription.subscribe(_watch_channel(self.layer))
                confirmed = subscription.get_message(timeout=5.0)
                if not confirmed or confirmed["type"] != "subscribe":
                    raise ConnectionError("no confirmation of the subscription to the live watch channel")
                # redis-py reconnects a subscription by itself: what was said meanwhile is lost, so the
                # groups are listed again (the callback must be a bound method: it is held weakly).
                subscription.connection.register_connect_callback(self._reconnected)
            prefix = self.layer._group_key("")
            pattern = prefix.replace(b"[", b"\\[").replace(b"*", b"\\*").replace(b"?", b"\\?") + b"*"
            groups = {
                key[len(prefix) :].decode()
                for client in self.clients
                for key in client.scan_iter(match=pattern, count=1000)
            }
        except BaseException:
            for subscription in subscriptions:
                subscription.close()
            raise
        return subscriptions, groups

    def start(self, subscriptions: list[Any], groups: set[str]) -> None:
        self._close()
        self.subscriptions, self.groups = subscriptions, groups

    def failed(self) -> None:
        """Not listening (any more): ask Redis per batch until the next try."""
        self._close()
        self.groups = None
        self.listen_after = time.monotonic() + RELISTEN_S

    def _close(self) -> None:
        for subscription in self.subscriptions:
            try:
                # Its connection goes back to the client's pool: it must not call back once reused.
                if subscription.connection is not None:
                    subscription.connection.deregister_connect_callback(self._reconnected)
                subscription.close()
            except Exception:  # noqa: BLE001 - closing what is already broken
                log.debug("closing a live watch subscription", exc_info=True)
        self.subscriptions = []

    def _reconnected(self, connection: Any) -> None:
        if any(subscription.connection is connection for subscription in self.subscriptions):
            self.groups = None  # listed again by the publisher's thread (at once: `listen_after` passed)

    def known(self) -> set[str] | None:
        """The groups with a watcher, after what has been announced so far (read without waiting)."""
        if self.groups is None:
            return None
        try:
            for host, subscription in enumerate(self.subscriptions):
                while (message := subscription.get_message(ignore_subscribe_messages=True)) is not None:
                    if self.groups is None:  # reconnected while reading: listed again
                        return None
                    sign, group = message["data"][:1], message["data"][1:].decode()
                    if sign == b"+":
                        self.groups.add(group)
                    elif not self.clients[host].exists(self.layer._group_key(group)):
                        self.groups.discard(group)  # its last watcher left (another may remain)
        except Exception:  # noqa: BLE001 - a live update must never fail anything: ask Redis instead
            log.warning("lost the live watch channel; asking Redis for each batch meanwhile", exc_info=True)
            self.failed()
        return self.groups

    def ask(self, groups: set[str]) -> set[str]:
        """Of these groups, those with a member, asked of Redis in one pipelined round trip per host
        (while not listening). A group found empty has no member that group_send would have sent to
        (a watcher who joins just after reads the task as it connects)."""
        by_host: dict[int, list[str]] = {}
        for group in groups:
            by_host.setdefault(self.layer.consistent_hash(group), []).append(group)
        found: set[str] = set()
        for host, hosted in by_host.items():
            pipe = self.clients[host].pipeline(transaction=False)
            for group in hosted:
                pipe.zcard(self.layer._group_key(group))
            found.update(group for group, count in zip(hosted, pipe.execute(), strict=True) if count)
        return found


class _Publisher:
    def __init__(self) -> None:
        self.pending: collections.deque[tuple[str, dict[str, Any]]] = collections.deque(maxlen=MAX_PENDING)
        self.wake = threading.Condition()
        self.busy = False
        self.dropped = 0
        self.watchers: _Watchers | None = None
        self.thread = threading.Thread(target=self._run, name="live-publisher", daemon=True)
        self.thread.start()

    def put(self, group: str, events: list[dict[str, Any]]) -> None:
        """Queue `events` for `group`, unless the group is known to have no watcher."""
        # sent_at: wall-clock time right after the commit, so a watcher can measure commit-to-screen latency.
        sent_at = time.time()
        with self.wake:
            known = self.watchers.known() if self.watchers is not None else None
            if known is not None and group not in known:
                return  # nobody watches this task: nothing to send
            for event in events:
                if len(self.pending) == MAX_PENDING:
                    self.dropped += 1
                    if self.dropped == 1 or self.dropped % 1000 == 0:
                        log.warning("live events are not being sent fast enough; %d dropped", self.dropped)
                self.pending.append((group, {"type": "run.event", "event": {**event, "sent_at": sent_at}}))
            self.wake.notify()

    def flush(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.wake:
            while self.pending or self.busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.wake.wait(left)
        return True

    def _listen(self) -> None:
        """Start (or start again) following the groups' watchers, when it is time to."""
        with self.wake:
            if self.watchers is None or not self.watchers.due():
                return
            watchers = self.watchers
        try:
            subscriptions, groups = watchers.subscribe()
        except Exception:  # noqa: BLE001 - a live update must never fail anything: ask Redis instead
            log.warning("could not listen on the live watch channel", exc_info=True)
            with self.wake:
                watchers.failed()
            return
        with self.wake:
            watchers.start(subscriptions, groups)

    def _until_listen(self) -> float | None:
        """Seconds until the next try to listen (None: listening, or nothing to listen to)."""
        if self.watchers is None or self.watchers.groups is not None:
            return None
        return max(0.0, self.watchers.listen_after - time.monotonic())

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        layer = get_channel_layer()
        if layer is not None and _plain_redis(layer):
            with self.wake:
                self.watchers = _Watchers(layer)
        while True:
            self._listen()  # at the start, and again after the watch channel was lost
            with self.wake:
                if not self.pending:
                    self.wake.wait(self._until_listen())
                    continue
                self.busy = True
            time.sleep(LINGER_S)
            with self.wake:
                batch = list(self.pending)
                self.pending.clear()
                known = self.watchers.known() if self.watchers is not None else None
            try:
                if layer is None:
                    continue
                try:
                    # None (not a layer of plain Redis addresses): send them all; group_send finds out.
                    watched = known
                    if watched is None and self.watchers is not None:
                        watched = self.watchers.ask({group for group, _ in batch})
                except Exception:  # noqa: BLE001 - a live update must never fail anything; pages re-read on gaps
                    log.warning("could not read the live groups' members", exc_info=True)
                    watched = None
                sending = [
                    (group, message) for group, message in batch if watched is None or group in watched
                ]
                if sending:  # nobody watches the others' tasks: nothing to send for them
                    loop.run_until_complete(_send_all(layer, sending))
            finally:
                with self.wake:
                    self.busy = False
                    self.wake.notify_all()


async def _send_all(layer: Any, batch: list[tuple[str, dict[str, Any]]]) -> None:
    for group, message in batch:
        try:
            try:
                await layer.group_send(group, message)
            except RedisConnectionError:  # a connection that died while idle: its pool makes a new one
                await layer.group_send(group, message)
        except Exception:  # noqa: BLE001 - a live update must never fail anything; pages re-read on gaps
            log.warning("could not publish a live event to %s", group, exc_info=True)


_state: dict[int, _Publisher] = {}
_state_lock = threading.Lock()


def _publisher() -> _Publisher:
    """This process's publisher (a forked child starts its own: threads do not survive a fork)."""
    pid = os.getpid()
    found = _state.get(pid)
    if found is None:
        with _state_lock:
            found = _state.get(pid)
            if found is None:
                found = _state[pid] = _Publisher()
                atexit.register(found.flush, 5.0)
    return found
