"""Throughput of the bulk paths: the learned conductor's decisions as the engine makes them, the GRPO
dataset build, and the streamed audit export.

    CONDUCTOR_VAR_DIR=/tmp/bench-throughput python -m bench.throughput --samples 160000 --events 1000000
    CONDUCTOR_VAR_DIR=/tmp/bench-throughput python -m bench.throughput --grpo-only --samples 160000

Runs against a private database (the embedded one when DATABASE_URL is unset). Decisions: a learned
conductor is trained on the replay data (`train_conductor`), then replay tasks run through the engine
with it; the figures are the recorded `Decision.latency_ms` (what a run waited, a conductor build
included) and, to the microsecond, the same call (`conductor_load` + `propose`) repeated. GRPO: real
rollouts of that conductor run through the engine, then are cloned in SQL (new tasks, runs, plans and
rollout rows, same shapes) up to --samples, and `dataset_build` is timed with its peak memory. Export:
--events rows of a synthetic chain, streamed as CSV and JSON Lines through the view's generators.
Prints JSON lines; --write adds a section to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path

from bench.cpu import database_cpu_s
from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from audit.exports import stream_csv, stream_jsonl  # noqa: E402
from audit.models import AuditEvent  # noqa: E402
from audit.services import Actor  # noqa: E402
from routing import engine, replay  # noqa: E402
from routing.conductors import conductor_load  # noqa: E402
from routing.engine.planning import plan_request, screened_workers  # noqa: E402
from routing.models import ConductorVersion, Decision, Task  # noqa: E402
from routing.services import TaskSubmission, conductor_activate, task_submit  # noqa: E402
from training.models import Rollout  # noqa: E402
from training.services import dataset_build, dataset_files, rollouts_start  # noqa: E402

ACTOR = Actor.service("bench")
RUN = uuid.uuid4().hex[:8]  # this run of the benchmark


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def emit(figure: dict) -> dict:
    print(json.dumps(figure), flush=True)
    return figure


def peak_rss_reset() -> None:
    """Linux: start counting the peak resident set size from now (VmHWM)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def learned_version() -> ConductorVersion:
    """The benchmark's learned conductor, active: trained on the first run against this database,
    taken again (and made active) on the next ones."""
    version = ConductorVersion.objects.filter(name="bench-learned").first()
    if version is None:
        call_command("train_conductor", "bench-learned", "--limit", "200", "--activate", verbosity=0)
        return ConductorVersion.objects.get(name="bench-learned")
    return conductor_activate(version=version, actor=ACTOR)


def decisions(version: ConductorVersion, tasks: int, repeat: int) -> dict:
    items = replay.read_items(replay.split_path("dev"))[:tasks]
    made = []
    for item in items:
        task, _ = task_submit(
            # a key of this run's own: an earlier run's tasks ran already, and their decisions with them
            submission=TaskSubmission.of_replay(item, idempotency_key=f"bench-throughput:{RUN}:{item.id}"),
            source=Task.Source.CLI,
        )
        run = task.runs.get()
        engine.execute_run(run.pk)
        made.append(task)
    recorded = list(
        Decision.objects.filter(run__task__in=made, backend=version.backend).values_list(
            "latency_ms", flat=True
        )
    )
    # The same call, timed to the microsecond: the cached conductor and its plan for each task.
    timings = []
    for task in made:
        workers, _ = screened_workers(task)
        request = plan_request(task, workers, remaining_steps=task.max_steps, depth=0)
        for _ in range(repeat):
            started = time.perf_counter()
            conductor, _ = conductor_load(version)
            conductor.propose(request)
            timings.append((time.perf_counter() - started) * 1000)
    return emit(
        {
            "figure": "learned decision",
            "engine_decisions": len(recorded),
            "recorded_p50_ms": percentile(recorded, 0.5),
            "recorded_p95_ms": percentile(recorded, 0.95),
            "recorded_max_ms": max(recorded),
            "calls": len(timings),
            "call_p50_ms": round(percentile(timings, 0.5), 3),
            "call_p95_ms": round(percentile(timings, 0.95), 3),
        }
    )


def _columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND is_generated = 'NEVER' "
            "ORDER BY ordinal_position",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def _clone(cursor, table: str, source: str, overrides: dict[str, str]) -> None:
    """INSERT INTO table SELECT every column of `o` (the old row in `source`), some replaced."""
    columns = [c for c in _columns(table) if c != "id" or "id" in overrides]
    values = [overrides.get(c, f"o.{c}") for c in columns]
    cursor.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)} {source}")


def rollouts(version: ConductorVersion, *, items: int, k: int, samples: int) -> int:
    """Real rollouts through the engine, then cloned in SQL up to `samples` rollout rows."""
    found = [i.id for i in replay.read_items(replay.split_path("train"))[:items]]
    batch = rollouts_start(version=version, items=found, k=k, temperature=1.0, actor=ACTOR)
    for run_id in Rollout.objects.filter(batch=batch).values_list("run_id", flat=True):
        engine.execute_run(run_id)
    real = Rollout.objects.filter(batch=batch).count()
    copies = max(0, samples // real - 1)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE bench_g AS SELECT generate_series(1, %s) AS g", [copies])
        cursor.execute(
            "CREATE TEMP TABLE bench_tasks AS SELECT r.task_id AS old_id, g.g, gen_random_uuid() AS new_id "
            "FROM (SELECT DISTINCT task_id FROM training_rollout WHERE batch_id = %s) r CROSS JOIN bench_g g",
            [batch.pk],
        )
        _clone(
            cursor,
            "routing_task",
            "FROM bench_tasks m JOIN routing_task o ON o.id = m.old_id",
            {"id": "m.new_id", "idempotency_key": "NULL", "source_item": "o.source_item || '#' || m.g"},
        )
        cursor.execute(
            "CREATE TEMP TABLE bench_runs AS SELECT r.run_id AS old_id, r.task_id AS old_task, g.g, "
            "nextval(pg_get_serial_sequence('routing_run', 'id')) AS new_id "
            "FROM training_rollout r CROSS JOIN bench_g g WHERE r.batch_id = %s",
            [batch.pk],
        )
        _clone(
            cursor,
            "routing_run",
            "FROM bench_runs m JOIN routing_run o ON o.id = m.old_id "
            "JOIN bench_tasks t ON t.old_id = m.old_task AND t.g = m.g",
            {"id": "m.new_id", "task_id": "t.new_id", "correlation_id": "gen_random_uuid()"},
        )
        _clone(
            cursor,
            "routing_decision",
            "FROM bench_runs m JOIN routing_decision o ON o.run_id = m.old_id AND o.depth = 0",
            {"run_id": "m.new_id"},
        )
        _clone(
            cursor,
            "training_rollout",
            "FROM bench_runs m JOIN training_rollout o ON o.run_id = m.old_id "
            "JOIN bench_tasks t ON t.old_id = m.old_task AND t.g = m.g",
            {"run_id": "m.new_id", "task_id": "t.new_id", "item": "o.item || '#' || m.g"},
        )
        cursor.execute("ANALYZE")
        cursor.execute("DROP TABLE bench_g, bench_tasks, bench_runs")
    emit(
        {
            "figure": "rollouts",
            "real": real,
            "cloned": Rollout.objects.filter(batch=batch).count() - real,
            "clone_s": round(time.perf_counter() - started, 1),
        }
    )
    return batch.pk


def plans_read(batch_id: int) -> tuple[float, int]:
    """The floor under a build: the batch's plans alone, streamed out of PostgreSQL into Python strings
    (seconds, bytes), as the build's cursor reads them and nothing done with them."""
    from django.db import transaction

    started, size = time.perf_counter(), 0
    with transaction.atomic():
        cursor = connection.chunked_cursor()
        cursor.execute(
            "SELECT d.raw_output FROM training_rollout r JOIN routing_decision d ON d.run_id = r.run_id "
            "WHERE r.batch_id = %s AND d.depth = 0",
            [batch_id],
        )
        while rows := cursor.fetchmany(2000):
            size += sum(len(text.encode()) for (text,) in rows)
        cursor.close()
    return time.perf_counter() - started, size


def grpo(batch_id: int, name: str) -> dict:
    samples = Rollout.objects.filter(batch_id=batch_id).count()
    before = rss_mib()
    peak_rss_reset()
    db_before, cpu_before = database_cpu_s(connection), time.process_time()
    started = time.perf_counter()
    dataset = dataset_build(name=name, batch_ids=[batch_id], min_group_size=2, actor=ACTOR)
    took = time.perf_counter() - started
    # Where the build's CPU went: this process (all its threads) and the database server; on this
    # machine's cores, their sum over the wall time says how close the build is to being CPU-bound.
    build_cpu, db_after = time.process_time() - cpu_before, database_cpu_s(connection)
    db_cpu = None if db_before is None or db_after is None else db_after - db_before
    written = sum(path.stat().st_size for path in dataset_files(dataset).values())
    floor_s, plan_bytes = plans_read(batch_id)  # after the build: its reads find no cache warmed for them
    return emit(
        {
            "figure": "GRPO dataset build",
            "samples": samples,
            "groups": dataset.counts["groups"],
            "completions": dataset.counts["completions"],
            "seconds": round(took, 2),
            "samples_per_s": round(samples / took),
            "build_cpu_s": round(build_cpu, 2),
            "database_cpu_s": None if db_cpu is None else round(db_cpu, 2),
            "plan_bytes_per_sample": round(plan_bytes / samples),
            "files_mib": round(written / 2**20, 1),
            "files_mib_per_s": round(written / 2**20 / took, 1),
            "plans_read_alone_s": round(floor_s, 2),
            "plans_read_alone_samples_per_s": round(samples / floor_s),
            "peak_rss_growth_mib": round(peak_rss_mib() - before, 1),
        }
    )


def export(events: int) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO audit_auditevent (chain, seq, prev_hash, hash, occurred_at, actor_type, actor_id,
                actor_name, action, object_type, object_id, task_id, correlation_id, payload)
            SELECT 'bench-export', g, md5(g::text) || md5(g::text), md5((g + 1)::text) || md5(g::text),
                now() - make_interval(secs => g), 'system', '', 'engine', 'step.succeeded', 'step', g::text,
                gen_random_uuid(), gen_random_uuid(),
                jsonb_build_object('index', mod(g, 4), 'worker', 'gpt-4o-mini-2024-07-18', 'cost_usd', '0.0001234',
                    'input_tokens', 345, 'output_tokens', 120, 'latency_ms', 812,
                    'response_sha256', md5(g::text) || md5(g::text))
            FROM generate_series(1, %s) g
            """,
            [events],
        )
        cursor.execute("ANALYZE audit_auditevent")
    out = []
    qs = AuditEvent.objects.filter(chain="bench-export")
    for fmt, stream in (("csv", stream_csv), ("jsonl", stream_jsonl)):
        before = rss_mib()
        peak_rss_reset()
        started = time.perf_counter()
        size = 0
        for chunk in stream(qs, filters={"chain": "bench-export"}):
            size += len(chunk)
        took = time.perf_counter() - started
        out.append(
            emit(
                {
                    "figure": f"audit export ({fmt})",
                    "rows": events,
                    "seconds": round(took, 2),
                    "rows_per_s": round(events / took),
                    "mib_per_s": round(size / took / 2**20, 1),
                    "peak_rss_growth_mib": round(peak_rss_mib() - before, 1),
                }
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decision-tasks", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=50, help="timed calls per task")
    parser.add_argument("--items", type=int, default=20, help="replay items rolled out for real")
    parser.add_argument("--k", type=int, default=8, help="samples per item (the GRPO group)")
    parser.add_argument("--samples", type=int, nargs="+", default=[20_000, 160_000])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--grpo-only", action="store_true", help="only the rollouts and the GRPO builds")
    parser.add_argument("--builds", type=int, default=1, help="builds of each batch (the first is recorded)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.grpo_only and args.write:
        parser.error("--write needs every figure: leave out --grpo-only")

    call_command("migrate", verbosity=0)
    call_command("load_replay_pool", verbosity=0)
    version = learned_version()
    decided = {} if args.grpo_only else decisions(version, args.decision_tasks, args.repeat)
    builds = []
    for n in args.samples:
        batch_id = rollouts(version, items=args.items, k=args.k, samples=n)
        builds.append(grpo(batch_id, f"bench-{n}"))
        for again in range(1, args.builds):  # the same batch built again: how much a build varies
            grpo(batch_id, f"bench-{n}-again-{again}")
    exported = [] if args.grpo_only else export(args.events)

    if args.write:
        lines = [
            f"`python -m bench.throughput --samples {' '.join(map(str, args.samples))} --events {args.events}` "
            f"on {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"the embedded PostgreSQL. Goals: decision p95 < 5 ms, GRPO build and export >= 100k rows/s "
            "in bounded memory.",
            "",
            "| path | size | rate | p50 / p95 | peak memory growth |",
            "|---|---|---|---|---|",
            f"| learned conductor decision, recorded by the engine ({decided['engine_decisions']} decisions) "
            f"| - | - | {decided['recorded_p50_ms']} / {decided['recorded_p95_ms']} ms | - |",
            f"| learned conductor decision, the same call timed ({decided['calls']} calls) | - | - "
            f"| {decided['call_p50_ms']} / {decided['call_p95_ms']} ms | - |",
        ]
        for b in builds:
            lines.append(
                f"| GRPO dataset build ({b['groups']:,} groups, {b['plan_bytes_per_sample']:,} bytes of plan "
                f"a sample) | {b['samples']:,} samples | {b['samples_per_s']:,} samples/s "
                f"({b['files_mib_per_s']} MiB/s of files) | - | {b['peak_rss_growth_mib']} MiB |"
            )
            lines.append(
                f"| the same build's CPU: its process (every thread) / PostgreSQL | - "
                f"| {b['build_cpu_s']} / {b['database_cpu_s']} s | - | - |"
            )
            lines.append(
                f"| the same batch's plans alone, read out of PostgreSQL | {b['samples']:,} plans "
                f"| {b['plans_read_alone_samples_per_s']:,} plans/s | - | - |"
            )
        for e in exported:
            lines.append(
                f"| {e['figure']} | {e['rows']:,} events | {e['rows_per_s']:,} rows/s ({e['mib_per_s']} MiB/s) "
                f"| - | {e['peak_rss_growth_mib']} MiB |"
            )
        largest = max(builds, key=lambda b: b["samples"])
        lines += [
            "",
            f"The GRPO build is {'at' if largest['samples_per_s'] >= 100_000 else 'under'} its goal of 100k "
            f"samples/s: {largest['samples_per_s']:,} at {largest['samples']:,} samples, writing "
            f"{largest['files_mib']} MiB of files (JSON Lines, hashed as written, and Parquet). Each sample "
            f"carries its plan, {largest['plan_bytes_per_sample']:,} bytes here: the goal asks for about "
            f"{round(largest['plan_bytes_per_sample'] * 100_000 / 2**20)} MiB/s of plans. PostgreSQL alone "
            f"hands the batch's plans to Python at {largest['plans_read_alone_samples_per_s']:,} plans/s on "
            "this machine, before anything is rewarded, encoded, hashed or written; the rate of a build is "
            "bounded by that and by the files' bytes, which the build's CPUs share with the database.",
        ]
        write_section(
            "throughput", "## Throughput: decisions, GRPO dataset build, audit export\n\n" + "\n".join(lines)
        )
    median = statistics.median(b["samples_per_s"] for b in builds)
    emit({"figure": "summary", "grpo_samples_per_s_median": median})


if __name__ == "__main__":
    main()
