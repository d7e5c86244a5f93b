"""Rollups: what the aggregate pages read, kept as runs finish (routing.folds folds them)."""

from __future__ import annotations

from django.db import models

from .money import ROLLUP_USD, ZERO


class Grain(models.TextChoices):
    """A rollup row sums an hour, or a whole UTC day (long windows read days, and hours at their ends)."""

    HOUR = "hour", "Hour"
    DAY = "day", "Day"


class UsageRollup(models.Model):
    """Calls that reached a worker or an LLM judge, summed per hour (and per day) of the call and per
    everything the aggregate pages filter or group by. Folded in after each run ends (routing.folds.fold); equal to a
    recount from the rows (`manage.py rebuild_rollups`). Kept when retention deletes the rows: counts,
    tokens and money, no content."""

    class Source(models.TextChoices):
        STEP = "step", "Worker step"
        JUDGE = "judge", "LLM judge"

    grain = models.CharField(max_length=4, choices=Grain.choices)
    start = models.DateTimeField(help_text="The start of the hour or day (UTC)")
    source = models.CharField(max_length=5, choices=Source.choices)
    run_kind = models.CharField(max_length=12)
    conductor = models.CharField(max_length=80)
    worker_slug = models.CharField(max_length=80)
    vendor = models.CharField(max_length=80)
    classification = models.CharField(max_length=20)
    domain = models.CharField(max_length=40)
    calls = models.PositiveBigIntegerField(default=0, help_text="Steps, or judge calls")
    new_tasks = models.PositiveBigIntegerField(
        default=0, help_text="Tasks whose content reached this vendor for the first time in this cell"
    )
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(**ROLLUP_USD, default=ZERO)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "grain",
                    "start",
                    "source",
                    "run_kind",
                    "conductor",
                    "worker_slug",
                    "vendor",
                    "classification",
                    "domain",
                ],
                name="usage_rollup_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.source} calls to {self.worker_slug or self.vendor} in the {self.grain} of {self.start:%Y-%m-%d %H:00}"


class RunRollup(models.Model):
    """Finished runs summed per hour (and per day) of their creation, version, kind, task class and domain, the
    worker that gave the final answer, and status (routing.folds)."""

    grain = models.CharField(max_length=4, choices=Grain.choices)
    start = models.DateTimeField(help_text="The start of the hour or day (UTC)")
    run_kind = models.CharField(max_length=12)
    conductor = models.CharField(max_length=80)
    classification = models.CharField(max_length=20)
    domain = models.CharField(max_length=40)
    final_worker = models.CharField(max_length=80)
    status = models.CharField(max_length=20)
    runs = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(**ROLLUP_USD, default=ZERO)
    scored = models.PositiveBigIntegerField(default=0)
    score_sum = models.FloatField(default=0.0)
    scored_cost_usd = models.DecimalField(**ROLLUP_USD, default=ZERO)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "grain",
                    "start",
                    "run_kind",
                    "conductor",
                    "classification",
                    "domain",
                    "final_worker",
                    "status",
                ],
                name="run_rollup_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.status} {self.run_kind} runs of {self.conductor} in the {self.grain} of {self.start:%Y-%m-%d %H:00}"


class TaskExposure(models.Model):
    """One row per task and vendor its content reached (a worker's step or an LLM judge), with the
    first and last time: the vendor report's drill-down, and its count of distinct tasks. The task's
    id is kept, not a foreign key: the fact that a vendor saw a task outlives the task's rows."""

    task_id = models.UUIDField()
    vendor = models.CharField(max_length=80)
    classification = models.CharField(max_length=20)
    task_created_at = models.DateTimeField()
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task_id", "vendor"], name="task_exposure_key")]
        indexes = [
            models.Index(
                fields=["vendor", "classification", "-task_created_at"], name="task_exposure_vendor_recent"
            )
        ]

    def __str__(self) -> str:
        return f"Task {self.task_id} reached {self.vendor}"


class PendingRollup(models.Model):
    """A finished run not yet added to the rollups: written in the transaction that ends the run (one
    small row, where the three rollup upserts were), taken out by the fold that adds it
    (routing.folds.fold), in the fold's own transaction. No foreign key: the run's end checks none."""

    run_id = models.BigIntegerField(primary_key=True)

    def __str__(self) -> str:
        return f"Run {self.run_id}, not yet in the rollups"


class OpsRollup(models.Model):
    """The live overview's history over a day or a week: per slot of finishing (half hours for the
    day, four hours for the week, UTC), runs by kind, and provider calls by worker and status, with
    their cost and, for succeeded calls, a latency histogram (`latency_bucket`:
    routing.folds.LATENCY_BOUNDS_MS). Written as runs finish (routing.folds)."""

    span_min = models.PositiveSmallIntegerField(
        default=30, help_text="the slot's width in minutes (routing.folds.OPS_SPANS)"
    )
    slot = models.DateTimeField()
    series = models.CharField(max_length=4)  # "run" or "call"
    run_kind = models.CharField(max_length=12)
    worker_slug = models.CharField(max_length=80)
    status = models.CharField(max_length=20)
    latency_bucket = models.PositiveSmallIntegerField(
        default=0, help_text="0: not a succeeded call with a latency"
    )
    n = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(**ROLLUP_USD, default=ZERO)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["span_min", "slot", "series", "run_kind", "worker_slug", "status", "latency_bucket"],
                name="ops_rollup_key",
            )
        ]

    def __str__(self) -> str:
        return f"{self.n} {self.series}s in the {self.span_min} minutes from {self.slot:%Y-%m-%d %H:%M}"
