"""Analytics for operators: where the money and the steps go, and what accuracy they buy."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Avg, Count, F, OuterRef, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from audit import csv_safe

from . import selectors
from .models import Run, RunStatus, Step, StepStatus

OPERATIONAL_KINDS = (Run.Kind.LIVE, Run.Kind.RETRY, Run.Kind.SHADOW)


@dataclass(frozen=True)
class Filters:
    since: datetime
    until: datetime
    classification: str = ""
    conductor: str = ""

    def runs(self) -> QuerySet[Run]:
        # Live work and the shadow runs beside it; rollouts (sampled at a temperature) and evaluation runs
        # have pages of their own under /training/.
        qs = Run.objects.filter(
            created_at__gte=self.since, created_at__lt=self.until, kind__in=OPERATIONAL_KINDS
        )
        if self.classification:
            qs = qs.filter(task__classification=self.classification)
        if self.conductor:
            qs = qs.filter(conductor_version__name=self.conductor)
        return qs

    def steps(self) -> QuerySet[Step]:
        return Step.objects.filter(run__in=self.runs()).exclude(status=StepStatus.PENDING)


def default_filters(*, days: int = 7) -> Filters:
    now = timezone.now()
    return Filters(since=now - timedelta(days=days), until=now + timedelta(minutes=1))


def _bucket(f: Filters):
    return TruncHour if f.until - f.since <= timedelta(days=3) else TruncDay


def cost_over_time(f: Filters, *, by: str) -> list[dict[str, Any]]:
    """Cost and steps per time bucket, by worker, vendor or conductor version."""
    field = {"worker": "worker_slug", "vendor": "vendor", "conductor": "run__conductor_version__name"}[by]
    rows = (
        f.steps()
        .filter(started_at__isnull=False)
        .annotate(bucket=_bucket(f)("started_at"))
        .order_by()
        .values("bucket", field)
        .annotate(cost=Sum("cost_usd"), steps=Count("pk"))
        .order_by("bucket", field)
    )
    return [
        {"bucket": r["bucket"], by: r[field] or "(conductor)", "cost_usd": r["cost"], "steps": r["steps"]}
        for r in rows
    ]


def accuracy_vs_cost(f: Filters, *, by: str) -> list[dict[str, Any]]:
    """Mean score and USD per 1,000 tasks, for runs with a reference; `by` the conductor version, or
    the worker that gave the final answer. Pareto-optimal points (no other point is at least as
    accurate and cheaper) are marked."""
    runs = f.runs().filter(status=RunStatus.SUCCEEDED, score__isnull=False)
    if by == "conductor":
        rows = runs.order_by().values(name=F("conductor_version__name"))
    else:
        rows = (
            runs.annotate(final_worker=selectors.final_worker(run=OuterRef("pk")))
            .order_by()
            .values(name=F("final_worker"))
        )
    points = [
        {
            "name": r["name"],
            "runs": r["runs"],
            "accuracy": r["accuracy"],
            "usd_per_1000": (r["cost"] or Decimal(0)) / r["runs"] * 1000,
        }
        for r in rows.annotate(runs=Count("pk"), accuracy=Avg("score"), cost=Sum("cost_usd"))
    ]
    return sorted(mark_pareto(points), key=lambda p: p["usd_per_1000"])


def mark_pareto(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set "pareto" on each point: True unless another is at least as accurate and as cheap, and better in one."""
    for p in points:
        p["pareto"] = not any(
            o is not p
            and o["accuracy"] >= p["accuracy"]
            and o["usd_per_1000"] <= p["usd_per_1000"]
            and (o["accuracy"] > p["accuracy"] or o["usd_per_1000"] < p["usd_per_1000"])
            for o in points
        )
    return points


def routing_distribution(f: Filters) -> list[dict[str, Any]]:
    """Which worker gets which share of the steps, by task domain."""
    rows = (
        f.steps()
        .order_by()
        .values("run__task__domain", "worker_slug")
        .annotate(steps=Count("pk"))
        .order_by("run__task__domain")
    )
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["run__task__domain"]] = totals.get(r["run__task__domain"], 0) + r["steps"]
    return [
        {
            "domain": r["run__task__domain"] or "(none)",
            "worker": r["worker_slug"],
            "steps": r["steps"],
            "share": r["steps"] / totals[r["run__task__domain"]],
        }
        for r in rows
    ]


def as_csv(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv_safe.DictWriter(out, fieldnames=list(rows[0].keys()))  # text cells never formulas
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()})
    return out.getvalue()
