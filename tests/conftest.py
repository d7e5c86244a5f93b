from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from conductor_web.celery import worker_command
from tests.openai_server import OpenAIServer

ROOT = Path(__file__).resolve().parent.parent


# What makes a test slow: a browser, a real Celery worker, or a process of its own (web server, demo,
# benchmark). `make test` runs everything; `make test-quick` (-m "not slow") is the edit-run loop.
SLOW_FIXTURES = {
    "celery_workers",
    "browser",
    "page",
    "daphne_server",
    "live_server",
    "phoenix",
    "local_model_server",
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        browser = "browser" in item.nodeid.split("::")[0]  # tests/browser/, the browser sweep
        if browser or item.get_closest_marker("integration") or SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


def _uses_db(request) -> tuple[bool, bool]:
    marker = request.node.get_closest_marker("django_db")
    names = set(request.fixturenames)
    transactional = bool(marker and marker.kwargs.get("transaction")) or bool(
        names & {"transactional_db", "live_server"}
    )
    return bool(marker) or transactional or "db" in names, transactional


@pytest.fixture(autouse=True)
def _audit_triggers_on(request):
    """Every test runs with the audit tables' append-only triggers firing.

    A transactional test ends with Django's flush (TRUNCATE of every table), which those triggers
    rightly reject; the flush runs as a superuser's maintenance session would, with triggers off
    (session_replication_role = replica). The next test turns them back on first.
    """
    uses_db, transactional = _uses_db(request)
    if not uses_db:
        yield
        return
    request.getfixturevalue("_django_db_helper")  # set up first, so torn down (flushed) after this
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = origin")
    yield
    if transactional:
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")


@pytest.fixture(autouse=True)
def _private_checkpoints(request):
    """Each test's signed checkpoints in a folder of its own: the sealer signs one after every batch,
    and a verification reads every file of the folder (another test's would name rows it lacks). The
    acceptance record's tests share the record's folder (tests/acceptance/conftest.py)."""
    if "record" in request.fixturenames:
        yield
        return
    settings = request.getfixturevalue("settings")
    settings.AUDIT_CHECKPOINT_DIR = request.getfixturevalue("tmp_path") / "checkpoints"
    yield


@pytest.fixture(autouse=True)
def _fast_retries(settings):
    settings.CONDUCTOR_RETRY_BACKOFF_S = 0.01
    settings.CONDUCTOR_RETRY_BACKOFF_MAX_S = 0.05


@pytest.fixture(autouse=True)
def _lock_connections_closed() -> Iterator[None]:
    """The engine keeps its lock connections between runs; none outlives a test (nor the test database)."""
    yield
    from routing.engine.locks import LOCK_CONNECTIONS

    LOCK_CONNECTIONS.close_all()


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    server = OpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def live_pool(openai_server):
    """Three workers of two vendors and an LLM conductor, all served by the loopback server."""
    from tests.openai_server import register_pool

    workers, conductor = register_pool(openai_server)
    return {"workers": workers, "conductor": conductor, "server": openai_server}


@pytest.fixture(scope="session")
def local_model_server() -> str:
    """The local model's real server (llama.cpp serving SmolLM2-135M-Instruct), started for the test run
    as the embedded PostgreSQL and Redis are (or found running); its API base. `make test` installs it."""
    from django.conf import settings

    from conductor_web import local_model

    return local_model.start(settings.VAR_DIR, port=settings.LOCAL_MODEL_PORT)


@pytest.fixture
def local_pool(db, local_model_server):
    """The local model registered as a worker (vendor local, $0) and as the `smollm2-local` conductor."""
    from audit.services import Actor
    from routing.local_pool import local_model_register

    worker, conductor = local_model_register(api_base=local_model_server, actor=Actor.service("tests"))
    return {"worker": worker, "conductor": conductor, "api_base": local_model_server}


@pytest.fixture
def no_fold_after_runs(settings, monkeypatch):
    """This process folded the rollups just now and folds again in an hour at most: a run's end is
    followed by no fold of its own (routing.folds), for tests that pin a run's statements or its
    waiting row. Pages still fold before they read."""
    from routing import folds

    settings.ROLLUP_FOLD_EVERY_S = 3600
    monkeypatch.setattr(folds._folds, "last", time.monotonic())


@pytest.fixture
def replay_pool(db):
    from django.core.management import call_command

    call_command("load_replay_pool", verbosity=0)


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    user = quote(s.get("USER") or "")
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    host = s.get("HOST") or ""
    if host.startswith("/"):
        return f"postgresql://{user}{password}@/{s['NAME']}?host={quote(host)}"
    port = f":{s['PORT']}" if s.get("PORT") else ""
    return f"postgresql://{user}{password}@{host}{port}/{s['NAME']}"


def clear_queues() -> None:
    from django.conf import settings

    from conductor_web.celery import app

    with app.connection_for_write() as conn:
        prefix = settings.CONDUCTOR_QUEUE_PREFIX
        for queue in (
            app.conf.task_default_queue,
            prefix + "training",
            prefix + "resume",
            prefix + "maintenance",
        ):
            with contextlib.suppress(Exception):  # the queue may not exist yet
                conn.default_channel.queue_purge(queue)
        # Messages taken by workers and never acknowledged (a worker killed by a test).
        channel = conn.default_channel
        channel.client.delete(channel.unacked_key, channel.unacked_index_key)


def queued_run_ids(client, queue: str | None = None) -> list[int]:
    """The run ids of the run_workflow messages waiting in a broker queue (kombu's Redis list)."""
    from django.conf import settings

    run_ids = []
    for raw in client.lrange(queue or settings.CELERY_TASK_DEFAULT_QUEUE, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == "routing.tasks.run_workflow"
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        run_ids.append(args[0])
    return sorted(run_ids)


class WorkerProcess:
    """A real `celery worker` process against the test database and broker."""

    def __init__(self, name: str, env: dict[str, str], queues: tuple[str, ...] = ("runs",)):
        self.name = name
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            worker_command(concurrency=1, hostname=f"{name}@%h", quiet=True, queues=queues),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if " ready." in line:
                self.ready.set()

    def wait_ready(self, timeout: float = 60) -> None:
        if not self.ready.wait(timeout):
            raise AssertionError(f"celery worker {self.name} did not start:\n" + "".join(self.lines[-40:]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def celery_workers(transactional_db) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real worker processes: `start("w1")`. They are stopped after the test."""
    from django.conf import settings

    clear_queues()
    started: list[WorkerProcess] = []
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CONDUCTOR_RETRY_BACKOFF_S": "0.05",
        "CONDUCTOR_RETRY_BACKOFF_MAX_S": "0.2",
        "PYTHONUNBUFFERED": "1",
    }

    def start(name: str = "w1", queues: tuple[str, ...] = ("runs",), **extra_env: str) -> WorkerProcess:
        worker = WorkerProcess(name, {**env, **extra_env}, queues)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()
    clear_queues()


def wait_for(
    predicate: Callable[[], object], timeout: float = 30, interval: float = 0.05, what: str = "condition"
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def make_user(db):
    """`make_user("ann", "auditor")`: a user holding those roles (none: a user with no role)."""
    from django.contrib.auth import get_user_model

    from audit.grants import user_set_roles

    def _make(username: str, *roles: str, password: str = "correct horse battery staple"):
        user = get_user_model().objects.create_user(username=username, password=password)
        user_set_roles(user=user, roles=roles)
        return user

    return _make
