"""Append-only audit tables: UPDATE, DELETE and TRUNCATE are rejected by PostgreSQL itself.

The one exception: events of a run chain (never the global chain) for which a ChainPurge row exists (retention deletes a
whole, sealed run chain and records the purge in the same transaction; verification accounts for it).
"""

from django.db import migrations

SQL = r"""
CREATE OR REPLACE FUNCTION audit_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit records are append-only: % on % is not allowed', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'raise_exception';
END $$;

CREATE OR REPLACE FUNCTION audit_event_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.chain LIKE 'run:%' AND EXISTS (SELECT 1 FROM audit_chainpurge p WHERE p.chain = OLD.chain) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only: % on % is not allowed', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'raise_exception';
END $$;

CREATE TRIGGER audit_event_append_only BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_event_guard();
CREATE TRIGGER audit_event_no_truncate BEFORE TRUNCATE ON audit_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();

CREATE TRIGGER audit_checkpoint_append_only BEFORE UPDATE OR DELETE ON audit_checkpoint
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER audit_checkpoint_no_truncate BEFORE TRUNCATE ON audit_checkpoint
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();

CREATE TRIGGER audit_chainpurge_append_only BEFORE UPDATE OR DELETE ON audit_chainpurge
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER audit_chainpurge_no_truncate BEFORE TRUNCATE ON audit_chainpurge
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();
"""

REVERSE = r"""
DROP TRIGGER IF EXISTS audit_event_append_only ON audit_auditevent;
DROP TRIGGER IF EXISTS audit_event_no_truncate ON audit_auditevent;
DROP TRIGGER IF EXISTS audit_checkpoint_append_only ON audit_checkpoint;
DROP TRIGGER IF EXISTS audit_checkpoint_no_truncate ON audit_checkpoint;
DROP TRIGGER IF EXISTS audit_chainpurge_append_only ON audit_chainpurge;
DROP TRIGGER IF EXISTS audit_chainpurge_no_truncate ON audit_chainpurge;
DROP FUNCTION IF EXISTS audit_event_guard();
DROP FUNCTION IF EXISTS audit_reject_change();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
