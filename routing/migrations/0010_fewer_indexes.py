"""Foreign keys whose own index repeats the first column of another (each table's writes maintain one
index fewer): step (run, decision, worker), attempt (step), decision (run), run (task). The indexes are
dropped (CONCURRENTLY: writes go on meanwhile); the constraints stay as they are (an AlterField
would drop and re-validate each over the whole table)."""

import django.db.models.deletion
from django.db import migrations, models

# (model, field, related model, index dropped, its table, its column)
DROPPED = [
    ("attempt", "step", "routing.step", "routing_attempt_step_id_5f78a63f", "routing_attempt", "step_id"),
    ("decision", "run", "routing.run", "routing_decision_run_id_242fb62f", "routing_decision", "run_id"),
    ("run", "task", "routing.task", "routing_run_task_id_92e344ab", "routing_run", "task_id"),
    ("step", "decision", "routing.decision", "routing_step_decision_id_db89662b", "routing_step", "decision_id"),
    ("step", "run", "routing.run", "routing_step_run_id_3152636a", "routing_step", "run_id"),
    ("step", "worker", "routing.worker", "routing_step_worker_id_b8a484e7", "routing_step", "worker_id"),
]
RELATED_NAMES = {"attempt": "attempts", "decision": "decisions", "run": "runs", "step": "steps"}


def _field(model: str, field: str, to: str) -> models.ForeignKey:
    return models.ForeignKey(
        to,
        on_delete=django.db.models.deletion.PROTECT,
        related_name=RELATED_NAMES[model],
        db_index=False,
        **({"null": True, "blank": True} if field == "worker" else {}),
    )


class Migration(migrations.Migration):
    atomic = False  # DROP and CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [("routing", "0009_ops_rollup_four_hour_slots")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name=model, name=field, field=_field(model, field, to))
                for model, field, to, *_ in DROPPED
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"',
                    reverse_sql=f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}" ON "{table}" ("{column}")',
                )
                for _, _, _, index, table, column in DROPPED
            ],
        )
    ]
