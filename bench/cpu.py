"""CPU time of the database server behind a connection, read from /proc, for the benchmarks' figures."""

from __future__ import annotations

import os
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
        ticks = os.sysconf("SC_CLK_TCK")

        def stat(pid: int | str) -> list[str]:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

        own = stat(postmaster)  # fields from the state on: utime, stime, cutime, cstime are 11 to 14
        total = sum(int(v) for v in own[11:15])
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = stat(entry.name)
                except OSError:
                    continue  # gone meanwhile: counted in the postmaster's children's time
                if int(fields[1]) == postmaster:
                    total += int(fields[11]) + int(fields[12])
        return total / ticks
    except (OSError, ValueError, IndexError):
        return None


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
