"""A chain head is updated by every append (its seq, hash and updated_at), eight times or more a run.
Its index of updated_at made every one of those updates write a new entry into each of the table's
three indexes (PostgreSQL's HOT update is only possible when no indexed column changes). The index
dropped (CONCURRENTLY: appends wait for no lock), a head's updates stay on its page, and its pages keep
room for them (fillfactor). The checkpoint that asked it for the heads moved since the previous one
finds them through the events appended since, by the events' own time index."""

from django.db import migrations, models

UPDATED_AT = "audit_chainhead_updated_at_7ce431ce"


class Migration(migrations.Migration):
    atomic = False  # DROP and CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [("audit", "0008_fewer_indexes")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="chainhead",
                    name="updated_at",
                    field=models.DateTimeField(help_text="Moved: the next checkpoint signs it"),
                )
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{UPDATED_AT}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{UPDATED_AT}" '
                    'ON "audit_chainhead" ("updated_at")',
                ),
            ],
        ),
        migrations.RunSQL(
            "ALTER TABLE audit_chainhead SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE audit_chainhead RESET (fillfactor)",
        ),
    ]
