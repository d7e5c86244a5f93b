"""The live overview for operators: what is running, throughput, spend, and per-worker health."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Aggregate, Count, F, FloatField, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from .models import Attempt, Run, RunStatus, Task


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont(p) WITHIN GROUP (ORDER BY expr)."""

    function = "percentile_cont"
    name = "Percentile"
    template = "%(function)s(%(p)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, p: float):
        super().__init__(expression, p=float(p))


def overview(*, minutes: int = 15, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    since = now - timedelta(minutes=minutes)
    tasks = Task.objects.aggregate(
        running=Count("pk", filter=Q(status=RunStatus.RUNNING)),
        queued=Count("pk", filter=Q(status=RunStatus.QUEUED)),
        failed=Count("pk", filter=Q(status=RunStatus.FAILED, finished_at__gte=since)),
        succeeded=Count("pk", filter=Q(status=RunStatus.SUCCEEDED, finished_at__gte=since)),
    )
    per_minute = {
        row["minute"]: row
        for row in Run.objects.filter(finished_at__gte=since)
        .order_by()
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(runs=Count("pk"))
    }
    spend = {
        row["minute"]: row["cost"]
        for row in Attempt.objects.filter(finished_at__gte=since)
        .order_by()
        .annotate(minute=TruncMinute("finished_at"))
        .values("minute")
        .annotate(cost=Sum("cost_usd"))
    }
    start = since.replace(second=0, microsecond=0)
    minutes_axis = [start + timedelta(minutes=i) for i in range(minutes + 1)]
    timeline = [
        {"minute": m, "runs": per_minute.get(m, {}).get("runs", 0), "spend_usd": spend.get(m) or Decimal(0)}
        for m in minutes_axis
    ]
    workers = list(
        Attempt.objects.filter(Q(started_at__gte=since) | Q(status=Attempt.Status.STARTED))
        .order_by()
        .values(worker=F("step__worker_slug"), vendor=F("step__vendor"))
        .annotate(
            in_flight=Count("pk", filter=Q(status=Attempt.Status.STARTED)),
            calls=Count("pk", filter=~Q(status=Attempt.Status.STARTED)),
            errors=Count("pk", filter=~Q(status__in=[Attempt.Status.STARTED, Attempt.Status.SUCCEEDED])),
            p50_ms=Percentile("latency_ms", 0.5),
            p95_ms=Percentile("latency_ms", 0.95),
            cost=Sum("cost_usd"),
        )
        .order_by("worker")
    )
    alerts = []
    threshold = settings.OPS_ERROR_RATE_ALERT
    for row in workers:
        row["error_rate"] = row["errors"] / row["calls"] if row["calls"] else 0.0
        row["alerting"] = row["calls"] >= settings.OPS_ALERT_MIN_CALLS and row["error_rate"] >= threshold
        if row["alerting"]:
            alerts.append(
                f"{row['worker']}: {row['error_rate']:.0%} of {row['calls']} calls failed in the last {minutes} min "
                f"(threshold {threshold:.0%})"
            )
    budget_stops = Run.objects.filter(finished_at__gte=since, stop_reason="cost_budget").count()
    if budget_stops:
        alerts.append(f"{budget_stops} run(s) stopped at their cost budget in the last {minutes} min")
    spend_limit = settings.OPS_SPEND_PER_MINUTE_ALERT_USD
    peak = max((row["spend_usd"] for row in timeline), default=Decimal(0))
    if spend_limit and peak > spend_limit:
        alerts.append(f"spend reached ${peak:.4f} in one minute (threshold ${spend_limit})")
    return {
        "minutes": minutes,
        "now": now,
        "tasks": tasks,
        "throughput_per_min": (tasks["succeeded"] + tasks["failed"]) / minutes,
        "spend_usd": sum((row["spend_usd"] for row in timeline), Decimal(0)),
        "timeline": timeline,
        "workers": workers,
        "alerts": alerts,
    }
