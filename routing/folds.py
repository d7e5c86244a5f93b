"""Rollups: the aggregate pages (analytics, the vendor report, the overview's day and week) read sums
kept per hour, not the rows.

A run's end writes one small row (PendingRollup) in its transaction; a fold adds the waiting runs'
steps, LLM-judge calls and the runs themselves to the rollups in one statement, in a transaction of its
own, and takes their rows out with it (`fold`). Folds are serialised by an advisory lock, so a run is
added once. A process folds at most every ROLLUP_FOLD_EVERY_S after a run of its own ends (off the run's
path: after its commit, and never waiting for another fold), and every page that reads the rollups folds
first, waiting for a fold in progress: what a page shows includes every run that ended before it was
asked, as when the runs were added at their end. Many runs in one fold cost the database far less
than one statement a run (their rows of an hour upserted once), and the runs' ends no longer lock the
hour's rollup rows in turn.

The same SQL over every finished run rebuilds them from the record (`manage.py rebuild_rollups`, and
the migration that created them), so a recount always equals what was kept. What a page shows is then
as fast at 10M steps as at 10k: it sums a few rows per hour of its window.

Finished runs only: a run in flight is folded in after it ends (the vendor report adds runs in flight from
their rows, so that no exposure waits for a run to end).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Q, QuerySet

from audit.rows import prepared_cursor
from routing.models import (
    CONDUCTOR_SLUG,
    Grain,
    OpsRollup,
    PendingRollup,
    RunRollup,
    TaskExposure,
    UsageRollup,
)

log = logging.getLogger(__name__)

FINISHED = "r.status IN ('succeeded', 'failed')"

# Every call that reached a worker (a step that started) or an LLM judge (a score.judged event whose
# judge was really asked), with what the pages group it by. `first_call`: the first call of its task
# to its vendor in this set, to count the task once per vendor (see TaskExposure).
_CALLS = """
runs AS (
    SELECT r.id, r.kind, r.task_id, r.correlation_id, cv.name AS conductor, t.classification, t.domain,
           t.created_at AS task_created_at
    FROM routing_run r
    JOIN routing_task t ON t.id = r.task_id
    JOIN routing_conductorversion cv ON cv.id = r.conductor_version_id
    WHERE {runs}
), calls AS (
    SELECT runs.*, 'step' AS source, s.worker_slug, s.vendor, s.started_at AS at,
           s.input_tokens::bigint AS input_tokens, s.output_tokens::bigint AS output_tokens, s.cost_usd
    FROM runs JOIN routing_step s ON s.run_id = runs.id
    WHERE s.started_at IS NOT NULL AND s.status <> 'pending'
    UNION ALL
    SELECT runs.*, 'judge', '', e.payload->>'vendor', e.occurred_at,
           (e.payload->>'input_tokens')::bigint, coalesce((e.payload->>'output_tokens')::bigint, 0),
           coalesce((e.payload->>'cost_usd')::numeric, 0)
    FROM runs JOIN audit_auditevent e ON e.chain = 'run:' || runs.correlation_id::text  -- the run's chain
    WHERE e.action = 'score.judged' AND coalesce((e.payload->>'input_tokens')::bigint, 0) > 0
      AND coalesce(e.payload->>'vendor', '') <> ''
), firsts AS (
    SELECT calls.*,
           row_number() OVER (PARTITION BY task_id, vendor ORDER BY at, source, worker_slug) = 1 AS first_call
    FROM calls
), pairs AS (
    INSERT INTO routing_taskexposure (task_id, vendor, classification, task_created_at, first_at, last_at)
    SELECT task_id, vendor, min(classification), min(task_created_at), min(at), max(at)
    FROM calls WHERE vendor <> ''
    GROUP BY task_id, vendor ORDER BY task_id, vendor
    ON CONFLICT (task_id, vendor) DO UPDATE
        SET first_at = LEAST(routing_taskexposure.first_at, EXCLUDED.first_at),
            last_at = GREATEST(routing_taskexposure.last_at, EXCLUDED.last_at)
    RETURNING task_id, vendor, (xmax = 0) AS inserted
)"""

_USAGE = """
INSERT INTO routing_usagerollup (grain, start, source, run_kind, conductor, worker_slug, vendor, classification,
                                 domain, calls, new_tasks, input_tokens, output_tokens, cost_usd)
SELECT g.grain, date_trunc(g.grain, f.at, 'UTC'), f.source, f.kind, f.conductor, f.worker_slug, f.vendor,
       f.classification, f.domain, count(*), count(*) FILTER (WHERE f.first_call AND p.inserted),
       sum(f.input_tokens), sum(f.output_tokens), sum(f.cost_usd)
FROM firsts f LEFT JOIN pairs p ON p.task_id = f.task_id AND p.vendor = f.vendor
CROSS JOIN (VALUES ('hour'), ('day')) g (grain)
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8, 9
ON CONFLICT (grain, start, source, run_kind, conductor, worker_slug, vendor, classification, domain) DO UPDATE
    SET calls = routing_usagerollup.calls + EXCLUDED.calls,
        new_tasks = routing_usagerollup.new_tasks + EXCLUDED.new_tasks,
        input_tokens = routing_usagerollup.input_tokens + EXCLUDED.input_tokens,
        output_tokens = routing_usagerollup.output_tokens + EXCLUDED.output_tokens,
        cost_usd = routing_usagerollup.cost_usd + EXCLUDED.cost_usd
"""

# The worker that gave the final answer: as routing.selectors.final_worker says (the last step to
# succeed that is not the conductor's own).
_RUNS = """
INSERT INTO routing_runrollup (grain, start, run_kind, conductor, classification, domain, final_worker, status,
                               runs, cost_usd, scored, score_sum, scored_cost_usd)
SELECT g.grain, date_trunc(g.grain, r.created_at, 'UTC'), r.kind, cv.name, t.classification, t.domain,
       coalesce(fw.worker_slug, ''), r.status, count(*), sum(r.cost_usd),
       count(*) FILTER (WHERE r.score IS NOT NULL), coalesce(sum(r.score), 0),
       coalesce(sum(r.cost_usd) FILTER (WHERE r.score IS NOT NULL), 0)
FROM routing_run r
JOIN routing_task t ON t.id = r.task_id
JOIN routing_conductorversion cv ON cv.id = r.conductor_version_id
LEFT JOIN LATERAL (
    SELECT s.worker_slug FROM routing_step s
    WHERE s.run_id = r.id AND s.status = 'succeeded' AND s.worker_slug <> %(conductor_slug)s
    ORDER BY s.finished_at DESC, s.id DESC LIMIT 1
) fw ON true
CROSS JOIN (VALUES ('hour'), ('day')) g (grain)
WHERE {runs}
GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8
ON CONFLICT (grain, start, run_kind, conductor, classification, domain, final_worker, status) DO UPDATE
    SET runs = routing_runrollup.runs + EXCLUDED.runs,
        cost_usd = routing_runrollup.cost_usd + EXCLUDED.cost_usd,
        scored = routing_runrollup.scored + EXCLUDED.scored,
        score_sum = routing_runrollup.score_sum + EXCLUDED.score_sum,
        scored_cost_usd = routing_runrollup.scored_cost_usd + EXCLUDED.scored_cost_usd
"""


# Latency histogram buckets (ms, lower bounds) of OpsRollup: bucket i holds [BOUNDS[i-1], BOUNDS[i]).
LATENCY_BOUNDS_MS = (0, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 120_000)
SLOT = timedelta(minutes=30)
SLOT_ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)
# OpsRollup's slot widths (minutes): the day's buckets, and the week's (a week of half hours was 336
# slots a series to sum at every visit).
OPS_SPANS = (30, 240)


def ops_span(stride: timedelta) -> int:
    """The widest slot of OpsRollup that a bucket of `stride` is made of."""
    return max(span for span in OPS_SPANS if stride % timedelta(minutes=span) == timedelta(0))


_OPS = """
INSERT INTO routing_opsrollup (span_min, slot, series, run_kind, worker_slug, status, latency_bucket, n, cost_usd)
SELECT w.span_min, date_bin(make_interval(mins => w.span_min), calls.at, %(origin)s), series, run_kind,
       worker_slug, status, latency_bucket, count(*), sum(cost_usd)
FROM (
    SELECT r.finished_at AS at, 'run' AS series, r.kind AS run_kind,
           '' AS worker_slug, r.status, 0 AS latency_bucket, 0::numeric AS cost_usd
    FROM routing_run r WHERE {runs} AND r.finished_at IS NOT NULL
    UNION ALL
    SELECT a.finished_at, 'call', r.kind, s.worker_slug, a.status,
           CASE WHEN a.status = 'succeeded' AND a.latency_ms IS NOT NULL
                THEN width_bucket(a.latency_ms, %(bounds)s::int[]) ELSE 0 END,
           a.cost_usd
    FROM routing_run r JOIN routing_step s ON s.run_id = r.id JOIN routing_attempt a ON a.step_id = s.id
    WHERE {runs} AND a.finished_at IS NOT NULL
) calls CROSS JOIN unnest(%(spans)s::int[]) AS w(span_min)
GROUP BY 1, 2, 3, 4, 5, 6, 7 ORDER BY 1, 2, 3, 4, 5, 6, 7
ON CONFLICT (span_min, slot, series, run_kind, worker_slug, status, latency_bucket) DO UPDATE
    SET n = routing_opsrollup.n + EXCLUDED.n, cost_usd = routing_opsrollup.cost_usd + EXCLUDED.cost_usd
"""


# The three rollups side by side in one statement, prepared on the server (planned once per
# connection: planning was most of their time). Each reads the runs' rows ({runs}: SQL on alias r),
# none another's. A recount reads every finished run; a fold the runs it takes out of PendingRollup.
_ROLLUPS = f"{_CALLS.strip()}, usage_rows AS ({_USAGE}), run_rows AS ({_RUNS}), ops_rows AS ({_OPS})"
_PARAMS = {
    "conductor_slug": CONDUCTOR_SLUG,
    "spans": list(OPS_SPANS),
    "origin": SLOT_ORIGIN,
    "bounds": list(LATENCY_BOUNDS_MS),
}


def quantile(counts: dict[int, int], q: float) -> float | None:
    """The q-quantile of a latency histogram ({bucket: calls}), interpolated within its bucket (as
    Prometheus's histogram_quantile does); the last bucket is taken as twice its lower bound wide."""
    total = sum(counts.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(counts):
        n = counts[bucket]
        if seen + n >= rank and n:
            low = LATENCY_BOUNDS_MS[bucket - 1]
            high = LATENCY_BOUNDS_MS[bucket] if bucket < len(LATENCY_BOUNDS_MS) else 2 * low
            return low + (high - low) * (rank - seen) / n
        seen += n
    return float(LATENCY_BOUNDS_MS[-1])


# The runs a fold takes: the oldest waiting, at most FOLD_BATCH a statement (a fold repeats until
# fewer are left), their rows taken out in the statement that adds them.
FOLD_BATCH = 2000
_FOLD = (
    "WITH taken AS (DELETE FROM routing_pendingrollup WHERE run_id IN "  # noqa: S608 - constants
    "(SELECT run_id FROM routing_pendingrollup ORDER BY run_id LIMIT %(limit)s) RETURNING run_id), "
    + _ROLLUPS.replace("{runs}", "r.id IN (SELECT run_id FROM taken)")
    + " SELECT count(*) FROM taken"
)
# Folds hold this advisory lock (transaction-scoped), so that two never take the same runs' rows.
FOLD_LOCK = (0x526F6C6C, 0)  # "Roll"


def fold(*, wait: bool = True) -> int:
    """Add the finished runs waiting for it to the rollups; how many. With `wait`, a fold in progress
    elsewhere is waited for (a reader then sees its runs too); without, this one gives way to it.

    A reader calls it before it reads: one indexed look when nothing waits. Call it outside a
    transaction: its lock is held to the end of the transaction it runs in."""
    with prepared_cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM routing_pendingrollup)")
        if not cursor.fetchone()[0]:
            return 0
    values = {**_PARAMS, "limit": FOLD_BATCH}
    folded = 0
    while True:
        with transaction.atomic(), prepared_cursor() as cursor:
            if wait:
                cursor.execute("SELECT pg_advisory_xact_lock(%s::int, %s::int)", FOLD_LOCK)
            else:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s::int, %s::int)", FOLD_LOCK)
                if not cursor.fetchone()[0]:
                    return folded
            cursor.execute(_FOLD, values)
            taken = cursor.fetchone()[0]
        folded += taken
        if taken < FOLD_BATCH:
            return folded


class _Folds:
    """When this process last folded after a run of its own ended (a fold every
    ROLLUP_FOLD_EVERY_S at most, whatever the number of runs)."""

    def __init__(self) -> None:
        self.last = float("-inf")
        self.lock = threading.Lock()

    def due(self) -> bool:
        now = time.monotonic()
        with self.lock:
            if now - self.last < settings.ROLLUP_FOLD_EVERY_S:
                return False
            self.last = now
            return True


_folds = _Folds()


def _fold_if_due() -> None:
    """After a run's commit: a failed fold (the database failing under it) is logged and leaves the
    runs waiting for the next one; the run that ended is not touched by it."""
    if not _folds.due():
        return
    try:
        fold(wait=False)
    except Exception:  # noqa: BLE001 - the run is done whatever happens here (a time limit included)
        log.warning(
            "folding the finished runs into the rollups failed; they wait for the next fold", exc_info=True
        )


def fold_for_read() -> None:
    """`fold` before a page reads the rollups. If the fold fails (the database failing under it, or
    a run whose rows its statement cannot take), the page shows the rollups as they are and the
    failure is logged: the waiting runs stay waiting, nothing is lost."""
    try:
        fold()
    except DatabaseError:
        log.error(
            "folding the finished runs into the rollups failed; the page shows them without", exc_info=True
        )


# A finished run's row waiting for the next fold; `{gate}`: a condition of the statement it is part of.
WAITS = (
    "INSERT INTO routing_pendingrollup (run_id) SELECT %(run_id)s WHERE true{gate} "
    "ON CONFLICT (run_id) DO NOTHING"
)


def run_waits(run_id: int) -> None:
    """From the transaction that ends a run: the run waits for a fold (its row, WAITS); this process
    folds after the commit if its last fold is older than ROLLUP_FOLD_EVERY_S."""
    with prepared_cursor() as cursor:
        cursor.execute(WAITS.format(gate=""), {"run_id": run_id})
    fold_after_commit()


def fold_after_commit() -> None:
    """After the commit of a run's end (its waiting row written, WAITS): fold, if due."""
    transaction.on_commit(_fold_if_due)


def rebuild() -> dict[str, int]:
    """Recount every rollup from the rows of the finished runs (none then waits for a fold). Runs ending
    meanwhile wait on the tables' lock and are folded after, once."""
    tables = [m._meta.db_table for m in (UsageRollup, RunRollup, TaskExposure, OpsRollup, PendingRollup)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s::int, %s::int)", FOLD_LOCK)
        if tables[-1] not in connection.introspection.table_names(cursor):
            tables.pop()  # the migrations that built the rollups came before the waiting runs' table
        cursor.execute(f"TRUNCATE {', '.join(tables)}")
        cursor.execute(f"WITH {_ROLLUPS.replace('{runs}', FINISHED)} SELECT 1", _PARAMS)
    return {m.__name__: m.objects.count() for m in (UsageRollup, RunRollup, TaskExposure, OpsRollup)}


def hour_floor(moment: datetime) -> datetime:
    """The start of the (UTC) hour `moment` falls in: the rollups' grain."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_ceil(moment: datetime) -> datetime:
    """The end of the hour `moment` falls in (itself when it is a whole hour)."""
    start = hour_floor(moment)
    return start if start == moment else start + timedelta(hours=1)


def window(
    qs: QuerySet[Any], since: datetime | None, until: datetime | None, *, days: bool = True
) -> QuerySet[Any]:
    """The rows of a rollup (UsageRollup, RunRollup) that sum [since, until) in whole hours: whole UTC
    days from the daily rows and the hours at either end from the hourly ones, so that a long window
    reads few rows; only hourly rows with days=False (a chart by the hour). None: unbounded.

    The finished runs waiting for a fold are folded first (every page's read of the rollups comes
    through here, or calls `fold_for_read` itself)."""
    fold_for_read()
    start = hour_floor(since) if since else None
    stop = hour_ceil(until) if until else None
    hourly = Q(grain=Grain.HOUR)
    if not days:
        return qs.filter(
            hourly, *([Q(start__gte=start)] if start else []), *([Q(start__lt=stop)] if stop else [])
        )
    first_day = _day_ceil(start) if start else None  # the first whole day inside the window
    end_day = _day_floor(stop) if stop else None  # the end of the last whole day
    if first_day and end_day and first_day >= end_day:  # no whole day inside: hours only
        return qs.filter(hourly, start__gte=start, start__lt=stop)
    daily = Q(grain=Grain.DAY)
    if first_day:
        daily &= Q(start__gte=first_day)
    if end_day:
        daily &= Q(start__lt=end_day)
    edges = Q(pk__in=[])
    if start:
        edges |= hourly & Q(start__gte=start, start__lt=first_day)
    if stop:
        edges |= hourly & Q(start__gte=end_day, start__lt=stop)
    return qs.filter(daily | edges)


def _day_floor(moment: datetime) -> datetime:
    return moment.replace(hour=0)  # an hour_floor'd UTC moment


def _day_ceil(moment: datetime) -> datetime:
    day = _day_floor(moment)
    return day if day == moment else day + timedelta(days=1)
