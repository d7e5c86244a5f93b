"""CPU time of the database server behind a connection and of worker processes, read from /proc, and
the clock that the benchmarks time one side of a comparison with."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def database_cpu_s(connection: Any) -> float | None:
    """CPU seconds used so far by the PostgreSQL server behind `connection`: the postmaster, its live
    processes (backends, WAL writer, checkpointer...) and those that have exited (the postmaster's
    children's time). None where /proc cannot tell (not Linux, or the server is not this machine's)."""
    from django.db import DatabaseError

    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")  # a superuser's or pg_read_all_settings' to read
            directory = Path(cursor.fetchone()[0])
    except DatabaseError:
        return None
    try:
        postmaster = int((directory / "postmaster.pid").read_text().split()[0])
        return process_tree_cpu_s(postmaster)
    except (OSError, ValueError, IndexError):
        return None


def database_backends_cpu_s(connection: Any) -> dict[int, float] | None:
    """CPU seconds used so far by each live process of the PostgreSQL server behind `connection` that
    serves its database (the backends connected to it) or the whole server (the WAL writer,
    checkpointer and the other background processes), by pid: on a server that other work shares, what
    this database's clients cost it. Two readings give the CPU between them (`backends_cpu_between`).
    None where /proc cannot tell (the server is not this machine's)."""
    from django.db import DatabaseError

    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() OR datname IS NULL"
            )
            pids = [row[0] for row in cursor.fetchall()]
    except DatabaseError:
        return None
    found = {}
    for pid in pids:
        try:
            found[pid] = process_cpu_s(pid)
        except OSError:
            continue  # ended meanwhile
    return found or None


def backends_cpu_between(start: dict[int, float], end: dict[int, float]) -> float:
    """The CPU seconds of the processes of two readings between them: a process that started meanwhile
    counts whole; one that ended meanwhile is missed (only its part after the first reading)."""
    return sum(cpu - start.get(pid, 0.0) for pid, cpu in end.items())


def redis_cpu_s(url: str) -> float | None:
    """CPU seconds used so far by the Redis server at `url` (its process_id, read from /proc). None
    where it cannot tell (not this machine's, or a Unix socket Redis refuses INFO on)."""
    import redis

    try:
        return process_cpu_s(int(redis.Redis.from_url(url).info("server")["process_id"]))
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None


def _stat(pid: int | str) -> list[str]:
    """A process's /proc stat fields from its state on (utime, stime, cutime, cstime are 11 to 14)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_s(pid: int | str) -> float:
    """CPU seconds used so far by one live process (its own: user and system). OSError once it ended."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by a process and its children, live (one level: a server's backends, a
    Celery worker's pool processes) and exited (its children's time). Linux only (OSError elsewhere)."""
    own = _stat(pid)
    total = sum(int(v) for v in own[11:15])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = _stat(entry.name)
            except OSError:
                continue  # gone meanwhile: counted in the parent's children's time
            if int(fields[1]) == pid:
                total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def processes_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds of this process and of the process trees `pids` (workers it started)."""
    return time.process_time() + sum(process_tree_cpu_s(pid) for pid in pids)


class Clock:
    """One side's timed part: wall time, the CPU time of this process and of the worker processes
    `pids` (with their children), the database server's CPU time (None where /proc cannot tell) and
    the WAL it wrote (its LSNs, for pg_waldump), from here to `stop`."""

    def __init__(self, connection: Any, pids: Iterable[int] = ()) -> None:
        self.connection, self.pids = connection, list(pids)
        self.db, self.wal = database_cpu_s(connection), wal_lsn(connection)
        self.wall, self.cpu = time.perf_counter(), processes_cpu_s(self.pids)

    def stop(self, count: Callable[[], int]) -> dict[str, Any]:
        """The figures per step, the steps counted (`count`) once the clocks are read."""
        wall, cpu = time.perf_counter() - self.wall, processes_cpu_s(self.pids) - self.cpu
        db, wal = database_cpu_s(self.connection), wal_lsn(self.connection)
        steps = count()
        return {
            "ms_per_step": 1000 * wall / steps,
            "cpu_ms_per_step": 1000 * cpu / steps,
            "db_cpu_ms_per_step": None if db is None or self.db is None else 1000 * (db - self.db) / steps,
            "wal_kb_per_step": None
            if wal is None or self.wal is None
            else wal_bytes(self.wal, wal) / 1000 / steps,
            "wal": None if wal is None or self.wal is None else f"{self.wal}-{wal}",
            "steps": steps,
        }


def wal_lsn(connection: Any) -> str | None:
    """The server's current WAL insert position (an LSN, as `0/1A2B3C4D`): two of them bound what a
    benchmark's side wrote, in bytes (`wal_bytes`) and, on the server's machine, in records
    (`pg_waldump --stats -s FROM -e TO` over its pg_wal). None where the server cannot say (a standby)."""
    from django.db import DatabaseError

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
            return str(cursor.fetchone()[0])
    except DatabaseError:
        return None


def wal_bytes(start: str, end: str) -> int:
    """The bytes of WAL between two LSNs."""

    def position(lsn: str) -> int:
        high, low = lsn.split("/")
        return (int(high, 16) << 32) + int(low, 16)

    return position(end) - position(start)
