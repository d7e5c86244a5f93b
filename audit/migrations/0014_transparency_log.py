"""The transparency log: the sealer appends each pending seal as a leaf of one Merkle tree (LogNode holds
its complete nodes), marks the row with its leaf index, and signs the tree head as a C2SP checkpoint note.

LogNode is append-only like the other audit tables. A pending seal may now be changed twice, each
column once: seal_event_id set (the run.sealed event), and leaf_index set (its leaf); every other
column as it was. Rows sealed before the log got their leaf from the next sealer.
"""

from django.db import migrations, models

GUARD = r"""
CREATE OR REPLACE FUNCTION audit_pendingseal_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND to_jsonb(NEW) - 'seal_event_id' - 'leaf_index' = to_jsonb(OLD) - 'seal_event_id' - 'leaf_index'
       AND NEW.seal_event_id IS NOT NULL
       AND (OLD.seal_event_id IS NULL OR NEW.seal_event_id = OLD.seal_event_id)
       AND (OLD.leaf_index IS NULL OR NEW.leaf_index IS NOT DISTINCT FROM OLD.leaf_index)
       AND (OLD.seal_event_id IS NULL OR OLD.leaf_index IS NULL) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % is not allowed (a pending seal is only marked sealed and given its leaf, once)',
        TG_OP, TG_TABLE_NAME USING ERRCODE = 'raise_exception';
END $$;

CREATE TRIGGER audit_lognode_append_only BEFORE UPDATE OR DELETE ON audit_lognode
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER audit_lognode_no_truncate BEFORE TRUNCATE ON audit_lognode
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS audit_lognode_no_truncate ON audit_lognode;
DROP TRIGGER IF EXISTS audit_lognode_append_only ON audit_lognode;
CREATE OR REPLACE FUNCTION audit_pendingseal_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seal_event_id IS NULL AND NEW.seal_event_id IS NOT NULL
       AND to_jsonb(NEW) - 'seal_event_id' = to_jsonb(OLD) - 'seal_event_id' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % is not allowed (a pending seal is only marked sealed, once)',
        TG_OP, TG_TABLE_NAME USING ERRCODE = 'raise_exception';
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0013_pendingseal")]

    operations = [
        migrations.AddField(
            model_name="pendingseal",
            name="leaf_index",
            field=models.BigIntegerField(blank=True, null=True, unique=True),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="note",
            field=models.TextField(blank=True, db_default=""),
        ),
        migrations.CreateModel(
            name="LogNode",
            fields=[
                ("pk", models.CompositePrimaryKey("level", "index", blank=True, editable=False, primary_key=True, serialize=False)),
                ("level", models.SmallIntegerField()),
                ("index", models.BigIntegerField()),
                ("hash", models.BinaryField(max_length=32)),
            ],
        ),
        migrations.RunSQL(GUARD, REVERSE),
    ]
