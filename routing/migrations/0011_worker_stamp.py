"""The workers' table moves its stamp (audit.rows.table_stamp_sql) in the transaction of every change."""

import importlib

from django.db import migrations

stamps = importlib.import_module("audit.migrations.0011_table_stamps")


class Migration(migrations.Migration):
    dependencies = [("routing", "0010_fewer_indexes"), ("audit", "0011_table_stamps")]

    operations = [stamps.stamp_triggers("routing_worker")]
