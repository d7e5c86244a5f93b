"""Prometheus metrics read from the record at scrape time: provider calls by worker, vendor and
outcome, their latency, spend, runs by status and conductor version, queue depths and the audit
chain's checkpoint lag.

Every figure is an aggregate over PostgreSQL rows that the engine writes in its transactions, so it
is the same whichever process (web, Celery worker, pool process) did the work, and survives their
restarts: no per-process state to merge, which is what the client's multiprocess mode would
otherwise be for. Counters only grow as rows are added (retention empties a task's content, never
its attempts or runs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count, F, Q, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from audit.checkpoints import checkpoint_latest
from audit.models import AuditEvent
from operations.overview import figures
from routing.models import Attempt, Decision, Run

# Provider-call latency buckets, in seconds (Prometheus' convention), each an upper bound.
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PREFIX = "conductor"


class RecordCollector(Collector):
    """The app's own metrics, computed from the record on each scrape."""

    def collect(self) -> Iterator[Any]:
        yield from self._attempts()
        yield from self._latency()
        yield from self._planning()
        yield from self._runs()
        yield from self._queues()
        yield from self._audit()

    def _attempts(self) -> Iterator[Any]:
        calls = CounterMetricFamily(
            f"{PREFIX}_attempts",
            "Provider calls made, by worker, vendor and outcome",
            labels=["worker", "vendor", "status"],
        )
        spend = CounterMetricFamily(
            f"{PREFIX}_spend_usd",
            "USD spent on provider calls, by worker and vendor",
            labels=["worker", "vendor"],
        )
        spent: dict[tuple[str, str], float] = {}
        for row in (
            Attempt.objects.order_by()
            .values("status", worker=F("step__worker_slug"), vendor=F("step__vendor"))
            .annotate(n=Count("pk"), cost=Sum("cost_usd"))
        ):
            calls.add_metric([row["worker"], row["vendor"], row["status"]], row["n"])
            key = (row["worker"], row["vendor"])
            spent[key] = spent.get(key, 0.0) + float(row["cost"] or 0)
        for (worker, vendor), usd in sorted(spent.items()):
            spend.add_metric([worker, vendor], usd)
        yield calls
        yield spend

    def _latency(self) -> Iterator[Any]:
        histogram = HistogramMetricFamily(
            f"{PREFIX}_attempt_latency_seconds",
            "Provider-call latency per worker (calls that ended)",
            labels=["worker"],
        )
        buckets = {
            f"le_{i}": Count("pk", filter=Q(latency_ms__lte=bound * 1000))
            for i, bound in enumerate(LATENCY_BUCKETS_S)
        }
        rows: Any = (  # the buckets' keys are made here: a dict, not the stubs' TypedDict
            Attempt.objects.filter(latency_ms__isnull=False)
            .order_by()
            .values(worker=F("step__worker_slug"))
            .annotate(n=Count("pk"), total_ms=Sum("latency_ms"), **buckets)
            .order_by("worker")
        )
        for row in rows:
            cumulative = [(str(bound), row[f"le_{i}"]) for i, bound in enumerate(LATENCY_BUCKETS_S)]
            histogram.add_metric(
                [row["worker"]], [*cumulative, ("+Inf", row["n"])], sum_value=(row["total_ms"] or 0) / 1000
            )
        yield histogram

    def _planning(self) -> Iterator[Any]:
        plans = CounterMetricFamily(
            f"{PREFIX}_plans",
            "Plans the conductor wrote, by version and whether they were valid",
            labels=["version", "valid"],
        )
        spend = CounterMetricFamily(
            f"{PREFIX}_planning_spend_usd", "USD spent planning, by conductor version", labels=["version"]
        )
        spent: dict[str, float] = {}
        for row in (
            Decision.objects.order_by()
            .values("version_name", "valid")
            .annotate(n=Count("pk"), cost=Sum("cost_usd"))
            .order_by("version_name", "valid")
        ):
            plans.add_metric([row["version_name"], str(row["valid"]).lower()], row["n"])
            spent[row["version_name"]] = spent.get(row["version_name"], 0.0) + float(row["cost"] or 0)
        for version, usd in spent.items():
            spend.add_metric([version], usd)
        yield plans
        yield spend

    def _runs(self) -> Iterator[Any]:
        runs = GaugeMetricFamily(
            f"{PREFIX}_runs",
            "Runs by status, conductor version and kind (live, retry, shadow, rollout, evaluation)",
            labels=["status", "conductor_version", "kind"],
        )
        for row in (
            Run.objects.order_by()
            .values("status", "kind", version=F("conductor_version__name"))
            .annotate(n=Count("pk"))
            .order_by("status", "version", "kind")
        ):
            runs.add_metric([row["status"], row["version"] or "", row["kind"]], row["n"])
        yield runs

    def _queues(self) -> Iterator[Any]:
        depth = GaugeMetricFamily(
            f"{PREFIX}_queue_depth", "Messages waiting in each Celery queue", labels=["queue"]
        )
        for row in figures.queue_depths():
            if row["waiting"] is not None:  # the broker could not be asked: no sample, rather than a false 0
                depth.add_metric([row["queue"]], row["waiting"])
        yield depth

    def _audit(self) -> Iterator[Any]:
        latest = checkpoint_latest()
        lag = GaugeMetricFamily(
            f"{PREFIX}_audit_checkpoint_age_seconds",
            "Seconds since the last signed checkpoint of the audit chains (events after it are protected by "
            "their hashes only)",
        )
        behind = GaugeMetricFamily(
            f"{PREFIX}_audit_events_after_checkpoint", "Audit events written since the last signed checkpoint"
        )
        if latest is not None:
            lag.add_metric([], (timezone.now() - latest.created_at).total_seconds())
            behind.add_metric([], AuditEvent.objects.filter(occurred_at__gt=latest.created_at).count())
        yield lag
        yield behind
