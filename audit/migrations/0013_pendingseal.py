"""Pending seals: a run's end leaves its chain's seal here for the sealer, instead of appending it to
the global chain's head (which every run end in the deployment waited for in turn).

Append-only like the other audit tables, with one change allowed: the sealer marks a row sealed once
(seal_event_id from NULL to the global chain's run.sealed event), every other column as it was. No
DELETE, not even by a retention purge: a row holds the chain's name, the run's id and the chain's last
seq and hash, which the seal in the global chain holds for ever too, so the purge keeps it (and needs
no change) rather than the trigger growing a second exception.
"""

from django.db import migrations, models

GUARD = r"""
CREATE FUNCTION audit_pendingseal_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seal_event_id IS NULL AND NEW.seal_event_id IS NOT NULL
       AND to_jsonb(NEW) - 'seal_event_id' = to_jsonb(OLD) - 'seal_event_id' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % is not allowed (a pending seal is only marked sealed, once)',
        TG_OP, TG_TABLE_NAME USING ERRCODE = 'raise_exception';
END $$;

CREATE TRIGGER audit_pendingseal_append_only BEFORE UPDATE OR DELETE ON audit_pendingseal
    FOR EACH ROW EXECUTE FUNCTION audit_pendingseal_guard();
CREATE TRIGGER audit_pendingseal_no_truncate BEFORE TRUNCATE ON audit_pendingseal
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS audit_pendingseal_no_truncate ON audit_pendingseal;
DROP TRIGGER IF EXISTS audit_pendingseal_append_only ON audit_pendingseal;
DROP FUNCTION IF EXISTS audit_pendingseal_guard();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0012_apitoken_to_accounts")]

    operations = [
        migrations.CreateModel(
            name="PendingSeal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("chain", models.CharField(max_length=64, unique=True)),
                ("object_type", models.CharField(max_length=60)),
                ("object_id", models.CharField(max_length=100)),
                ("task_id", models.UUIDField(blank=True, null=True)),
                ("seq", models.PositiveBigIntegerField()),
                ("hash", models.CharField(max_length=64)),
                ("created_at", models.DateTimeField()),
                ("seal_event_id", models.BigIntegerField(blank=True, null=True)),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("seal_event_id__isnull", True)),
                        fields=["id"],
                        name="audit_seal_pending",
                    )
                ],
            },
        ),
        migrations.RunSQL(GUARD, REVERSE),
    ]
