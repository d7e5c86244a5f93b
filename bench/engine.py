"""Engine benchmark: submission-to-answer latency of a 3-step replay workflow, and batch throughput.

    python -m bench.engine --latency-runs 20 --batch 200 --concurrency 2

Runs against the configured database and broker (the embedded ones when DATABASE_URL / REDIS_URL are
unset), with real Celery worker processes. Prints one JSON line per figure and, with --write, replaces
the engine section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from conductor_web.celery import worker_command  # noqa: E402
from routing import replay  # noqa: E402
from routing.models import Run, RunStatus, Step, Task  # noqa: E402
from routing.services import TaskSubmission, task_submit  # noqa: E402

DONE = [RunStatus.SUCCEEDED, RunStatus.FAILED]


def start_worker(concurrency: int) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": settings.DATABASE_URL, "REDIS_URL": settings.REDIS_URL}
    proc = subprocess.Popen(
        worker_command(concurrency=concurrency, loglevel="WARNING", quiet=True),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc


def submit(item: replay.ReplayItem, prefix: str) -> Task:
    task, _ = task_submit(
        submission=TaskSubmission.of_replay(item, idempotency_key=f"{prefix}:{item.id}"),
        source=Task.Source.CLI,
    )
    return task


def wait_done(task_ids: list, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while Task.objects.filter(pk__in=task_ids).exclude(status__in=DONE).exists():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting for tasks")
        time.sleep(0.02)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-runs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    call_command("load_replay_pool", verbosity=0)
    items = replay.read_items(replay.split_path(args.split))
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    worker = start_worker(args.concurrency)
    results = []
    try:
        # Warm-up: the worker imports litellm and loads the replay index on its first task.
        warm = submit(items[0], prefix + "-warm")
        wait_done([warm.pk], 120)

        math_items = [i for i in items if i.domain == "math-l5"][: args.latency_runs]
        latencies = []
        for item in math_items:
            task = submit(item, prefix + "-lat")
            wait_done([task.pk], 60)
            run = Run.objects.get(task=task)
            assert Step.objects.filter(run=run).count() == 3, "expected the 3-step static workflow"
            latencies.append((run.finished_at - task.created_at).total_seconds())
        results.append(
            {
                "figure": "submission_to_answer_3_step_s",
                "runs": len(latencies),
                "p50": round(statistics.median(latencies), 3),
                "p95": round(percentile(latencies, 0.95), 3),
                "mean": round(statistics.fmean(latencies), 3),
            }
        )

        batch_items = random.Random(1).sample(items, min(args.batch, len(items)))
        started = time.monotonic()
        tasks = [submit(item, prefix + "-batch") for item in batch_items]
        submitted = time.monotonic() - started
        wait_done([t.pk for t in tasks], 1800)
        elapsed = time.monotonic() - started
        steps = Step.objects.filter(run__task__in=tasks).count()
        failed = Task.objects.filter(pk__in=[t.pk for t in tasks], status=RunStatus.FAILED).count()
        results.append(
            {
                "figure": "batch_throughput",
                "tasks": len(tasks),
                "failed": failed,
                "steps": steps,
                "worker_processes": args.concurrency,
                "submit_s": round(submitted, 2),
                "elapsed_s": round(elapsed, 2),
                "steps_per_s": round(steps / elapsed, 2),
                "tasks_per_s": round(len(tasks) / elapsed, 2),
            }
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    for row in results:
        print(json.dumps({**row, "machine": machine}))
    if args.write:
        write_docs(results, machine, args)


def write_docs(results: list[dict], machine: str, args: argparse.Namespace) -> None:
    lat, batch = results
    write_section(
        "engine",
        f"""## Engine: latency and throughput (replay pool, static conductor)

Command: `python -m bench.engine --latency-runs {args.latency_runs} --batch {args.batch} --concurrency {args.concurrency}`
on {machine}, embedded PostgreSQL and Redis, one Celery worker with {args.concurrency} processes.
Replay workers answer instantly, so these figures are the engine's own overhead: planning, the
database writes and audit events of every step and attempt, and the broker round trip.

| figure | value |
|---|---|
| submission to final answer, 3-step workflow (p50 / p95 / mean over {lat["runs"]} runs) | {lat["p50"]} s / {lat["p95"]} s / {lat["mean"]} s |
| batch of {batch["tasks"]} replay tasks: steps | {batch["steps"]} ({batch["failed"]} tasks failed) |
| batch wall time (first submission to last answer) | {batch["elapsed_s"]} s |
| throughput | {batch["steps_per_s"]} steps/s, {batch["tasks_per_s"]} tasks/s |""",
    )


if __name__ == "__main__":
    main()
