"""ApiToken now belongs to accounts (its 0001 takes it over, table and all): here it only leaves
audit's model state. The table, audit_apitoken, stays as it is."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0011_table_stamps"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel("ApiToken")]),
    ]
