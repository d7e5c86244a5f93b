"""The live overview for operators: what is running, throughput, spend, and per-worker health."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from celery import current_app
from django.conf import settings
from django.core.cache import cache
from django.db.models import (
    Aggregate,
    Count,
    DateTimeField,
    DurationField,
    F,
    FloatField,
    Func,
    Q,
    Sum,
    Value,
)
from django.db.models.functions import TruncMinute
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kombu.exceptions import ChannelError, OperationalError

from routing import folds, presence
from routing.local_server import BUILD_TIME, state_reason
from routing.models import Attempt, OpsRollup, Run, RunStatus, StopReason


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont(p) WITHIN GROUP (ORDER BY expr)."""

    function = "percentile_cont"
    name = "Percentile"
    template = "%(function)s(%(p)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, p: float):
        super().__init__(expression, p=float(p))


def calls_link(*, since: datetime, **filters: str) -> str:
    """The provider-calls page filtered to these calls since `since`."""
    return (
        reverse("routing:attempt-list")
        + "?"
        + urlencode({**filters, "since": since.isoformat(timespec="seconds")})
    )


KIND_GROUPS: dict[
    str, str
] = {  # what a run was for, as the overview separates it: live traffic apart from the rest
    Run.Kind.LIVE: "live",
    Run.Kind.RETRY: "live",
    Run.Kind.SHADOW: "shadow",
    Run.Kind.ROLLOUT: "rollout",
    Run.Kind.EVALUATION: "evaluation",
    Run.Kind.PLAYGROUND: "playground",
}
LIVE = "live"  # the group of user traffic: a task's live run and its retries
LIVE_KINDS = tuple(kind for kind, group in KIND_GROUPS.items() if group == LIVE)


def kind_group(kind: str) -> str:
    return KIND_GROUPS.get(kind, kind)


def overview(*, minutes: int = 15, now: datetime | None = None) -> dict[str, Any]:
    """The last `minutes`: live traffic's runs in flight and finished, and its spend, apart from
    shadow runs and training's (rollouts, evaluations); every worker's calls, errors and latency;
    failed live runs by reason; and alerts."""
    now = now or timezone.now()
    since = now - timedelta(minutes=minutes)
    # Live runs that can count (in flight, or ended in the window), through their indexes.
    live = (
        Run.objects.filter(kind__in=LIVE_KINDS)
        .filter(Q(status__in=(RunStatus.RUNNING, RunStatus.QUEUED)) | Q(finished_at__gte=since))
        .aggregate(
            running=Count("pk", filter=Q(status=RunStatus.RUNNING)),
            queued=Count("pk", filter=Q(status=RunStatus.QUEUED)),
            failed=Count("pk", filter=Q(status=RunStatus.FAILED, finished_at__gte=since)),
            succeeded=Count("pk", filter=Q(status=RunStatus.SUCCEEDED, finished_at__gte=since)),
        )
    )
    timeline, other = _per_minute(since, minutes)
    workers = _workers(since, minutes)
    stops = _stops(since)
    alerts = [w["alert"] for w in workers if w["alert"]]
    budget_stops = sum(row["n"] for row in stops if row["reason"] == StopReason.COST_BUDGET)
    if budget_stops:
        alerts.append(
            {"text": f"{budget_stops} live run(s) stopped at their cost budget in the last {minutes} min"}
        )
    spend_limit = settings.OPS_SPEND_PER_MINUTE_ALERT_USD
    peak = max((row["spend_usd"] + row["other_spend_usd"] for row in timeline), default=Decimal(0))
    if spend_limit and peak > spend_limit:
        alerts.append({"text": f"spend reached ${peak:.4f} in one minute (threshold ${spend_limit})"})
    return {
        "minutes": minutes,
        "now": now,
        "live": live,
        "throughput_per_min": (live["succeeded"] + live["failed"]) / minutes,
        "spend_usd": sum((row["spend_usd"] for row in timeline), Decimal(0)),
        "other": other,
        "timeline": timeline,
        "workers": workers,
        "alerts": alerts,
        "stops": stops,
    }


def _per_minute(since: datetime, minutes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs finished and money spent per minute, live traffic apart from the rest; and the rest's
    totals by group (shadow, rollout, evaluation), each group shown even when idle."""
    runs: dict[tuple[str, datetime], int] = {}
    for row in (
        Run.objects.filter(finished_at__gte=since)
        .order_by()
        .values("kind", minute=TruncMinute("finished_at"))
        .annotate(n=Count("pk"))
    ):
        key = (kind_group(row["kind"]), row["minute"])
        runs[key] = runs.get(key, 0) + row["n"]
    spend: dict[tuple[str, datetime], Decimal] = {}
    for row in (
        Attempt.objects.filter(finished_at__gte=since)
        .order_by()
        .values(kind=F("step__run__kind"), minute=TruncMinute("finished_at"))
        .annotate(cost=Sum("cost_usd"))
    ):
        key = (kind_group(row["kind"]), row["minute"])
        spend[key] = spend.get(key, Decimal(0)) + (row["cost"] or Decimal(0))
    start = since.replace(second=0, microsecond=0)
    minutes_axis = [start + timedelta(minutes=i) for i in range(minutes + 1)]
    others = [group for group in dict.fromkeys(KIND_GROUPS.values()) if group != LIVE]
    timeline = [
        {
            "minute": m,
            "runs": runs.get((LIVE, m), 0),
            "spend_usd": spend.get((LIVE, m), Decimal(0)),
            "other_runs": sum(runs.get((g, m), 0) for g in others),
            "other_spend_usd": sum((spend.get((g, m), Decimal(0)) for g in others), Decimal(0)),
        }
        for m in minutes_axis
    ]
    other = [
        {
            "group": group,
            "runs": sum(n for (g, _), n in runs.items() if g == group),
            "spend_usd": sum((usd for (g, _), usd in spend.items() if g == group), Decimal(0)),
        }
        for group in others
    ]
    return timeline, other


def _workers(since: datetime, minutes: int) -> list[dict[str, Any]]:
    """Every worker's calls (of every kind of run) since `since`: in flight, errors by kind with links
    to those calls, latency percentiles, cost, and an alert when its error rate crosses the threshold."""
    workers = list(
        Attempt.objects.filter(Q(started_at__gte=since) | Q(status=Attempt.Status.STARTED))
        .order_by()
        .values(worker=F("step__worker_slug"), vendor=F("step__vendor"))
        .annotate(
            in_flight=Count("pk", filter=Q(status=Attempt.Status.STARTED)),
            calls=Count("pk", filter=~Q(status=Attempt.Status.STARTED)),
            errors=Count("pk", filter=Q(status__in=Attempt.ERRORS)),
            p50_ms=Percentile("latency_ms", 0.5),
            p95_ms=Percentile("latency_ms", 0.95),
            cost=Sum("cost_usd"),
        )
        .order_by("worker")
    )
    # Each worker's errors by kind, each a link to those calls (from the symptom to its cause).
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in (
        Attempt.objects.filter(started_at__gte=since)
        .filter(status__in=Attempt.ERRORS)
        .order_by()
        .values("status", worker=F("step__worker_slug"))
        .annotate(n=Count("pk"))
        .order_by("worker", "-n", "status")
    ):
        label = Attempt.Status(row["status"]).label
        link = calls_link(worker=row["worker"], status=row["status"], since=since)
        by_kind.setdefault(row["worker"], []).append({"kind": label, "n": row["n"], "url": link})
    threshold = settings.OPS_ERROR_RATE_ALERT
    for row in workers:
        row["error_rate"] = row["errors"] / row["calls"] if row["calls"] else 0.0
        row["alerting"] = row["calls"] >= settings.OPS_ALERT_MIN_CALLS and row["error_rate"] >= threshold
        row["errors_by_kind"] = by_kind.get(row["worker"], [])
        row["calls_url"] = calls_link(worker=row["worker"], since=since)
        row["failed_url"] = calls_link(worker=row["worker"], status="failed", since=since)
        row["alert"] = None
        if row["alerting"]:
            row["alert"] = {
                "text": f"{row['worker']}: {row['error_rate']:.0%} of {row['calls']} calls failed in the last "
                f"{minutes} min (threshold {threshold:.0%})",
                "url": row["failed_url"],
            }
    return workers


def _stops(since: datetime) -> list[dict[str, Any]]:
    """Live runs that failed, by why they stopped (policy, budgets, an invalid plan, a step's calls...):
    each a link to those tasks. Training's sampled plans fail by design and are not counted."""
    return [
        {
            "reason": row["stop_reason"],
            "label": StopReason(row["stop_reason"]).label
            if row["stop_reason"] in StopReason.values
            else row["stop_reason"],
            "n": row["n"],
            "url": reverse("routing:task-list") + "?" + urlencode({"stop": row["stop_reason"]}),
        }
        for row in Run.objects.filter(finished_at__gte=since, status=RunStatus.FAILED, kind__in=LIVE_KINDS)
        .exclude(stop_reason="")
        .order_by()
        .values("stop_reason")
        .annotate(n=Count("pk"))
        .order_by("-n", "stop_reason")
    ]


# --- History: the overview's charts over the last hour, day or week ----------------------------

PERIODS = {  # name -> (length, bucket)
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=30)),
    "week": (timedelta(days=7), timedelta(hours=4)),
}


class DateBin(Func):
    """PostgreSQL's date_bin(stride, source, origin): the start of the bucket `source` falls in."""

    function = "date_bin"
    output_field = DateTimeField()

    def __init__(self, stride: timedelta, source: Any, origin: datetime):
        super().__init__(
            Value(stride, output_field=DurationField()), source, Value(origin), output_field=DateTimeField()
        )


def history(period: str = "hour", *, now: datetime | None = None) -> dict[str, Any]:
    """Runs finished and spend per minute by what the runs were for (KIND_GROUPS), provider errors
    by kind (a share of calls), and p50 and p95 call latency per worker, in buckets that fit the
    period. The last hour is read from the rows, to the minute and with the runs in flight; a day
    or a week from the rollups of finished runs (routing.folds: half hours for a day, four hours
    for a week, latency percentiles from a histogram)."""
    length, stride = PERIODS[period]
    now = now or timezone.now()
    # Buckets aligned to their stride (a day's on the half hour, a week's on 4 hours UTC).
    origin = folds.SLOT_ORIGIN + (now - length - folds.SLOT_ORIGIN) // stride * stride
    buckets = [origin + stride * i for i in range(int((now - origin) / stride) + 1)]
    charts = _HistoryCharts(buckets, stride)
    end = buckets[-1] + stride  # a run ending while this is read falls in no bucket yet
    if stride < folds.SLOT:
        charts.from_rows(origin, end)
    else:
        charts.from_rollups(origin, end)
    return charts.as_dict(period)


class _HistoryCharts:
    """The overview's history series, one value per bucket, filled from the rows or the folds."""

    def __init__(self, buckets: list[datetime], stride: timedelta) -> None:
        self.buckets = buckets
        self.stride = stride
        self.at = {b: i for i, b in enumerate(buckets)}
        self.runs: dict[str, list[float]] = {}
        self.calls = self.series()
        self.errors: dict[str, list[float]] = {}
        self.spend: dict[str, list[float]] = {}  # per minute, by what the runs were for
        self.latency: dict[str, dict[str, list[float | None]]] = {}

    def series(self) -> list[float]:
        return [0.0] * len(self.buckets)

    def add_runs(self, bucket: datetime, kind: str, n: int) -> None:
        self.runs.setdefault(kind_group(kind), self.series())[self.at[bucket]] += n

    def add_calls(self, bucket: datetime, kind: str, status: str, n: int, cost: Any) -> None:
        index = self.at[bucket]
        self.calls[index] += n
        self.spend.setdefault(kind_group(kind), self.series())[index] += float(cost or 0) / (
            self.stride.total_seconds() / 60
        )
        if status in Attempt.ERRORS:
            self.errors.setdefault(status, self.series())[index] += n

    def worker_latency(self, worker: str) -> dict[str, list[float | None]]:
        return self.latency.setdefault(
            worker, {"p50": [None] * len(self.buckets), "p95": [None] * len(self.buckets)}
        )

    def from_rows(self, origin: datetime, end: datetime) -> None:
        """The last hour, to the minute, from the runs' and attempts' rows."""
        stride = self.stride
        for row in (
            Run.objects.filter(finished_at__gte=origin, finished_at__lt=end)
            .order_by()
            .values("kind", bucket=DateBin(stride, F("finished_at"), folds.SLOT_ORIGIN))
            .annotate(n=Count("pk"))
        ):
            self.add_runs(row["bucket"], row["kind"], row["n"])
        attempts = Attempt.objects.filter(finished_at__gte=origin, finished_at__lt=end).order_by()
        for row in attempts.values(
            "status", kind=F("step__run__kind"), bucket=DateBin(stride, F("finished_at"), folds.SLOT_ORIGIN)
        ).annotate(n=Count("pk"), cost=Sum("cost_usd")):
            self.add_calls(row["bucket"], row["kind"], row["status"], row["n"], row["cost"])
        for row in (
            attempts.filter(status=Attempt.Status.SUCCEEDED, latency_ms__isnull=False)
            .values(
                worker=F("step__worker_slug"), bucket=DateBin(stride, F("finished_at"), folds.SLOT_ORIGIN)
            )
            .annotate(p50=Percentile("latency_ms", 0.5), p95=Percentile("latency_ms", 0.95))
        ):
            w = self.worker_latency(row["worker"])
            w["p50"][self.at[row["bucket"]]] = row["p50"]
            w["p95"][self.at[row["bucket"]]] = row["p95"]

    def from_rollups(self, origin: datetime, end: datetime) -> None:
        """A day or a week, from the rollups of finished runs (folded first)."""
        folds.fold_for_read()
        rows = (
            OpsRollup.objects.filter(span_min=folds.ops_span(self.stride), slot__gte=origin, slot__lt=end)
            .order_by()
            .annotate(bucket=DateBin(self.stride, F("slot"), folds.SLOT_ORIGIN))
        )
        for row in rows.filter(series="run").values("bucket", "run_kind").annotate(n=Sum("n")):
            self.add_runs(row["bucket"], row["run_kind"], row["n"])
        for row in (
            rows.filter(series="call")
            .values("bucket", "run_kind", "status")
            .annotate(n=Sum("n"), cost=Sum("cost_usd"))
        ):
            self.add_calls(row["bucket"], row["run_kind"], row["status"], row["n"], row["cost"])
        histograms: dict[str, dict[int, dict[int, int]]] = {}  # worker -> bucket index -> latency bucket -> n
        for row in (
            rows.filter(series="call", latency_bucket__gt=0)
            .values("bucket", "worker_slug", "latency_bucket")
            .annotate(n=Sum("n"))
        ):
            cells = histograms.setdefault(row["worker_slug"], {}).setdefault(self.at[row["bucket"]], {})
            cells[row["latency_bucket"]] = cells.get(row["latency_bucket"], 0) + row["n"]
        for worker, cells in histograms.items():
            w = self.worker_latency(worker)
            for index, counts in cells.items():
                w["p50"][index] = folds.quantile(counts, 0.5)
                w["p95"][index] = folds.quantile(counts, 0.95)

    def as_dict(self, period: str) -> dict[str, Any]:
        error_rate = {
            kind: [e / c if c else None for e, c in zip(n, self.calls, strict=True)]
            for kind, n in self.errors.items()
        }
        return {
            "period": period,
            "bucket_s": int(self.stride.total_seconds()),
            "buckets": [b.isoformat() for b in self.buckets],
            "runs": dict(sorted(self.runs.items())),
            "calls": self.calls,
            "error_rate": dict(sorted(error_rate.items())),
            "latency_ms": dict(sorted(self.latency.items())),
            "spend_usd_per_min": dict(sorted(self.spend.items())),
        }


QUEUES = ("runs", "resume", "maintenance", "training")  # the app's Celery queues, before their prefix


def queue_depths() -> list[dict[str, Any]]:
    """Messages waiting in each of the app's Celery queues, as the broker counts them. A queue the
    broker does not know waits for nothing (Redis drops an emptied list); None: the broker could
    not be asked."""
    out = []
    try:
        with current_app.connection_for_read() as conn:
            channel = conn.default_channel
            for name in QUEUES:
                queue = settings.CONDUCTOR_QUEUE_PREFIX + name
                try:
                    depth: int | None = channel.queue_declare(queue=queue, passive=True).message_count
                except ChannelError:  # NOT_FOUND: no message, or no worker ever declared it
                    depth = 0
                out.append({"queue": name, "waiting": depth})
    except (OSError, OperationalError):  # the broker away
        return [{"queue": name, "waiting": None} for name in QUEUES]
    return out


WORKERS_ALIVE_TTL_S = 10  # the overview re-reads every few seconds


def workers_alive() -> list[str]:
    """The Celery workers that answered a ping (their host names), asked at most every few seconds.
    A ping waits for answers until its timeout unless told how many to expect: the workers present
    (each worker's main process holds its presence lock while it lives, routing.presence) are that
    number, so the ping ends once they have all answered, and is not sent when none is present.
    Without it every first load of the overview waited the whole timeout."""
    alive = cache.get("ops.workers_alive")
    if alive is None:
        expected = len(presence.present())
        try:
            replies = current_app.control.ping(timeout=0.5, limit=expected) if expected else []
        except Exception:  # noqa: BLE001 - the broker away: nobody can be seen alive
            replies = []
        alive = sorted(name for reply in replies for name in reply)
        cache.set("ops.workers_alive", alive, WORKERS_ALIVE_TTL_S)
    return alive


# What the local model's state file says (conductor_web.local_model writes it), as the overview shows it.
LOCAL_MODEL_STATES = {
    "installing": f"its server is built once per machine ({BUILD_TIME}); the replay pool answers the "
    "recorded benchmark items meanwhile, and free text waits for it",
    "starting": "its server is loading the model",
    "up": "free text goes to it",
    "failed": "",
    "stopped": "",
}


def local_model_state() -> dict[str, Any] | None:
    """The local model's state (None where it was never brought up here): what, since when, why."""
    try:
        record = json.loads(settings.LOCAL_MODEL_STATE_FILE.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("state") not in LOCAL_MODEL_STATES:
        return None
    return {
        "state": record["state"],
        "text": LOCAL_MODEL_STATES[record["state"]],
        "since": parse_datetime(str(record.get("since") or "")),
        "api_base": str(record.get("api_base") or ""),
        "step": str(record.get("step") or "") if record["state"] == "installing" else "",
        "reason": state_reason(record),
    }
