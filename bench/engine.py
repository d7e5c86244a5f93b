"""Engine benchmark: submission-to-answer latency of a 3-step replay workflow, and batch throughput.

    python -m bench.engine --latency-runs 20 --batch 200 --concurrency 2
    python -m bench.engine --provider-ms 200 --concurrency 1 2 4 --runs-per-process 30 --write

With --provider-ms, throughput against a provider that takes that long per call instead: the replay
pool's workers pointed at a loopback OpenAI-protocol server (bench.provider) that answers after
--provider-ms, and for each --concurrency a real `celery worker` with that many processes, fed
--runs-per-process runs per process at once (three-step math plans of the static rules, each call a
real HTTP request through litellm). The rate is taken between the 10% and the 90% of runs ended
(steady state: the workers' start and the last runs' tail left out), from the runs' recorded ends.

Runs against the configured database and broker (the embedded ones when DATABASE_URL / REDIS_URL are
unset), with real Celery worker processes. Prints one JSON line per figure and, with --write, replaces
the engine section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
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
from datetime import date
from pathlib import Path

from bench.docs import write_section
from bench.stats import shown, spread
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db.models import Count  # noqa: E402

from conductor_web.celery import worker_command  # noqa: E402
from routing import replay  # noqa: E402
from routing.models import Run, RunStatus, Step, Task  # noqa: E402
from routing.services import TaskSubmission, task_submit  # noqa: E402

DONE = [RunStatus.SUCCEEDED, RunStatus.FAILED]
STEADY_PARTS = 5  # the steady window's parts, for the spread of the throughput's rate


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
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2])
    parser.add_argument("--split", default="dev")
    parser.add_argument(
        "--provider-ms", type=int, help="throughput against a loopback provider this slow, per --concurrency"
    )
    parser.add_argument("--runs-per-process", type=int, default=30, help="with --provider-ms")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    args = parser.parse_args()

    call_command("migrate", verbosity=0)
    call_command("load_replay_pool", verbosity=0)
    items = replay.read_items(replay.split_path(args.split))
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    if args.provider_ms is not None:
        slow_provider(args, [i for i in items if i.domain == "math-l5"], prefix)
        return
    (concurrency,) = args.concurrency
    worker = start_worker(concurrency)
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
                "worker_processes": concurrency,
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


def slow_provider(args: argparse.Namespace, items: list[replay.ReplayItem], prefix: str) -> None:
    """Runs/s and steps/s of a worker with each --concurrency, every call taking --provider-ms."""
    from bench.provider import point_pool_at, provider_start, restore

    server = provider_start()
    before = point_pool_at(server, args.provider_ms / 1000)
    results = []
    try:
        for concurrency in args.concurrency:
            worker = start_worker(concurrency)
            try:
                warm = [submit(items[i], f"{prefix}-warm-{concurrency}-{i}") for i in range(concurrency)]
                wait_done([t.pk for t in warm], 120)
                runs = args.runs_per_process * concurrency
                started = time.monotonic()
                tasks = [submit(items[i % len(items)], f"{prefix}-{concurrency}-{i}") for i in range(runs)]
                wait_done([t.pk for t in tasks], 600)
                elapsed = time.monotonic() - started
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
            results.append(steady_rate(tasks, concurrency, elapsed))
            print(json.dumps(results[-1]), flush=True)
    finally:
        restore(before)
        server.stop()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if args.write:
        write_throughput_docs(results, machine, args)


def steady_rate(tasks: list[Task], concurrency: int, elapsed: float) -> dict:
    """Runs/s and steps/s between the 10% and the 90% of the runs ended (their recorded ends)."""
    runs = sorted(
        Run.objects.filter(task__in=tasks, kind=Run.Kind.LIVE).select_related("task"),
        key=lambda r: r.finished_at,
    )
    steps = dict(
        Step.objects.filter(run__in=runs).values("run_id").annotate(n=Count("id")).values_list("run_id", "n")
    )
    low, high = len(runs) // 10, len(runs) - 1 - len(runs) // 10
    window = (runs[high].finished_at - runs[low].finished_at).total_seconds()
    # The runs ended after the window's first end, up to its last: (high - low) runs in `window` seconds.
    counted = runs[low + 1 : high + 1]
    # The window cut in STEADY_PARTS by runs ended: how much the rate moved within it.
    bounds = [low + round(i * (high - low) / STEADY_PARTS) for i in range(STEADY_PARTS + 1)]
    rates = [
        (b - a) / (runs[b].finished_at - runs[a].finished_at).total_seconds()
        for a, b in itertools.pairwise(bounds)
        if b > a
    ]
    return {
        "figure": "throughput_slow_provider",
        "worker_processes": concurrency,
        "runs": len(runs),
        "failed": sum(r.status == RunStatus.FAILED for r in runs),
        "steps": sum(steps.values()),
        "elapsed_s": round(elapsed, 2),
        "window_s": round(window, 2),
        "runs_per_s": round(len(counted) / window, 2),
        "runs_per_s_parts": spread(rates),
        "steps_per_s": round(sum(steps.get(r.pk, 0) for r in counted) / window, 2),
        "run_s_p50": round(
            statistics.median((r.finished_at - r.task.created_at).total_seconds() for r in runs), 2
        ),
    }


def write_throughput_docs(results: list[dict], machine: str, args: argparse.Namespace) -> None:
    one = next((r["runs_per_s"] / r["worker_processes"] for r in results if r["worker_processes"] == 1), None)
    rows = "\n".join(
        f"| {r['worker_processes']} | {r['runs']} ({r['failed']} failed) | {r['elapsed_s']} s | "
        f"{r['runs_per_s']} | {shown(r['runs_per_s_parts'])} | {r['steps_per_s']} | "
        f"{'-' if one is None else round(r['runs_per_s'] / (one * r['worker_processes']), 2)} | {r['run_s_p50']} s |"
        for r in results
    )
    per_call = args.provider_ms
    write_section(
        "engine-throughput",
        f"""## Engine: throughput with a provider that takes {per_call} ms a call

Command: `python -m bench.engine --provider-ms {per_call} --concurrency {" ".join(map(str, args.concurrency))} --runs-per-process {args.runs_per_process} --write`,
{date.today().isoformat()}, on {machine}: a shared machine, where other work ran beside the benchmark,
so the figures are noisy. Embedded PostgreSQL and Redis; for each setting a real `celery worker` with
that many processes (`--concurrency`), fed {args.runs_per_process} runs per process at once; the replay pool's
workers pointed at a loopback OpenAI-protocol server that answers after {per_call} ms; three-step plans
of the static rules (the first two steps independent, called at once, the third after them: at least
{2 * per_call / 1000:.1f} s of calls a run), each call a real HTTP request through litellm. The rate is
taken between the 10% and the 90% of the runs ended (steady state), from their recorded ends; that
window cut in {STEADY_PARTS} parts by runs ended gives the rate's spread.

| worker processes | runs | wall time (all runs) | runs/s (steady) | runs/s, median of {STEADY_PARTS} parts (p10 to p90) | steps/s (steady) | scaling (runs/s over N times one process's) | submission to end, p50 (queue wait included) |
|---|---|---|---|---|---|---|---|
{rows}

A run waits on its calls, not on the CPU: a worker process runs one run at a time, so the rate can
grow with the processes ({1000 / (2 * per_call):.2f} runs/s a process at most) until the two cores are busy.""",
    )


def write_docs(results: list[dict], machine: str, args: argparse.Namespace) -> None:
    lat, batch = results
    write_section(
        "engine",
        f"""## Engine: latency and throughput (replay pool, static conductor)

Command: `python -m bench.engine --latency-runs {args.latency_runs} --batch {args.batch} --concurrency {args.concurrency[0]}`
on {machine}, embedded PostgreSQL and Redis, one Celery worker with {args.concurrency[0]} processes.
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
