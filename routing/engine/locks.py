"""The run's lock: a PostgreSQL advisory lock held on a connection of its own for the life of an
execution (the lock dies with the process), the connections kept for it between runs, and the keeper
whose heartbeat proves the lock alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from .execution import RunExecution

log = logging.getLogger(__name__)


ADVISORY_LOCK_NAMESPACE = 0x436F6E64  # "Cond": keeps run locks apart from other advisory locks


class LockConnection:
    """A connection that holds advisory locks, kept between locks (a connection is a PostgreSQL
    backend, and opening one for each run cost more than a step).

    `release_later`: the lock it holds guards something over for good (a run that ended); it is let go
    with the next lock the connection takes, in that statement (`pending_unlock`), or with the
    connection, rather than in a round trip of its own."""

    def __init__(self, params: dict[str, Any], key: str) -> None:
        self.conn = psycopg.connect(**params, autocommit=True)
        self.key = key  # the database it connects to (LockConnections keeps connections by it)
        self.release_later = False
        self.pending_unlock: tuple[int, int] | None = None

    @property
    def closed(self) -> bool:
        return bool(self.conn.closed)

    def idle(self) -> bool:
        """Open, and in no transaction: fit to hand out again."""
        return not self.conn.closed and self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def close(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.conn.close()

    def try_lock(self, namespace: int, key: int) -> bool:
        """Take the lock if no other session holds it (letting go of a pending one in the same statement)."""
        pending, self.pending_unlock = self.pending_unlock, None
        if pending is None:
            return self._call("pg_try_advisory_lock", namespace, key)
        row = self.conn.execute(
            "SELECT pg_advisory_unlock(%(old_namespace)s, %(old_key)s), "
            "pg_try_advisory_lock(%(namespace)s, %(key)s)",
            {"old_namespace": pending[0], "old_key": pending[1], "namespace": namespace, "key": key},
        ).fetchone()
        return bool(row and row[1])

    def unlock(self, namespace: int, key: int) -> bool:
        return self._call("pg_advisory_unlock", namespace, key)

    def _call(self, function: str, namespace: int, key: int) -> bool:
        row = self.conn.execute(
            f"SELECT {function}(%(namespace)s, %(key)s)",  # noqa: S608 - a function's name
            {"namespace": namespace, "key": key},
        ).fetchone()
        return bool(row and row[0])


class LockConnections:
    """The process's kept lock connections. A connection goes back only when its lock was released
    cleanly; one that died (the run's keeper saw it, or its server ended it) is dropped."""

    KEEP = 4

    def __init__(self) -> None:
        self._idle: dict[str, list[LockConnection]] = {}
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._inherited: list[dict[str, list[LockConnection]]] = []

    def take(self, params: dict[str, Any], *, fresh: bool = False) -> LockConnection:
        """A kept connection to the database `params` name, or (none kept, or `fresh`) a new one."""
        key = repr(sorted(params.items()))
        kept = None
        with self._mutex:
            if self._pid != os.getpid():  # a forked child: the parent's connections are not its own
                # Kept, never closed here: closing would end the parent's sessions on the server.
                self._inherited.append(self._idle)
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get(key) or []
            if idle and not fresh:
                kept = idle.pop()
        if kept is not None:
            if kept.idle():
                return kept
            kept.close()  # not usable: not handed out, not left to the garbage collector
        return LockConnection(params, key)

    def give(self, lock: LockConnection) -> None:
        with self._mutex:
            idle = self._idle.setdefault(lock.key, [])
            if len(idle) < self.KEEP and self._pid == os.getpid():
                idle.append(lock)
                return
        lock.close()

    def close_all(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, {}
        for locks in idle.values():
            for lock in locks:
                lock.close()


LOCK_CONNECTIONS = LockConnections()


@contextmanager
def advisory_lock_connection(namespace: int, key: int) -> Iterator[LockConnection | None]:
    """Hold an advisory lock on a connection of its own (the lock dies with the process); yields that
    connection, or None if another process holds the lock."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    lock = LOCK_CONNECTIONS.take(params)
    try:
        acquired = lock.try_lock(namespace, key)
    except psycopg.OperationalError:  # a kept connection the server ended meanwhile: a new one
        lock.close()  # whatever it held goes with it
        lock = LOCK_CONNECTIONS.take(params, fresh=True)
        acquired = lock.try_lock(namespace, key)
    released = not acquired
    try:
        yield lock if acquired else None
    finally:
        if acquired and not lock.closed and lock.release_later:
            lock.release_later = False
            lock.pending_unlock = (namespace, key)  # let go with the next lock, or the connection
            released = True
        elif acquired and not lock.closed:
            with contextlib.suppress(psycopg.Error):  # a dead connection took the lock with it
                released = lock.unlock(namespace, key)
        if released and not lock.closed:
            LOCK_CONNECTIONS.give(lock)
        else:
            lock.close()


@contextmanager
def advisory_lock(namespace: int, key: int) -> Iterator[bool]:
    """Hold an advisory lock on a connection of its own; yields False if another process holds it."""
    with advisory_lock_connection(namespace, key) as lock:
        yield lock is not None


def run_lock(run_id: int) -> AbstractContextManager[LockConnection | None]:
    """The run's lock: one process executes a run at a time. Yields the lock's connection, or None."""
    return advisory_lock_connection(ADVISORY_LOCK_NAMESPACE, run_id)


def advisory_locked(namespace: int, key: int) -> bool:
    """Whether another process holds the lock (probed by taking it for a moment)."""
    with advisory_lock(namespace, key) as acquired:
        return not acquired


def run_is_locked(run_id: int) -> bool:
    """Whether another process holds the run's lock. For a run not ended: a run that ended may keep
    its lock a while on the connection of the process that ended it (LockConnection.release_later)."""
    return advisory_locked(ADVISORY_LOCK_NAMESPACE, run_id)


class Keeper:
    """Keeps the lock's connection busy and watched: every CONDUCTOR_HEARTBEAT_S it writes the run's
    heartbeat through it, fenced by the claim epoch. If the connection dies (an idle-session timeout, a
    reaper, a restart) the lock is gone with it: the execution's `claim_lost` is set and the engine
    stops before its next write or call. The beats are sent by the process's one heartbeat thread
    (HEARTBEATS): a thread started for each run cost more than the run's own writes."""

    def __init__(self, lock: LockConnection, execution: RunExecution):
        self.lock, self.execution = lock, execution
        self.using = threading.Lock()  # a beat and the lock's release never share the connection
        self.done = False
        self.due = 0.0

    def __enter__(self) -> Keeper:
        HEARTBEATS.add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        HEARTBEATS.remove(self)
        with self.using:  # a beat being sent ends first: the connection is the lock's again
            self.done = True

    def beat(self) -> None:
        run, lost = self.execution.run, self.execution.claim_lost
        with self.using:
            if self.done or lost.is_set():
                return
            try:
                updated = self.lock.conn.execute(
                    "UPDATE routing_run SET heartbeat_at = now() WHERE id = %(run_id)s AND claim_epoch = %(epoch)s",
                    {"run_id": run.pk, "epoch": run.claim_epoch},
                ).rowcount
            except psycopg.Error:
                updated = 0
            if not updated:
                log.warning("run %s: the run lock or the claim was lost; stopping", run.pk)
                lost.set()


class Heartbeats:
    """The process's heartbeat thread: beats each run this process holds every CONDUCTOR_HEARTBEAT_S
    (its first beat that long after its claim). Started with the first run, and again if it ever
    stopped, or in a forked child (a thread does not survive a fork)."""

    def __init__(self) -> None:
        self._forked()

    def _forked(self) -> None:
        """Afresh (in a forked child, its parent's thread, runs and lock are not its own)."""
        self._keepers: set[Keeper] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, keeper: Keeper) -> None:
        with self._changed:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="run-heartbeats", daemon=True)
                self._thread.start()
            keeper.due = time.monotonic() + settings.CONDUCTOR_HEARTBEAT_S
            self._keepers.add(keeper)
            self._changed.notify()

    def remove(self, keeper: Keeper) -> None:
        with self._changed:
            self._keepers.discard(keeper)

    def _beat(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [k for k in self._keepers if k.due <= now]
                for keeper in due:
                    keeper.due = now + settings.CONDUCTOR_HEARTBEAT_S
                wake = min((k.due for k in self._keepers), default=now + settings.CONDUCTOR_HEARTBEAT_S)
                if not due:
                    self._changed.wait(max(0.0, wake - now))
                    continue
            for keeper in due:  # outside the mutex: a slow beat does not hold up claims and releases
                try:
                    keeper.beat()
                except Exception:  # a bug in one beat must not stop the others' (nor later runs')
                    log.exception("run %s: its heartbeat failed", keeper.execution.run.pk)


HEARTBEATS = Heartbeats()
os.register_at_fork(after_in_child=HEARTBEATS._forked)
