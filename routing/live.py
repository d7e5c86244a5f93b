"""Live updates: small events sent to browsers after commit, over Channels.

Each event carries the run's audit-chain sequence number: strictly increasing per run and gap-free,
so a page that sees a gap (or reconnects) knows it missed something and re-reads the task over REST.
PostgreSQL stays the source of truth; a lost live event costs a re-read, never a wrong page.
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

from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

# Events waiting for the publisher; beyond this many the oldest are dropped (a page that misses one
# sees the gap in its sequence and re-reads), so a channel layer that is down never grows memory.
MAX_PENDING = 10_000
# How long the publisher lets events gather once one is queued: the events of the next few commits go
# in the same batch (one wake-up of its thread and one Redis round trip for all of them, not one each),
# for a few milliseconds more between a commit and the pages.
LINGER_S = 0.005


def task_group(task_id: Any) -> str:
    return f"task.{task_id}"


def publish_on_commit(*, task_id: Any, events: list[dict[str, Any]]) -> None:
    """Send `events` to the task's watchers once the current transaction commits (never before).

    The step path only queues them: one publisher thread per process sends the queued events, in
    order, over one event loop that keeps its channel-layer connection.
    """

    def queue() -> None:
        for event in events:
            publish(task_id=task_id, event=event)

    transaction.on_commit(queue)


def publish(*, task_id: Any, event: dict[str, Any]) -> None:
    """Queue `event` for the task's watchers now (outside a transaction: what publish_on_commit does
    once the transaction commits)."""
    _publisher().put(task_group(task_id), event)


def flush(timeout_s: float = 10.0) -> bool:
    """Wait until every queued event has been sent (tests, a process about to exit); a process that
    never published has nothing to wait for."""
    found = _state.get(os.getpid())
    return found.flush(timeout_s) if found is not None else True


class _Publisher:
    def __init__(self) -> None:
        self.pending: collections.deque[tuple[str, dict[str, Any]]] = collections.deque(maxlen=MAX_PENDING)
        self.wake = threading.Condition()
        self.busy = False
        self.dropped = 0
        self.members: list[Any] | None = None  # a Redis client per host of the layer, for `watched`
        self.thread = threading.Thread(target=self._run, name="live-publisher", daemon=True)
        self.thread.start()

    def put(self, group: str, event: dict[str, Any]) -> None:
        # sent_at: wall-clock time right after the commit, so a watcher can measure commit-to-screen latency.
        with self.wake:
            if len(self.pending) == MAX_PENDING:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("live events are not being sent fast enough; %d dropped", self.dropped)
            self.pending.append((group, {"type": "run.event", "event": {**event, "sent_at": time.time()}}))
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

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            with self.wake:
                while not self.pending:
                    self.wake.wait()
                self.busy = True
            time.sleep(LINGER_S)
            with self.wake:
                batch = list(self.pending)
                self.pending.clear()
            try:
                layer = get_channel_layer()
                if layer is None:
                    continue
                try:
                    watched = self.watched(layer, {group for group, _ in batch})
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

    def watched(self, layer: Any, groups: set[str]) -> set[str] | None:
        """Of these groups, those with a member, asked of Redis in one round trip per Redis host, on
        this thread's own connections (no event loop: most batches need none). None: not a Redis
        layer of plain addresses, send to all. Most tasks run with nobody watching: channels-redis's
        group_send makes two round trips to learn that, for each event. A group found empty here has no
        member that group_send would have sent to (a watcher who joins just after sees the gap in the
        run's sequence, or reads the task as it connects)."""
        from channels_redis.core import RedisChannelLayer

        if type(layer) is not RedisChannelLayer or not all("address" in host for host in layer.hosts):
            return None
        if self.members is None:
            import redis

            self.members = [
                redis.Redis.from_url(host["address"], **{k: v for k, v in host.items() if k != "address"})
                for host in layer.hosts
            ]
        by_host: dict[int, list[str]] = {}
        for group in groups:
            by_host.setdefault(layer.consistent_hash(group), []).append(group)
        found = set()
        for host, hosted in by_host.items():
            pipe = self.members[host].pipeline(transaction=False)
            for group in hosted:
                pipe.zcard(layer._group_key(group))
            found.update(group for group, count in zip(hosted, pipe.execute(), strict=True) if count)
        return found


async def _send_all(layer: Any, batch: list[tuple[str, dict[str, Any]]]) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

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
