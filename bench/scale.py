"""Read paths at scale: build a long history fast, then time the pages users read, size by size.

    CONDUCTOR_VAR_DIR=/tmp/var-scale CONDUCTOR_REPLAY_DIR=<replay data> \
        python -m bench.scale --steps 100000 1000000 10000000 [--write]

1. A sample of real runs: the engine, in this process, runs some replay tasks (two static conductor
   versions, a shadow, rollouts, evaluations and retries), so that their rows and their hash-chained
   audit events and seals are real; a checkpoint signs them.
2. Growth: server-side SQL (INSERT ... SELECT over generate_series) clones the sample's tasks, runs,
   decisions, steps, attempts and audit events into older history at a fixed traffic rate
   (STEPS_PER_DAY, ending now), up to each size in turn. Ids are time-ordered (older rows, smaller
   ids: the real sample's sequences start above ID_BASE, the clones count down from it). Synthetic
   events get chains of their own and do not verify; the runs measured are the real ones.
3. After each growth: ANALYZE, `rebuild_rollups` when that command exists, then full HTTP GETs through
   django.test.Client (views, templates, middleware) as a user holding every role: median of the
   first 5 and p95 of 20 requests after a warm-up, and the streamed audit exports (rows/s, RSS growth).

Prints one JSON line per (size, path) and a table of p95 by size; --write adds the section
"Read paths at scale" to docs/benchmarks.md. Re-running with a larger size extends the same database.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command, get_commands  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.migrations.recorder import MigrationRecorder  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import NoReverseMatch, reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from accounts.models import Role  # noqa: E402
from audit.chain import run_chain  # noqa: E402
from audit.grants import user_set_roles  # noqa: E402
from audit.services import Actor  # noqa: E402
from audit.verify import verify  # noqa: E402
from routing import engine, replay  # noqa: E402
from routing.models import ConductorVersion, Run, Step, Task  # noqa: E402
from routing.services import TaskSubmission, conductor_activate, conductor_active, task_submit  # noqa: E402

STEPS_PER_DAY = 55_000
ID_BASE = 1_000_000_000  # the real rows' ids start above it; synthetic ones count down from it
KEY_PREFIX = "bench-scale:"
USERNAME = "bench-scale"
SLOW_MS = 250
CHUNK_TASKS = 50_000  # synthetic tasks per batch of INSERTs (one transaction each)
BUILD_THREADS = 2
# --lean: cloned steps and plans keep their shape but not their bodies (the messages sent, the answer,
# the conductor's prompt and output cut to 64 characters), so that 10M steps fit a laptop's disk.
# The real sample keeps everything.
LEAN = {"on": False}
# ... and their events without the content hashes no page reads (each event keeps its own hash).
LEAN_KEYS = (
    "ARRAY['sees_step_hashes', 'messages_sha256', 'response_sha256', 'final_answer_sha256', 'sees_steps']"
)
LEAN_NOTE = (
    " With --lean the cloned steps and plans carry no message bodies (64 characters of each) and their"
    " events no content hashes of what they saw: the rows and indexes the pages read are as they would"
    " be; the database is smaller (10M steps would take about 70 GB at full shape)."
)
EXPORT_DAYS = 2  # the audit export's period: about STEPS_PER_DAY * 3.5 events a day
TABLES = ("run", "decision", "step", "attempt")  # children of a task, cloned by template index

# A second static conductor version with wider workflows (several vendors, a checker that sees all):
# ~4 steps a run on the replay mix, beside static-v1's 1 to 3.
ENSEMBLE = {
    "rules": [
        {
            "name": "hard-math-ensemble",
            "when": {"domain": ["math-l5"]},
            "steps": [
                {"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []},
                {"worker": "gemini-1.5-flash", "instruction": "{task}", "access": []},
                {"worker": "claude-3-haiku-20240307", "instruction": "{task}", "access": []},
                {"worker": "meta-llama-3.1-70b-instruct", "instruction": "{task}", "access": []},
                {"worker": "qwen2-72b-instruct", "instruction": "{task}", "access": []},
                {
                    "worker": "gpt-4o-2024-08-06",
                    "instruction": "Five solvers answered the problem below. Check their work and give the "
                    "correct final answer.\n\n{task}",
                    "access": "all",
                },
            ],
        },
        {
            "name": "word-problems-vote",
            "when": {"domain": ["gsm8k"]},
            "steps": [
                {"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []},
                {"worker": "claude-3-haiku-20240307", "instruction": "{task}", "access": []},
                {"worker": "gemma-2-9b-it", "instruction": "{task}", "access": []},
                {"worker": "gpt-3.5-turbo-0125", "instruction": "{task}", "access": []},
                {
                    "worker": "claude-3-5-sonnet-20240620",
                    "instruction": "Four solvers answered the problem below. Give the correct final "
                    "answer.\n\n{task}",
                    "access": "all",
                },
            ],
        },
        {
            "name": "code-cross-check",
            "when": {"domain": ["cruxeval-o"]},
            "steps": [
                {"worker": "gpt-4o-2024-08-06", "instruction": "{task}", "access": []},
                {"worker": "gemini-1.5-pro", "instruction": "{task}", "access": []},
                {"worker": "qwen2-72b-instruct", "instruction": "{task}", "access": []},
                {
                    "worker": "claude-3-5-sonnet-20240620",
                    "instruction": "Three models predicted the output below. Give the correct output.\n\n{task}",
                    "access": "all",
                },
            ],
        },
        {
            "name": "default-cheap",
            "when": {},
            "steps": [{"worker": "gpt-4o-mini-2024-07-18", "instruction": "{task}", "access": []}],
        },
    ]
}


def sql(statement: str, params: dict | list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def one(statement: str, params: dict | list | None = None):
    return sql(statement, params)[0][0]


# --- The real sample ------------------------------------------------------------------------------


def execute_all(task: Task) -> None:
    for run in task.runs.order_by("id"):
        if run.status in ("queued", "running"):
            engine.execute_run(run.pk)


def build_sample(size: int) -> None:
    """Real runs of replay tasks, in process; the run messages task_submit sends stay in the broker."""
    call_command("load_replay_pool", verbosity=0)
    base = conductor_active()
    # Real rows from here on get ids above ID_BASE (the clones count down below it).
    for table in ("routing_run", "routing_decision", "routing_step", "routing_attempt", "audit_auditevent"):
        if one(f"SELECT coalesce(max(id), 0) FROM {table}") < ID_BASE:  # noqa: S608 - constant names
            sql("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, ID_BASE])
    ensemble, _ = ConductorVersion.objects.get_or_create(
        name="static-ensemble", defaults={"backend": ConductorVersion.Backend.STATIC, "config": ENSEMBLE}
    )
    items = random.Random(7).sample(replay.read_items(replay.split_path("dev")), size)
    actor = Actor.service("bench-scale")
    started = time.perf_counter()
    for i, item in enumerate(items):
        if i == size * 3 // 20:  # the first 15% under static-v1, the rest under the ensemble
            conductor_activate(version=ensemble, actor=actor)
            ConductorVersion.objects.filter(pk=base.pk).update(is_shadow=True)  # static-v1 shadows it
        if i == size * 9 // 40:
            ConductorVersion.objects.filter(pk=base.pk).update(is_shadow=False)
        classification = "confidential" if i % 20 == 19 else "internal" if i % 4 == 1 else "public"
        task, _ = task_submit(
            submission=TaskSubmission(
                text=item.task,
                reference=item.reference,
                domain=item.domain,
                source_item=item.id,
                classification=classification,
                idempotency_key=f"{KEY_PREFIX}{item.id}",
            ),
            source=Task.Source.API if i % 3 else Task.Source.WEB,
        )
        execute_all(task)
        extra = {5: Run.Kind.ROLLOUT, 17: Run.Kind.EVALUATION, 29: Run.Kind.RETRY}.get(i % 32)
        if extra:
            version = ConductorVersion.objects.get(is_active=True)
            Run.objects.create(
                task=task,
                conductor_version=version,
                kind=extra,
                temperature=0.7 if extra == Run.Kind.ROLLOUT else None,
            )
            execute_all(task)
    call_command("audit_checkpoint", verbosity=0)  # signs the real runs' sealed chains
    print(
        json.dumps(
            {
                "sample_tasks": size,
                "runs": Run.objects.count(),
                "steps": Step.objects.count(),
                "seconds": round(time.perf_counter() - started, 1),
            }
        ),
        flush=True,
    )


def build_templates() -> dict:
    """Index the sample's rows by (template task t, index j within the task); offsets per table."""
    for name in ("task", *TABLES, "event", "event_task", "meta"):
        sql(f"DROP TABLE IF EXISTS bench_scale_tpl_{name}")
    sql(
        """CREATE TABLE bench_scale_tpl_task AS
           SELECT (row_number() OVER (ORDER BY created_at DESC, id) - 1)::int AS t, id, created_at
           FROM routing_task WHERE idempotency_key LIKE %s""",
        [KEY_PREFIX + "%"],
    )
    parents = {
        "run": "JOIN bench_scale_tpl_task p ON p.id = x.task_id",
        "decision": "JOIN routing_run r ON r.id = x.run_id JOIN bench_scale_tpl_task p ON p.id = r.task_id",
        "step": "JOIN routing_run r ON r.id = x.run_id JOIN bench_scale_tpl_task p ON p.id = r.task_id",
        "attempt": "JOIN routing_step s ON s.id = x.step_id JOIN routing_run r ON r.id = s.run_id "
        "JOIN bench_scale_tpl_task p ON p.id = r.task_id",
        # A task's events, whatever their chain (its run chains, the seals in the global chain).
        "event": "JOIN bench_scale_tpl_task p ON p.id = x.task_id AND x.action <> 'record.viewed'",
    }
    sources = {"event": "audit_auditevent"}
    for name, join in parents.items():
        table = sources.get(name, f"routing_{name}")
        sql(
            f"""CREATE TABLE bench_scale_tpl_{name} AS
                WITH x AS (
                    SELECT x.id, p.t, (row_number() OVER (PARTITION BY p.t ORDER BY x.id) - 1)::int AS j
                    FROM {table} x {join}),
                n AS (SELECT t, count(*)::int + {1 if name == "event" else 0} AS n FROM x GROUP BY t),
                o AS (SELECT t, n, (sum(n) OVER (ORDER BY t) - n)::bigint AS off FROM n)
                SELECT x.id, x.t, x.j, o.n, o.off FROM x JOIN o USING (t)"""  # noqa: S608
        )
        sql(f"CREATE UNIQUE INDEX ON bench_scale_tpl_{name} (id)")
    # Events: which run's chain and correlation id they carry, which row they are about (by its index).
    sql(
        "ALTER TABLE bench_scale_tpl_event ADD COLUMN corr_j int, ADD COLUMN obj_kind text, ADD COLUMN obj_j int"
    )
    sql(
        """UPDATE bench_scale_tpl_event e SET corr_j = r.j FROM audit_auditevent a, routing_run x,
           bench_scale_tpl_run r WHERE a.id = e.id AND x.correlation_id = a.correlation_id AND r.id = x.id"""
    )
    sql(
        """UPDATE bench_scale_tpl_event e SET obj_kind = 'task'
           FROM audit_auditevent a WHERE a.id = e.id AND a.object_type = 'task'"""
    )
    for name in TABLES:
        sql(
            f"""UPDATE bench_scale_tpl_event e SET obj_kind = %s, obj_j = m.j
                FROM audit_auditevent a, bench_scale_tpl_{name} m
                WHERE a.id = e.id AND a.object_type = %s AND a.object_id ~ '^[0-9]+$'
                  AND m.id = a.object_id::bigint""",  # noqa: S608
            [name, name],
        )
    # Every template task, with its events' count (plus the slot of a synthetic judge event).
    sql(
        """CREATE TABLE bench_scale_tpl_event_task AS
           SELECT t.t, coalesce(max(e.n), 1) AS n FROM bench_scale_tpl_task t
           LEFT JOIN bench_scale_tpl_event e ON e.t = t.t GROUP BY t.t"""
    )
    sql("ALTER TABLE bench_scale_tpl_event_task ADD COLUMN off bigint")
    sql(
        """UPDATE bench_scale_tpl_event_task u SET off = o.off FROM (
           SELECT t, sum(n) OVER (ORDER BY t) - n AS off FROM bench_scale_tpl_event_task) o WHERE o.t = u.t"""
    )
    stats = {"tasks": one("SELECT count(*) FROM bench_scale_tpl_task")}
    for name in (*TABLES, "event"):
        stats[name] = one(
            f"SELECT coalesce(sum(n), 0) FROM (SELECT DISTINCT t, n FROM bench_scale_tpl_{name}) d"  # noqa: S608
        )
    stats["event"] = one("SELECT sum(n) FROM bench_scale_tpl_event_task")
    stats["anchor"] = one("SELECT min(created_at) FROM bench_scale_tpl_task").isoformat()
    stats["done"] = 0
    sql("CREATE TABLE bench_scale_tpl_meta (body text)")
    sql("INSERT INTO bench_scale_tpl_meta VALUES (%s)", [json.dumps(stats)])
    return stats


def meta() -> dict | None:
    if not one("SELECT to_regclass('bench_scale_tpl_meta') IS NOT NULL"):
        return None
    rows = sql("SELECT body FROM bench_scale_tpl_meta")
    return json.loads(rows[0][0]) if rows else None


def meta_save(stats: dict) -> None:
    sql("UPDATE bench_scale_tpl_meta SET body = %s", [json.dumps(stats)])


# --- Growth by SQL --------------------------------------------------------------------------------


def columns(table: str) -> list[str]:
    return [
        r[0]
        for r in sql(
            """SELECT column_name FROM information_schema.columns
               WHERE table_name = %s AND table_schema = current_schema() AND is_generated = 'NEVER'
               ORDER BY ordinal_position""",
            [table],
        )
    ]


def select_list(table: str, overrides: dict[str, str]) -> tuple[str, str]:
    """The table's columns and, for each, its override or the template row's value (s.<column>)."""
    names = columns(table)
    return ", ".join(names), ", ".join(overrides.get(n, f"s.{n}") for n in names)


def new_id(alias: str, table: str) -> str:
    """The id of the clone of template row `alias` (of bench_scale_tpl_<table>) in cycle c."""
    return f"({ID_BASE} - (c * %(T_{table})s + {alias}.off + ({alias}.n - 1 - {alias}.j) + 1))"


G = "(c * %(S)s + a.t)"  # the synthetic task's number: 0 is the newest, older as it grows
TASK_UUID = f"md5('bench-task-' || {G})::uuid"
FAILS = f"({G} %% 25 = 7)"  # 4% of tasks fail (their live runs, with a step error)


def corr(j: str) -> str:
    return f"md5('bench-run-' || {G} || '-' || {j})::uuid"


def shift(col: str) -> str:
    """A template time moved to the clone's: the task's created_at steps back STEPS_PER_DAY-wise."""
    return f"{col} + ((%(anchor)s::timestamptz - tt.created_at) - make_interval(secs => ({G} + 1) * %(dt)s))"


def grow(stats: dict, target_steps: int) -> dict:
    """Add synthetic tasks (older history) until the step count reaches target_steps."""
    have = Step.objects.count()
    steps_per_task = stats["step"] / stats["tasks"]
    if have >= target_steps * 0.99:  # grown already (the last task's steps overshoot or fall short a little)
        return stats
    add = max(0, math.ceil((target_steps - have) / steps_per_task))
    params = {
        "S": stats["tasks"],
        "anchor": stats["anchor"],
        "dt": 86400 * steps_per_task / STEPS_PER_DAY,  # seconds between tasks
        **{f"T_{name}": stats[name] for name in (*TABLES, "event")},
    }
    done = stats["done"]
    if add == 0:
        return stats
    # Fewer checkpoints during the bulk insert (the private server's own setting; reads are unaffected).
    sql(f"ALTER SYSTEM SET max_wal_size = '{'4GB' if LEAN['on'] else '16GB'}'")
    sql("SELECT pg_reload_conf()")
    indexes_drop()
    chunks = []
    while add > 0:
        n = min(add, CHUNK_TASKS)
        chunks.append((done, done + n - 1))
        done, add = done + n, add - n
    # Two connections (the machine's two cores), each inserting whole chunks in a transaction.
    with ThreadPoolExecutor(max_workers=BUILD_THREADS) as pool:
        for result in pool.map(lambda chunk: grow_chunk(stats, params, *chunk), chunks):
            print(json.dumps(result), flush=True)
    stats["done"] = done
    meta_save(stats)
    indexes_restore()
    return stats


GROWN = (
    "routing_task",
    "routing_run",
    "routing_decision",
    "routing_step",
    "routing_attempt",
    "audit_auditevent",
)


def indexes_drop() -> None:
    """Drop the grown tables' plain indexes (none that backs a constraint) for the bulk insert: built
    again afterwards in one pass each, which is far quicker than millions of random btree inserts.
    Their definitions are kept in the database first, so that an interrupted run restores them."""
    sql("CREATE TABLE IF NOT EXISTS bench_scale_tpl_indexes (name text PRIMARY KEY, definition text)")
    sql(
        """INSERT INTO bench_scale_tpl_indexes
           SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i
           JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
           WHERE t.relname = ANY(%s) AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)
           ON CONFLICT (name) DO NOTHING""",
        [list(GROWN)],
    )
    for (name,) in sql("SELECT name FROM bench_scale_tpl_indexes"):
        sql(f'DROP INDEX IF EXISTS "{name}"')


def indexes_restore() -> None:
    if not one("SELECT to_regclass('bench_scale_tpl_indexes') IS NOT NULL"):
        return
    started = time.perf_counter()
    sql("SET maintenance_work_mem = '2GB'")
    sql("SET max_parallel_maintenance_workers = 2")
    for name, definition in sql("SELECT name, definition FROM bench_scale_tpl_indexes ORDER BY name"):
        if not one("SELECT to_regclass(%s) IS NOT NULL", [f'"{name}"']):
            sql(definition)
    sql("RESET maintenance_work_mem")
    sql("RESET max_parallel_maintenance_workers")
    sql("DROP TABLE bench_scale_tpl_indexes")
    print(json.dumps({"indexes_rebuilt_s": round(time.perf_counter() - started, 1)}), flush=True)


def grow_chunk(stats: dict, params: dict, g_lo: int, g_hi: int) -> dict:
    params = {
        **params,
        "g_lo": g_lo,
        "g_hi": g_hi,
        "c_lo": g_lo // stats["tasks"],
        "c_hi": g_hi // stats["tasks"],
    }
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SET session_replication_role = replica"
            )  # no FK triggers: consistent by construction
            cursor.execute("SET synchronous_commit = off")
            cursor.execute("SET work_mem = '256MB'")
        with transaction.atomic():
            for statement in grow_statements():
                with connection.cursor() as cursor:
                    cursor.execute(statement, params)
    finally:
        connection.close()  # this thread's connection
    return {"grown_tasks": g_hi + 1, "chunk_s": round(time.perf_counter() - started, 1)}


def grow_statements() -> list[str]:
    cycles = "generate_series(%(c_lo)s, %(c_hi)s) c"
    in_range = f"{G} BETWEEN %(g_lo)s AND %(g_hi)s"
    out = []

    cols, values = select_list(
        "routing_task",
        {
            "id": TASK_UUID,
            "idempotency_key": "NULL",
            "submitted_by_id": "NULL",
            "classification": "CASE WHEN s.classification = 'confidential' THEN s.classification "
            f"ELSE (ARRAY['public','public','public','public','public','internal','internal','internal',"
            f"'confidential','confidential'])[1 + ({G} * 7) %% 10] END",
            "source": f"(ARRAY['api','api','api','api','api','api','web','web','cli','api'])[1 + {G} %% 10]",
            "status": f"CASE WHEN {FAILS} AND s.status = 'succeeded' THEN 'failed' ELSE s.status END",
            "error": f"CASE WHEN {FAILS} AND s.status = 'succeeded' THEN 'a step''s calls failed' ELSE s.error END",
            "score": f"CASE WHEN {FAILS} THEN NULL ELSE s.score END",
            "created_at": shift("s.created_at"),
            "finished_at": shift("s.finished_at"),
            "purged_at": "NULL",
        },
    )
    out.append(
        f"""INSERT INTO routing_task ({cols}) SELECT {values}
            FROM {cycles} CROSS JOIN bench_scale_tpl_task a JOIN routing_task s ON s.id = a.id
            JOIN bench_scale_tpl_task tt ON tt.t = a.t WHERE {in_range}"""  # noqa: S608
    )

    live_fails = f"{FAILS} AND s.kind IN ('live', 'retry') AND s.status = 'succeeded'"
    cols, values = select_list(
        "routing_run",
        {
            "id": new_id("a", "run"),
            "task_id": TASK_UUID,
            "correlation_id": corr("a.j"),
            "status": f"CASE WHEN {live_fails} THEN 'failed' ELSE s.status END",
            "stop_reason": f"CASE WHEN {live_fails} THEN 'step_failed' ELSE s.stop_reason END",
            "error": f"CASE WHEN {live_fails} THEN 'a step''s calls failed' ELSE s.error END",
            "score": f"CASE WHEN {live_fails} THEN NULL ELSE s.score END",
            "created_at": shift("s.created_at"),
            "started_at": shift("s.started_at"),
            "finished_at": shift("s.finished_at"),
            "heartbeat_at": shift("s.heartbeat_at"),
            "enqueued_at": shift("s.enqueued_at"),
        },
    )
    out.append(
        f"""INSERT INTO routing_run ({cols}) SELECT {values}
            FROM {cycles} CROSS JOIN bench_scale_tpl_run a JOIN routing_run s ON s.id = a.id
            JOIN bench_scale_tpl_task tt ON tt.t = a.t WHERE {in_range}"""  # noqa: S608
    )

    cols, values = select_list(
        "routing_decision",
        {
            "id": new_id("a", "decision"),
            "run_id": new_id("r", "run"),
            "parent_step_id": f"CASE WHEN s.parent_step_id IS NULL THEN NULL ELSE {new_id('ps', 'step')} END",
            "created_at": shift("s.created_at"),
            **({"prompt": "'[]'::jsonb", "raw_output": "left(s.raw_output, 64)"} if LEAN["on"] else {}),
        },
    )
    out.append(
        f"""INSERT INTO routing_decision ({cols}) SELECT {values}
            FROM {cycles} CROSS JOIN bench_scale_tpl_decision a JOIN routing_decision s ON s.id = a.id
            JOIN bench_scale_tpl_run r ON r.id = s.run_id
            LEFT JOIN bench_scale_tpl_step ps ON ps.id = s.parent_step_id
            JOIN bench_scale_tpl_task tt ON tt.t = a.t WHERE {in_range}"""  # noqa: S608
    )

    cols, values = select_list(
        "routing_step",
        {
            "id": new_id("a", "step"),
            "run_id": new_id("r", "run"),
            "decision_id": new_id("d", "decision"),
            "started_at": shift("s.started_at"),
            "finished_at": shift("s.finished_at"),
            **(
                {
                    "messages_sent": "NULL",
                    "response": "left(s.response, 64)",
                    "instruction": "left(s.instruction, 64)",
                }
                if LEAN["on"]
                else {}
            ),
        },
    )
    out.append(
        f"""INSERT INTO routing_step ({cols}) SELECT {values}
            FROM {cycles} CROSS JOIN bench_scale_tpl_step a JOIN routing_step s ON s.id = a.id
            JOIN bench_scale_tpl_run r ON r.id = s.run_id JOIN bench_scale_tpl_decision d ON d.id = s.decision_id
            JOIN bench_scale_tpl_task tt ON tt.t = a.t WHERE {in_range}"""  # noqa: S608
    )

    # Provider errors: ~2% of calls rate-limited, ~1% timed out (the overview's error rates).
    pos = new_id("a", "attempt")
    cols, values = select_list(
        "routing_attempt",
        {
            "id": pos,
            "step_id": new_id("st", "step"),
            "status": f"CASE WHEN {pos} %% 53 = 0 THEN 'rate_limited' WHEN {pos} %% 97 = 0 THEN 'timeout' "
            "ELSE s.status END",
            "http_status": f"CASE WHEN {pos} %% 53 = 0 THEN 429 ELSE s.http_status END",
            "started_at": shift("s.started_at"),
            "finished_at": shift("s.finished_at"),
        },
    )
    out.append(
        f"""INSERT INTO routing_attempt ({cols}) SELECT {values}
            FROM {cycles} CROSS JOIN bench_scale_tpl_attempt a JOIN routing_attempt s ON s.id = a.id
            JOIN bench_scale_tpl_step st ON st.id = s.step_id
            JOIN bench_scale_tpl_task tt ON tt.t = a.t WHERE {in_range}"""  # noqa: S608
    )

    # Audit events: a task's run chains keep their sequence under the clone's correlation id; its
    # events of the global chain (the seals) go to a chain of the task's own.
    et = "et"  # the task's event slots (n, off) for new ids
    event_id = f"({ID_BASE} - (c * %(T_event)s + {et}.off + ({et}.n - 1 - a.j) + 1))"
    obj_id = (
        f"CASE a.obj_kind WHEN 'task' THEN {TASK_UUID}::text "
        + " ".join(
            f"WHEN '{name}' THEN ({ID_BASE} - (c * %(T_{name})s + o_{name}.off + (o_{name}.n - 1 - a.obj_j) + 1))::text"
            for name in TABLES
        )
        + " ELSE s.object_id END"
    )
    obj_joins = " ".join(
        f"LEFT JOIN (SELECT DISTINCT t, j, n, off FROM bench_scale_tpl_{name}) o_{name} "  # noqa: S608
        f"ON a.obj_kind = '{name}' AND o_{name}.t = a.t AND o_{name}.j = a.obj_j"
        for name in TABLES
    )
    run_fails = f"{FAILS} AND s.action = 'run.succeeded'"
    cols, values = select_list(
        "audit_auditevent",
        {
            "id": event_id,
            "chain": f"CASE WHEN a.corr_j IS NOT NULL AND s.chain LIKE 'run:%%' THEN 'run:' || {corr('a.corr_j')} "
            f"ELSE 'bench-task:' || {TASK_UUID} END",
            "seq": "CASE WHEN a.corr_j IS NOT NULL AND s.chain LIKE 'run:%%' THEN s.seq ELSE a.j + 1 END",
            "prev_hash": f"md5('p' || {event_id}) || md5('q' || {event_id})",
            "hash": f"md5('h' || {event_id}) || md5('i' || {event_id})",
            "occurred_at": shift("s.occurred_at"),
            "action": f"CASE WHEN {run_fails} THEN 'run.failed' ELSE s.action END",
            "object_id": obj_id,
            "task_id": TASK_UUID,
            "correlation_id": f"CASE WHEN a.corr_j IS NULL THEN NULL ELSE {corr('a.corr_j')} END",
            "payload": f"""CASE WHEN s.action = 'run.sealed' AND a.obj_kind = 'run'
                    THEN jsonb_set(s.payload, '{{chain}}', to_jsonb('run:' || {corr("o_run.j")}::text))
                WHEN {run_fails} THEN jsonb_build_object('stop_reason', 'step_failed',
                    'error', 'a step''s calls failed', 'cost_usd', s.payload->'cost_usd')
                ELSE {"s.payload - " + LEAN_KEYS if LEAN["on"] else "s.payload"} END""",
        },
    )
    out.append(
        f"""INSERT INTO audit_auditevent ({cols}) SELECT {values}
            FROM {cycles} CROSS JOIN bench_scale_tpl_event a JOIN audit_auditevent s ON s.id = a.id
            JOIN bench_scale_tpl_event_task {et} ON {et}.t = a.t {obj_joins}
            JOIN bench_scale_tpl_task tt ON tt.t = a.t WHERE {in_range}"""  # noqa: S608
    )

    # score.judged: 5% of tasks were graded by an LLM judge (the event's last slot of the task).
    judge_id = f"({ID_BASE} - (c * %(T_event)s + {et}.off + 1))"
    out.append(
        f"""INSERT INTO audit_auditevent (id, chain, seq, prev_hash, hash, occurred_at, actor_type, actor_id,
                actor_name, action, object_type, object_id, task_id, correlation_id, payload)
            SELECT {judge_id}, 'bench-judge:' || {TASK_UUID}, 1, repeat('0', 64),
                md5('j' || {judge_id}) || md5('k' || {judge_id}),
                {shift("coalesce(s.finished_at, s.created_at)")}, 'service', '', 'engine', 'score.judged',
                'run', ({ID_BASE} - (c * %(T_run)s + r.off + (r.n - 1 - r.j) + 1))::text, {TASK_UUID},
                md5('bench-run-' || {G} || '-' || r.j)::uuid,
                jsonb_build_object('worker', w.slug, 'vendor', w.vendor, 'verdict', 'CORRECT', 'score', 1.0,
                    'reason', '', 'cost_usd', ((300 + {G} %% 700) * 0.0000025)::numeric(20, 10)::text,
                    'input_tokens', 300 + {G} %% 700, 'output_tokens', 2 + {G} %% 5, 'latency_ms', 350 + {G} %% 400,
                    'messages_sha256', md5('m' || {G}) || md5('n' || {G}))
            FROM {cycles} CROSS JOIN bench_scale_tpl_task a JOIN routing_task s ON s.id = a.id
            JOIN bench_scale_tpl_task tt ON tt.t = a.t JOIN bench_scale_tpl_event_task {et} ON {et}.t = a.t
            JOIN bench_scale_tpl_run r ON r.t = a.t AND r.j = 0
            JOIN (SELECT row_number() OVER (ORDER BY slug) - 1 AS k, count(*) OVER () AS m, slug, vendor
                  FROM routing_worker WHERE slug IN ('gpt-4o-2024-08-06', 'claude-3-5-sonnet-20240620',
                  'gemini-1.5-pro')) w ON w.k = {G} %% w.m
            WHERE {in_range} AND {G} %% 20 = 3 AND s.reference IS NOT NULL AND s.status = 'succeeded'"""  # noqa: S608
    )
    return out


def analyze() -> float:
    started = time.perf_counter()
    for table in (
        "routing_task",
        "routing_run",
        "routing_decision",
        "routing_step",
        "routing_attempt",
        "audit_auditevent",
    ):
        sql(f"ANALYZE {table}")
    return time.perf_counter() - started


# --- Measuring ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def bench_user():
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user_set_roles(user=user, roles=Role.values)
    return user


def fetch(client: Client, url: str) -> int:
    """One full GET; the body consumed (a streamed one too). Returns its size in bytes."""
    response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"GET {url}: {response.status_code}\n{response.content[:2000]!r}")
    if response.streaming:
        return sum(len(chunk) for chunk in response.streaming_content)
    return len(response.content)


def measure(client: Client, url: str, *, repeat: int = 20, budget_s: float = 60.0) -> dict:
    """Warm-up, then `repeat` requests (fewer where they would pass budget_s): median of the first 5, p95."""
    started = time.perf_counter()
    size = fetch(client, url)
    warm = time.perf_counter() - started
    n = repeat if warm * repeat <= budget_s else max(5, min(repeat, int(budget_s / max(warm, 1e-3))))
    times = []
    for _ in range(n):
        started = time.perf_counter()
        fetch(client, url)
        times.append((time.perf_counter() - started) * 1000)
    return {
        "median_ms": round(statistics.median(times[:5]), 1),
        "p95_ms": round(percentile(times, 0.95), 1),
        "n": n,
        "bytes": size,
    }


def rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def measure_export(client: Client, fmt: str, since: str) -> dict:
    url = f"/audit/export.{fmt}?" + urlencode({"since": since})
    before = rss_kib()
    peak = before
    started = time.perf_counter()
    response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"GET {url}: {response.status_code}")
    lines = size = 0
    for i, chunk in enumerate(response.streaming_content):
        lines += chunk.count(b"\n")
        size += len(chunk)
        if i % 5000 == 0:
            peak = max(peak, rss_kib())
    elapsed = time.perf_counter() - started
    peak = max(peak, rss_kib())
    rows = max(0, lines - 2)  # the first line and the checkpoint's
    return {
        "rows": rows,
        "seconds": round(elapsed, 2),
        "rows_per_s": round(rows / elapsed),
        "mib": round(size / 2**20, 1),
        "rss_growth_mib": round((peak - before) / 1024, 1),
        "p95_ms": round(elapsed * 1000, 1),
        "median_ms": round(elapsed * 1000, 1),
        "n": 1,
    }


def verify_run_url(run: Run) -> str | None:
    """A page or endpoint that verifies one run, if the project has one."""
    for name, kwargs in (
        ("audit:verify-run", {"run_id": run.pk}),
        ("audit:verify-run", {"correlation_id": run.correlation_id}),
        ("audit:run-proof", {"run_id": run.pk}),
    ):
        try:
            return reverse(name, kwargs=kwargs)
        except NoReverseMatch:
            continue
    return None


def paths(real_task: Task, real_run: Run) -> list[tuple[str, str]]:
    now = timezone.now()
    d7 = (now - timedelta(days=7)).date().isoformat()
    d60 = (now - timedelta(days=60)).date().isoformat()
    out = [
        ("task list", "/"),
        ("task list: status=failed", "/?status=failed"),
        ("task list: status=failed & search", "/?status=failed&q=marbles"),
        ("task list: search 'total'", "/?q=total"),
        ("task detail (real)", f"/tasks/{real_task.pk}/"),
        ("dossier (real, verifies its runs)", f"/audit/tasks/{real_task.pk}/"),
    ]
    url = verify_run_url(real_run)
    if url:
        out.append(("verify one run", url))
    out += [
        ("audit event log", "/audit/"),
        ("audit event log: action=step.", "/audit/?action=step."),
        ("vendor exposure, all time", "/audit/vendors/"),
        ("vendor drill-down openai/public", "/audit/vendors/?vendor=openai&classification=public"),
        ("policy report", "/audit/policies/"),
        ("ops overview (15 min)", "/ops/"),
        ("ops poll: history hour", "/ops/?partial=1&minutes=15&period=hour"),
        ("ops poll: history day", "/ops/?partial=1&minutes=15&period=day"),
        ("ops poll: history week", "/ops/?partial=1&minutes=15&period=week"),
        ("analytics 7 days", f"/analytics/?since={d7}"),
        ("analytics 60 days", f"/analytics/?since={d60}"),
    ]
    from operations.tasks.views import ANALYTICS_CHARTS

    for chart in ANALYTICS_CHARTS:
        out.append((f"analytics CSV {chart} (60 d)", f"/analytics/?since={d60}&chart={chart}"))
    return out


def measure_size(client: Client, steps: int, real_task: Task, real_run: Run) -> list[dict]:
    rows = []
    for name, url in paths(real_task, real_run):
        row = {"steps": steps, "path": name, "url": url, **measure(client, url)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    # One run's proof alone (what the dossier computes for each of its runs), without HTTP.
    times = []
    for _ in range(21):
        started = time.perf_counter()
        report = verify(chains=[run_chain(real_run.correlation_id)])
        times.append((time.perf_counter() - started) * 1000)
    if not report.intact:
        raise SystemExit(f"the real run {real_run.pk} does not verify: {report.summary()}")
    row = {
        "steps": steps,
        "path": "verify one run (audit.verify, no HTTP)",
        "url": "",
        "median_ms": round(statistics.median(times[1:6]), 1),
        "p95_ms": round(percentile(times[1:], 0.95), 1),
        "n": 20,
    }
    print(json.dumps(row), flush=True)
    rows.append(row)
    since = (timezone.now() - timedelta(days=EXPORT_DAYS)).isoformat(timespec="seconds")
    for fmt in ("csv", "jsonl"):
        row = {
            "steps": steps,
            "path": f"audit export .{fmt} ({EXPORT_DAYS} days)",
            "url": f"/audit/export.{fmt}?" + urlencode({"since": since}),
        }
        row.update(measure_export(client, fmt, since))
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# --- Main -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--sample", type=int, default=160, help="replay tasks the real engine runs")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    parser.add_argument("--lean", action="store_true", help="cloned rows without their message bodies")
    args = parser.parse_args()
    LEAN["on"] = args.lean
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]

    applied = MigrationRecorder(connection).applied_migrations().keys()
    call_command("migrate", verbosity=0)
    migrated = set(MigrationRecorder(connection).applied_migrations().keys()) - set(applied)
    indexes_restore()  # after an interrupted growth
    stats = meta()
    if stats is not None and migrated:
        stats.pop("rollups_at", None)  # new migrations may bring rollups of their own: rebuild them
    if stats is None:
        build_sample(args.sample)
        stats = build_templates()
    print(
        json.dumps({"template": {k: v for k, v in stats.items() if k not in ("results", "builds")}}),
        flush=True,
    )
    real_run = (
        Run.objects.filter(
            task__idempotency_key__startswith=KEY_PREFIX, kind=Run.Kind.LIVE, status="succeeded"
        )
        .order_by("-id")
        .first()
    )
    real_run = max(
        Run.objects.filter(
            task__idempotency_key__startswith=KEY_PREFIX, kind=Run.Kind.LIVE, status="succeeded"
        ),
        key=lambda r: (r.steps.count(), r.pk),
        default=real_run,
    )
    real_task = real_run.task
    client = Client()
    client.force_login(bench_user(), backend="django.contrib.auth.backends.ModelBackend")

    # Figures of sizes measured by earlier runs on the same database are kept in its meta row.
    results, builds = stats.get("results", []), stats.get("builds", [])
    for target in sorted(args.steps):
        have = Step.objects.count()
        if have > target * 1.05:
            print(json.dumps({"skipped": target, "steps_now": have, "why": "the database is larger"}))
            continue
        started, done = time.perf_counter(), stats["done"]
        stats = grow(stats, target)
        grow_s = time.perf_counter() - started
        previous = next((b for b in builds if b["target"] == target), None)
        if stats["done"] == done and previous:  # measured again without growing: keep the build's figures
            grow_s = previous["grow_s"]
        analyze_s = analyze()
        build = {
            "steps": Step.objects.count(),
            "target": target,
            "grow_s": round(grow_s, 1),
            "analyze_s": round(analyze_s, 1),
            "tasks": Task.objects.count(),
            "runs": Run.objects.count(),
            "events": one("SELECT reltuples::bigint FROM pg_class WHERE relname = 'audit_auditevent'"),
            "days": round(
                float(one("SELECT extract(epoch FROM now() - min(created_at)) / 86400 FROM routing_task")), 1
            ),
            "db_gib": round(one("SELECT pg_database_size(current_database())") / 2**30, 2),
        }
        if "rebuild_rollups" in get_commands() and stats.get("rollups_at") != build["steps"]:
            started = time.perf_counter()
            call_command("rebuild_rollups")
            build["rebuild_rollups_s"] = round(time.perf_counter() - started, 1)
            stats["rollups_at"] = build["steps"]
            meta_save(stats)
        if previous and "rebuild_rollups_s" not in build and "rebuild_rollups_s" in previous:
            build["rebuild_rollups_s"] = previous["rebuild_rollups_s"]
        print(json.dumps({"build": build}), flush=True)
        builds = [b for b in builds if b["target"] != target] + [build]
        stats["builds"] = builds
        meta_save(stats)  # before measuring: a failed page keeps the build's figures
        measured = measure_size(client, target, real_task, real_run)
        results = [r for r in results if r["steps"] != target] + measured
        stats.update(results=results, builds=builds)
        meta_save(stats)

    builds.sort(key=lambda b: b["target"])
    sizes = [b["target"] for b in builds]
    names = list(dict.fromkeys(r["path"] for r in results if "rows" not in r))  # exports: a table apart
    p95 = {(r["path"], r["steps"]): r["p95_ms"] for r in results}
    header = "| path | " + " | ".join(f"{s:,} steps" for s in sizes) + " |"
    lines = [header, "|---|" + "---|" * len(sizes)]
    for name in names:
        cells = []
        for s in sizes:
            value = p95.get((name, s))
            cells.append(
                "" if value is None else f"**{value:,.0f}** ⚠" if value >= SLOW_MS else f"{value:,.0f}"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    exports = "\n".join(
        f"| {r['path']} | {r['steps']:,} | {r['rows']:,} | {r['rows_per_s']:,} | {r['rss_growth_mib']} |"
        for r in results
        if "rows" in r
    )
    build_table = "\n".join(
        f"| {b['target']:,} | {b['steps']:,} | {b['tasks']:,} | {b['events']:,} | {b['days']} | "
        f"{b['grow_s']} | {b['analyze_s']} | {b.get('rebuild_rollups_s', '–')} | {b['db_gib']} |"
        for b in builds
    )
    print(exports)
    print(build_table)
    if args.write:
        machine = (
            f"{platform.machine()}, {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
        )
        steps_arg = " ".join(str(s) for s in sizes)  # the sizes shown (one run or several, growing)
        write_section(
            "scale",
            f"""## Read paths at scale

Command: `CONDUCTOR_VAR_DIR=/tmp/var-scale CONDUCTOR_REPLAY_DIR=<replay data> python -m bench.scale --steps {steps_arg}{" --lean" if args.lean else ""}`
on {machine}; embedded PostgreSQL (its default settings) and Redis.

History: {args.sample} replay tasks run by the real engine (two static conductor versions, shadow,
rollout, evaluation and retry runs; their audit chains sealed and signed), cloned by SQL into older
history at {STEPS_PER_DAY:,} steps a day ending now (about 3.2 steps a run, 3.8 audit events a step;
4% of tasks failed, 3% of calls with provider errors, 5% judged by an LLM judge). Each page is a full
GET through django.test.Client as a user with every role; p95 of 20 requests after a warm-up (fewer
for pages over 3 s), in ms; **bold ⚠**: p95 >= {SLOW_MS} ms. The task and dossier are of a real run.{LEAN_NOTE if args.lean else ""}

| size | steps | tasks | audit events | days | build s | analyze s | rebuild_rollups s | database GiB |
|---|---|---|---|---|---|---|---|---|
{build_table}

{table}

Streamed exports over the last {EXPORT_DAYS} days:

| export | size | rows | rows/s | RSS growth MiB |
|---|---|---|---|---|
{exports}""",
        )


if __name__ == "__main__":
    main()
