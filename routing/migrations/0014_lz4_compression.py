"""The large text and JSON columns of the engine's rows compressed with lz4 where the server has it.

PostgreSQL compresses a value it keeps in its row or in TOAST with pglz unless told otherwise; lz4
(PostgreSQL 14 and later, when the server is built with it, as Debian's and the official images are)
compresses and decompresses several times faster at about the same size. Every plan a dataset build
reads is decompressed (docs/benchmarks.md, "Throughput"), and every step's messages and answer are
compressed as the engine writes them. Only values written after this take it; a server built without
lz4 (the embedded one) keeps pglz, and the migration says so and goes on. A dump restored onto such a
server needs `pg_dump --no-toast-compression`.
"""

from django.db import migrations

COLUMNS = {
    "routing_decision": ("prompt", "raw_output", "plan", "alternatives", "policy_checks"),
    "routing_step": ("instruction", "messages_sent", "response"),
    "routing_run": ("final_answer",),
    "routing_task": ("text", "reference", "final_answer"),
}


def compression_sql(method: str) -> str:
    alters = "; ".join(
        f"ALTER TABLE {table} " + ", ".join(f"ALTER COLUMN {c} SET COMPRESSION {method}" for c in columns)
        for table, columns in COLUMNS.items()
    )
    return (
        f"DO $$ BEGIN {alters}; EXCEPTION WHEN feature_not_supported THEN "
        "RAISE NOTICE 'this server has no lz4: its large columns stay compressed with pglz'; END $$"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0013_pending_rollup"),
    ]

    operations = [
        migrations.RunSQL(compression_sql("lz4"), reverse_sql=compression_sql("default")),
    ]
