"""A version number per table whose rows a process keeps (policy rules here, workers in routing), moved
by a trigger in the transaction of every change to the table, however it is made (the admin, the
ORM, plain SQL, TRUNCATE). The engine checks it in each write's statement; it used to compute an md5
over every row of both tables there instead, about a tenth of a millisecond per statement, growing
with the tables. A change that changes nothing (an UPDATE to the same values) leaves it alone. The
numbers come from a sequence, which never gives one twice: a change rolled back leaves its number
unused, so rows a process read under it (inside that transaction) are never taken for another
change's."""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION audit_table_stamp_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO audit_tablestamp (name, version) VALUES (TG_TABLE_NAME, nextval('audit_tablestamp_version'))
    ON CONFLICT (name) DO UPDATE SET version = EXCLUDED.version;
    RETURN NULL;
END
$$
"""


def stamp_triggers(table: str) -> migrations.RunSQL:
    """The triggers that move `table`'s stamp: after any INSERT, DELETE or TRUNCATE statement, and
    after an UPDATE of a row that changed it. ENABLE ALWAYS: they fire in a session that turns
    triggers off (session_replication_role = replica: a maintenance session, a logical replica's
    apply), which changes the rows all the same."""
    return migrations.RunSQL(
        [
            f"CREATE TRIGGER {table}_stamp AFTER INSERT OR DELETE OR TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_table_stamp_move()",
            f"CREATE TRIGGER {table}_stamp_update AFTER UPDATE ON {table} "
            "FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION audit_table_stamp_move()",
            f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_stamp",
            f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_stamp_update",
        ],
        reverse_sql=[
            f"DROP TRIGGER IF EXISTS {table}_stamp_update ON {table}",
            f"DROP TRIGGER IF EXISTS {table}_stamp ON {table}",
        ],
    )


class Migration(migrations.Migration):
    dependencies = [("audit", "0010_event_correlation_unindexed")]

    operations = [
        migrations.RunSQL(
            [
                "CREATE TABLE audit_tablestamp (name varchar(63) PRIMARY KEY, version bigint NOT NULL)",
                "CREATE SEQUENCE audit_tablestamp_version",
                FUNCTION,
            ],
            reverse_sql=[
                "DROP FUNCTION IF EXISTS audit_table_stamp_move()",
                "DROP SEQUENCE IF EXISTS audit_tablestamp_version",
                "DROP TABLE IF EXISTS audit_tablestamp",
            ],
        ),
        stamp_triggers("audit_policyrule"),
    ]
