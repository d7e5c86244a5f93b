"""The acceptance sweep's record: built once per session, through the real engine, outside test
transactions, so that every test using the `db` fixture reads it (and rolls back only its own writes).

The record lives as long as this package's tests (package scope): it is removed before the other
tests run, which expect an empty database. No transactional test belongs in this package: one ends
by flushing the database, the record included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from django.test import override_settings

from tests.acceptance.crawl import IDENTITIES, ROLE_OF
from tests.acceptance.record import Record, build_record
from tests.openai_server import OpenAIServer

log = logging.getLogger(__name__)


@pytest.fixture(scope="package")
def acceptance_server() -> Iterator[OpenAIServer]:
    """The loopback OpenAI server playing the LLM conductor and the loopback workers of the record."""
    server = OpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="package")
def record(django_db_setup, django_db_blocker, acceptance_server, tmp_path_factory) -> Iterator[Record]:
    """The record (tests/acceptance/record.py). Its files (policies, dataset) live in a directory of
    this session, which stays the app's VAR_DIR until the session ends, so their pages find them."""
    from django.core.management import call_command
    from django.db import connection

    from tests.conftest import clear_queues

    work_dir = tmp_path_factory.mktemp("acceptance-var")
    # The record's checkpoint notes (the sealer signs one per batch) stay its own for its tests.
    with override_settings(VAR_DIR=work_dir, AUDIT_CHECKPOINT_DIR=work_dir / "audit" / "checkpoints"):
        with django_db_blocker.unblock():
            started = time.monotonic()
            try:
                built = build_record(server=acceptance_server, work_dir=work_dir)
            except BaseException:
                _flush(connection, call_command)
                clear_queues()
                raise
            log.warning("acceptance record built in %.1fs", time.monotonic() - started)
        try:
            yield built
        finally:
            with django_db_blocker.unblock():
                _flush(connection, call_command)
                clear_queues()


def _flush(connection, call_command) -> None:
    """Remove everything, as tests/conftest.py does after a transactional test: Django's flush
    (TRUNCATE) with the audit tables' append-only triggers off, then the triggers on again."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
    try:
        call_command("flush", interactive=False, verbosity=0)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = origin")


@pytest.fixture(scope="package")
def identities(record, django_db_blocker) -> dict[str, tuple[object | None, str | None]]:
    """identity -> (user, API token key or None); committed beside the record, so that the
    websocket's own threads see them too."""
    from django.contrib.auth import get_user_model

    from audit.grants import token_create, user_set_roles

    made: dict[str, tuple[object | None, str | None]] = {"anonymous": (None, None)}
    with django_db_blocker.unblock():
        for identity in IDENTITIES[1:]:
            user = get_user_model().objects.create_user(username=f"sweep-{identity.replace(' ', '-')}")
            role = ROLE_OF.get(identity)
            user_set_roles(user=user, roles=[role] if role else [])
            made[identity] = (user, token_create(user=user, role=role, name="sweep").key if role else None)
            SESSION_COOKIES[identity] = _committed_session_cookie(user)
    return made


SESSION_COOKIES: dict[str, str] = {}


def _committed_session_cookie(user) -> str:
    """A session for `user` in the database (committed: the websocket reads it from its own thread)."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"
