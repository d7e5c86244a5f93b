"""The task list at scale: keyset pages, filters and full-text search over many tasks.

    CONDUCTOR_VAR_DIR=/tmp/bench-var python -m bench.task_list --tasks 1000000

Fills a private database with N tasks (texts drawn from the replay data, one INSERT ... SELECT),
then times the queries the task list page runs. Prints JSON lines; --write adds a section to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from operations.tasks.filters import TaskFilter  # noqa: E402
from routing import replay, selectors  # noqa: E402
from routing.models import Task  # noqa: E402

PAGE = 50


def fill(n: int) -> None:
    texts = [item.task for item in replay.read_items(replay.split_path("train"))]
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE bench_texts (i int, t text)")
        cursor.executemany("INSERT INTO bench_texts VALUES (%s, %s)", list(enumerate(texts)))
        cursor.execute(
            """
            INSERT INTO routing_task (id, text, scorer, domain, source_item, classification, max_steps, max_depth,
                max_usd, source, status, final_answer, error, cost_usd, input_tokens, output_tokens, created_at)
            SELECT gen_random_uuid(), b.t || ' #' || g, 'auto', '', '', (ARRAY['public','internal','confidential'])[1 + g %% 3],
                   10, 2, 1, 'cli', (ARRAY['succeeded','succeeded','succeeded','failed','queued'])[1 + g %% 5], '', '', 0, 0, 0,
                   now() - make_interval(secs => g)
            FROM generate_series(1, %s) g JOIN bench_texts b ON b.i = g %% %s
            """,
            [n, len(texts)],
        )
        cursor.execute("ANALYZE routing_task")


def timed(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    existing = Task.objects.count()
    started = time.perf_counter()
    if existing < args.tasks:
        fill(args.tasks - existing)
    fill_s = round(time.perf_counter() - started, 1)
    total = Task.objects.count()

    def page(**filters):
        return lambda: list(
            TaskFilter(filters, selectors.task_list()).qs.order_by("-created_at", "-id")[:PAGE]
        )

    middle = Task.objects.order_by("-created_at").values_list("created_at", flat=True)[total // 2]
    deep = lambda: list(Task.objects.filter(created_at__lt=middle).order_by("-created_at", "-id")[:PAGE])  # noqa: E731
    rows = [
        {"query": "first page", "ms": timed(page())},
        {"query": "page in the middle (keyset)", "ms": timed(deep)},
        {"query": "status = failed", "ms": timed(page(status="failed"))},
        {"query": "classification = confidential", "ms": timed(page(classification="confidential"))},
        {"query": "full-text: 'marbles'", "ms": timed(page(q="marbles"))},
        {"query": "full-text: 'function list'", "ms": timed(page(q="function list"))},
    ]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(json.dumps({"tasks": total, "fill_s": fill_s, "machine": machine}))
    for row in rows:
        print(json.dumps(row))
    if args.write:
        table = "\n".join(f"| {r['query']} | {r['ms']} ms |" for r in rows)
        write_section(
            "tasklist",
            f"""## Task list at scale

Command: `CONDUCTOR_VAR_DIR=/tmp/bench-var python -m bench.task_list --tasks {args.tasks}` on {machine},
embedded PostgreSQL, {total:,} tasks. Median of 7 runs of the query behind one page of 50 tasks.

| query | median |
|---|---|
{table}""",
        )


if __name__ == "__main__":
    main()
