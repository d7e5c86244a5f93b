"""LegalHold keeps a task's id, not a foreign key to routing: drop the constraint that databases made
before 0001 was changed to say so carry (its column, index and values stay as they are)."""

from django.db import migrations

DROP_FOREIGN_KEYS = """
DO $$
DECLARE name text;
BEGIN
    FOR name IN SELECT conname FROM pg_constraint
                WHERE conrelid = 'audit_legalhold'::regclass AND contype = 'f'
    LOOP
        EXECUTE format('ALTER TABLE audit_legalhold DROP CONSTRAINT %I', name);
    END LOOP;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0005_signed_anchor_and_purges")]

    operations = [migrations.RunSQL(DROP_FOREIGN_KEYS, reverse_sql=migrations.RunSQL.noop)]
