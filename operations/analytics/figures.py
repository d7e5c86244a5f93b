"""Analytics for operators: where the money and the steps go, and what accuracy they buy."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import F, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from routing import folds
from routing.models import Run, RunRollup, RunStatus, UsageRollup
from utilities import csv_safe, params

OPERATIONAL_KINDS = (Run.Kind.LIVE, Run.Kind.RETRY, Run.Kind.SHADOW)


@dataclass(frozen=True)
class Filters:
    """The page's window (whole hours and days, the rollups' grain: routing.folds.window) and filters, over
    finished runs of live work and the shadow runs beside it; rollouts (sampled at a temperature) and
    evaluation runs have pages of their own under /training/."""

    since: datetime
    until: datetime
    classification: str = ""
    conductor: str = ""
    bucket: str = ""  # "hour" or "day" as chosen; "" for what the window calls for (bucket_name)

    def _narrow(self, qs: QuerySet[Any], *, days: bool = True) -> QuerySet[Any]:
        qs = folds.window(qs, self.since, self.until, days=days).filter(run_kind__in=OPERATIONAL_KINDS)
        if self.classification:
            qs = qs.filter(classification=self.classification)
        if self.conductor:
            qs = qs.filter(conductor=self.conductor)
        return qs

    def usage(self, *, days: bool = True) -> QuerySet[UsageRollup]:
        """Worker steps, by the hour (or day) they started."""
        return self._narrow(UsageRollup.objects.filter(source=UsageRollup.Source.STEP), days=days)

    def runs(self) -> QuerySet[RunRollup]:
        """Runs, by the hour (or day) they were created."""
        return self._narrow(RunRollup.objects.all())


def default_filters(*, days: int = 7) -> Filters:
    now = timezone.now()
    return Filters(since=now - timedelta(days=days), until=now + timedelta(minutes=1))


# The time charts' buckets: (label, truncation, seconds) by the name `bucket=` chooses.
BUCKETS = {"hour": ("hourly", TruncHour, 3600), "day": ("daily", TruncDay, 86400)}
HOURLY_UP_TO = timedelta(days=2)  # the longest window charted by the hour unless hours are chosen
HOURLY_AT_MOST = timedelta(days=31)  # the longest window hours may be chosen for (744 buckets)


def bucket_name(f: Filters) -> str:
    """The bucket chosen, else hours over a window of up to two days and days over a longer one.
    Hours chosen over more than 31 days are refused (InvalidParameter): too many points to read."""
    if f.bucket == "hour" and f.until - f.since > HOURLY_AT_MOST:
        raise params.InvalidParameter(
            "bucket", "hourly buckets cover at most 31 days: choose day, or a shorter period"
        )
    if f.bucket:
        return f.bucket
    return "hour" if f.until - f.since <= HOURLY_UP_TO else "day"


def _bucket(f: Filters):
    return BUCKETS[bucket_name(f)][1]


def bucket_seconds(f: Filters) -> int:
    """The length of the time charts' buckets, in seconds."""
    return BUCKETS[bucket_name(f)][2]


def cost_over_time(f: Filters, *, by: str) -> list[dict[str, Any]]:
    """Cost and steps per time bucket, by worker, vendor or conductor version."""
    field = {"worker": "worker_slug", "vendor": "vendor", "conductor": "conductor"}[by]
    trunc = _bucket(f)
    rows = (
        f.usage(days=trunc is TruncDay)
        .annotate(bucket=trunc("start"))
        .order_by()
        .values("bucket", field)
        .annotate(cost=Sum("cost_usd"), steps=Sum("calls"))
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
    rows = (
        f.runs()
        .filter(status=RunStatus.SUCCEEDED, scored__gt=0)
        .order_by()
        .values(name=F("conductor" if by == "conductor" else "final_worker"))
        .annotate(runs=Sum("scored"), score=Sum("score_sum"), cost=Sum("scored_cost_usd"))
    )
    points = [
        {
            "name": r["name"],
            "runs": r["runs"],
            "accuracy": r["score"] / r["runs"],
            "usd_per_1000": (r["cost"] or Decimal(0)) / r["runs"] * 1000,
        }
        for r in rows
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
    """Which worker gets which share of the steps that ran, by task domain."""
    rows = (
        f.usage().order_by().values("domain", "worker_slug").annotate(steps=Sum("calls")).order_by("domain")
    )
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["domain"]] = totals.get(r["domain"], 0) + r["steps"]
    return [
        {
            "domain": r["domain"] or "(none)",
            "worker": r["worker_slug"],
            "steps": r["steps"],
            "share": r["steps"] / totals[r["domain"]],
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
