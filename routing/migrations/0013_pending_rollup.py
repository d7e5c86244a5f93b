from django.db import migrations, models


def fold_waiting_runs(apps, schema_editor):
    """Rolled back: the runs still waiting are folded into the rollups before their table goes (the
    code before this migration adds a run to the rollups as it ends)."""
    from routing import folds

    folds.fold()


class Migration(migrations.Migration):
    dependencies = [
        ("routing", "0012_decision_latency_fraction"),
    ]

    operations = [
        migrations.CreateModel(
            name="PendingRollup",
            fields=[
                ("run_id", models.BigIntegerField(primary_key=True, serialize=False)),
            ],
        ),
        migrations.RunPython(migrations.RunPython.noop, fold_waiting_runs),
    ]
