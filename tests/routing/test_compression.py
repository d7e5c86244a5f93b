"""The engine's large columns are compressed with lz4 where the server has it (routing migration 0014),
and the migration leaves a server without it (the embedded one) as it was, without failing."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection, transaction

from routing.models import Decision

pytestmark = pytest.mark.django_db(transaction=True)

migration = importlib.import_module("routing.migrations.0014_lz4_compression")


def server_has_lz4() -> bool:
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL default_toast_compression = lz4")
        return True
    except Exception:  # noqa: BLE001 - the server's answer is the point: no lz4 in it
        return False


def compression_of(table: str, column: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
            [table, column],
        )
        return cursor.fetchone()[0]


def test_every_large_column_is_set_to_lz4_exactly_where_the_server_has_it(live_pool):
    expected = "l" if server_has_lz4() else ""  # "": the server's default, pglz
    for table, columns in migration.COLUMNS.items():
        for column in columns:
            assert compression_of(table, column) == expected, (table, column)

    # A plan written now is stored compressed with that method.
    from tests.openai_server import Reply, plan_json
    from tests.routing.test_engine import run_now, submit

    long_text = "a plan that quotes its task at length " * 200
    live_pool["server"].program("conductor", [Reply(plan_json(("alpha", long_text, [])))])
    live_pool["server"].program("alpha", [Reply("done")])
    run = run_now(submit())
    decision = Decision.objects.filter(run=run).latest("pk")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_compression(raw_output) FROM routing_decision WHERE id = %s", [decision.pk]
        )
        assert cursor.fetchone()[0] == ("lz4" if expected else "pglz")


def test_the_migration_and_its_reverse_run_again_on_any_server():
    """Both directions are idempotent and never fail: run again here, on whatever this server is."""
    expected = "l" if server_has_lz4() else ""
    with connection.cursor() as cursor:
        cursor.execute(migration.compression_sql("default"))
        assert compression_of("routing_step", "response") == ""
        cursor.execute(migration.compression_sql("lz4"))
    assert compression_of("routing_step", "response") == expected
