"""The event table's two indexes of `action` alone (a plain one and a prefix one) dropped: one index of
(action, newest first) in the pattern operator class serves an action's events, its prefix and their
order, and every event maintains two indexes fewer. Built and dropped CONCURRENTLY: on a large table
a plain CREATE INDEX would hold every audit append (every write of the engine) until it finished."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

ACTION_ALONE = ("audit_auditevent_action_2131bb77", "audit_auditevent_action_2131bb77_like")


class Migration(migrations.Migration):
    atomic = False  # CREATE and DROP INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [("audit", "0007_policy_events_index")]

    operations = [
        AddIndexConcurrently(
            model_name="auditevent",
            index=models.Index(
                fields=["action", "-id"],
                name="audit_action_prefix",
                opclasses=["varchar_pattern_ops", "int8_ops"],
            ),
        ),
        RemoveIndexConcurrently(model_name="auditevent", name="audit_action_id"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="auditevent", name="action", field=models.CharField(max_length=60)
                )
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{ACTION_ALONE[0]}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{ACTION_ALONE[0]}" '
                    'ON "audit_auditevent" ("action")',
                ),
                migrations.RunSQL(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{ACTION_ALONE[1]}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{ACTION_ALONE[1]}" '
                    'ON "audit_auditevent" ("action" varchar_pattern_ops)',
                ),
            ],
        ),
    ]
