from django.db import migrations, models


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
    ]
