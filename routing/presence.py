"""A worker's presence: its main process holds an advisory lock while it lives, on a connection of its
own, so that the resume sweep can tell a run whose whole worker died (nobody is left to send it again:
send it now) from a run whose pool process died (its worker sends it again itself, after
CELERY_WORKER_LOST_WAIT). The lock goes with the process, whatever kills it."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading

import psycopg
from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

NAMESPACE = 0x50726573  # "Pres": apart from the run locks (routing.engine.ADVISORY_LOCK_NAMESPACE)


def presence_key(host: str, pid: int) -> int:
    """The lock key of the worker process `pid` on `host` (non-negative: pg_locks shows it as an oid)."""
    return int.from_bytes(hashlib.sha256(f"{host}:{pid}".encode()).digest()[:4], "big") % 2**31


def present() -> set[int]:
    """The keys of the worker processes alive now, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND classid = %(namespace)s"
            " AND objsubid = 2 AND granted",
            {"namespace": NAMESPACE},
        )
        return {int(row[0]) for row in cursor.fetchall()}


class Presence(threading.Thread):
    """Holds this process's presence lock, and takes it again within CONDUCTOR_HEARTBEAT_S when its
    connection was lost (a database restart)."""

    def __init__(self) -> None:
        super().__init__(name="conductor-presence", daemon=True)
        self.key = presence_key(socket.gethostname(), os.getpid())
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        self.params = params
        self.conn: psycopg.Connection | None = None

    def hold(self) -> None:
        if self.conn is not None and not self.conn.closed:
            try:
                self.conn.execute("SELECT 1")
                return
            except psycopg.Error:
                with contextlib.suppress(psycopg.Error):
                    self.conn.close()
        try:
            self.conn = psycopg.connect(**self.params, autocommit=True)
            self.conn.execute("SELECT pg_advisory_lock(%s, %s)", [NAMESPACE, self.key])
        except psycopg.Error as exc:
            log.warning("worker presence: %s; trying again", exc)
            self.conn = None

    def run(self) -> None:
        while True:
            self.hold()
            threading.Event().wait(settings.CONDUCTOR_HEARTBEAT_S)


_presence: Presence | None = None


def announce() -> None:
    """Start holding this process's presence (a worker's main process, once; idempotent). Pool processes
    forked later inherit the connection but never end it (psycopg finishes a connection only in the
    process that opened it)."""
    global _presence
    if _presence is None:
        _presence = Presence()
        _presence.hold()
        _presence.start()
