"""What the hash chain costs per engine step, why one chain per run matters, and what the global
chain's head sustains when runs end at once.

    python -m bench.audit_chain --threads 4 --events 500
    python -m bench.audit_chain --enders 1 2 4 8 16 --ends 150 --rounds 3 --runs 20
    python -m bench.audit_chain --enders 1 2 4 8 16 --ends 100 --rounds 3 --layouts pending run-only --no-runs

Appends: each thread appends events in its own transactions (one event per transaction, as the engine
does per step) either to its own run chain, or all threads to the single global chain.

Run ends (--enders): each of N threads ends runs one after another, as N worker processes would:
the run's chain gets an event, then, in the transaction that ends the run, its last event sealing it
(`event_record(seal=True)`) and its seal appended to the global chain (`audit.chain.append`: on the
global chain's head, which it holds until the transaction commits), as the engine's fenced end does.
"pending seal": the end seals its own chain and inserts a PendingSeal row (audit.seals), and a sealer
thread beside the enders calls audit.seals.seal_pending() as beat's task does (its defaults: a batch of
SEAL_BATCH under one lock of the head, the run.sealed events, the Merkle tree's new leaves and nodes,
an audit.log_grown event and a signed checkpoint, in one transaction) on a fixed schedule of
SEAL_EVERY_S; it keeps that schedule after the enders stop until their last seal is signed. The seal
latency is reported per round and over all rounds: from a row's created_at to the first Checkpoint
whose tree size exceeds its leaf index (that checkpoint's created_at), and to the sealer's commit of
that checkpoint (when a reader can first see it). `--layouts pending run-only` leaves out the old
global layout. The
same runs without the global seal show what that one head costs. From one ender, the time from
the global seal's statement to the commit is how long an end holds the head: its inverse is the most
run ends a second the global chain can take, however many workers and database cores there are.
--runs: that many real runs (the replay pool, in this process) give the per-run write cost (wall time
and the database server's CPU) to compare it with.

The layouts are measured interleaved (each count of enders in turn, each round every layout), and
each is summarised over --rounds: median ends/s with its min and max (the spread). Prints JSON lines; --write replaces the audit section of docs/benchmarks.md (or, with --enders, the
global head's section).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from datetime import UTC, date, datetime
from pathlib import Path

from bench.cpu import Clock
from bench.docs import write_section
from bench.stats import percentile
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The real runs' messages go to a queue nobody reads (the engine runs them here); replay answers at once.
os.environ.setdefault("CONDUCTOR_QUEUE_PREFIX", f"bench-chain-{uuid.uuid4().hex[:8]}-")
os.environ.setdefault("CONDUCTOR_REPLAY_LATENCY_S", "0")
django_setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402

from audit import chain as audit_chain  # noqa: E402
from audit.actions import Action  # noqa: E402
from audit.models import GLOBAL_CHAIN, AuditEvent, Checkpoint, PendingSeal  # noqa: E402
from audit.seals import pending_seal, seal_pending  # noqa: E402
from audit.services import ENGINE, event_record, run_seal_fields  # noqa: E402
from routing.models import ConductorVersion  # noqa: E402

GLOBAL, PENDING, RUN_ONLY = "sealed in the global chain", "pending seal", "run chain only"
LAYOUTS = (GLOBAL, PENDING, RUN_ONLY)
SEAL_EVERY_S = 1.0  # the bench's sealer, as beat's (AUDIT_SEAL_EVERY_S)


def append_events(obj, correlation_id, count: int, latencies: list[float]) -> None:
    try:
        for i in range(count):
            started = time.perf_counter()
            with transaction.atomic():
                event_record(
                    actor=ENGINE,
                    action=Action.STEP_SUCCEEDED,
                    obj=obj,
                    correlation_id=correlation_id,
                    payload={"i": i, "note": "x" * 200},
                )
            latencies.append(time.perf_counter() - started)
    finally:
        connections.close_all()


def measure(layout: str, threads: int, events: int) -> dict:
    obj = ConductorVersion.objects.first()
    latencies: list[float] = []
    started = time.perf_counter()
    workers = [
        threading.Thread(
            target=append_events,
            args=(obj, uuid.uuid4() if layout == "run chains" else None, events, latencies),
        )
        for _ in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "layout": layout,
        "threads": threads,
        "events": threads * events,
        "events_per_s": round(threads * events / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))] * 1000, 2),
    }


def end_runs(obj, count: int, layout: str, ends: list[float], holds: list[float]) -> None:
    """End `count` runs one after another (see the module's docstring); each end's time, and from the
    global seal's statement to the commit (`holds`: the head's lock, its wait included)."""
    try:
        for i in range(count):
            correlation = uuid.uuid4()
            with transaction.atomic():  # the run's steps: events of its own chain
                event_record(
                    actor=ENGINE,
                    action=Action.STEP_SUCCEEDED,
                    obj=obj,
                    correlation_id=correlation,
                    payload={"i": i, "note": "x" * 200},
                )
            started = time.perf_counter()
            with transaction.atomic():
                last = event_record(
                    actor=ENGINE,
                    action=Action.RUN_SUCCEEDED,
                    obj=obj,
                    correlation_id=correlation,
                    payload={"i": i, "score": 1.0},
                    seal=True,
                )
                held = time.perf_counter()
                if layout == GLOBAL:  # today's end: the seal on the global head, held to the commit
                    audit_chain.append(chain=GLOBAL_CHAIN, **global_seal_fields(obj, last))
                elif layout == PENDING:  # a plain insert that no other end waits for
                    pending_seal(run=obj, task_id=None, last=last).save(force_insert=True)
            done = time.perf_counter()
            ends.append(done - started)
            holds.append(done - held)
    finally:
        connections.close_all()


def global_seal_fields(obj, last: AuditEvent) -> dict:
    """The run.sealed event of the run chain `last` closed, as the end (or the sealer) appends it."""
    return run_seal_fields(
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        task_id=None,
        chain=last.chain,
        seq=last.seq,
        hash_=last.hash,
    )


def seal_every_second(stop: threading.Event, batches: list[int], signed: list[tuple[datetime, int]]) -> None:
    """The sealer beside the enders, as beat runs it: audit.tasks.seal_pending (seal_pending() with its
    defaults: a batch of SEAL_BATCH, the tree grown and a checkpoint signed) on a fixed schedule of
    SEAL_EVERY_S, until `stop`. `signed`: after each batch's commit, when, and the size of the tree its
    checkpoint signed."""
    try:
        tick = time.monotonic()
        while True:
            tick += SEAL_EVERY_S
            if stop.wait(max(0.0, tick - time.monotonic())):
                break
            sealed = seal_pending()
            batches.append(sealed)
            if sealed:
                size = Checkpoint.objects.order_by("-id").values_list("body__tree__size", flat=True).first()
                signed.append((datetime.now(UTC), int(size)))
    finally:
        connections.close_all()


def seal_lag(after_id: int, signed: list[tuple[datetime, int]]) -> tuple[dict, list[float], list[float]]:
    """For the rows after `after_id`: from a pending seal's row made (its created_at, just before the
    end's commit) to its leaf in a signed checkpoint: the first Checkpoint whose tree size exceeds its
    leaf index (that row's created_at, inside the sealer's transaction), and the sealer's commit of
    that checkpoint (`signed`, taken after seal_pending returned: what a reader can first see). Seconds."""
    rows = list(
        PendingSeal.objects.filter(pk__gt=after_id, leaf_index__isnull=False).values_list(
            "created_at", "leaf_index"
        )
    )
    if not rows:
        return {}, [], []
    first = min(index for _, index in rows)
    checkpoints = [
        (at, int(size))
        for at, size in Checkpoint.objects.filter(body__tree__size__gt=first)
        .order_by("id")
        .values_list("created_at", "body__tree__size")
    ]
    to_checkpoint, to_commit = [], []
    for made, index in rows:
        at = next(at for at, size in checkpoints if size > index)
        to_checkpoint.append((at - made).total_seconds())
        committed = next((at for at, size in signed if size > index), None)
        if committed is not None:
            to_commit.append((committed - made).total_seconds())
    figures = {
        "to_checkpoint_ms_p50": round(statistics.median(to_checkpoint) * 1000),
        "to_checkpoint_ms_p95": round(percentile(to_checkpoint, 0.95) * 1000),
        "to_checkpoint_ms_max": round(max(to_checkpoint) * 1000),
    }
    if to_commit:
        figures |= {
            "to_commit_ms_p50": round(statistics.median(to_commit) * 1000),
            "to_commit_ms_p95": round(percentile(to_commit, 0.95) * 1000),
            "to_commit_ms_max": round(max(to_commit) * 1000),
            "unmatched": len(rows) - len(to_commit),
        }
    return figures, to_checkpoint, to_commit


LAGS: dict[str, list[float]] = {"to_checkpoint": [], "to_commit": []}  # every round's, for the totals


def measure_ends(layout: str, enders: int, count: int) -> dict:
    obj = ConductorVersion.objects.first()
    ends: list[float] = []
    holds: list[float] = []
    threads = [
        threading.Thread(target=end_runs, args=(obj, count, layout, ends, holds)) for _ in range(enders)
    ]
    stop, batches, signed = threading.Event(), [], []
    sealer = threading.Thread(target=seal_every_second, args=(stop, batches, signed))
    last_row = PendingSeal.objects.order_by("-id").values_list("id", flat=True).first() or 0
    if layout == PENDING:
        sealer.start()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    extra = {}
    if layout == PENDING:
        # The sealer keeps its schedule until the last ends are in a signed checkpoint (no early seal
        # at the end: that would shorten the last rows' latency).
        waiting = PendingSeal.objects.filter(pk__gt=last_row, leaf_index__isnull=True)
        deadline = time.monotonic() + 30
        while waiting.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        sealer.join()
        extra = {"seal_batches": sum(1 for b in batches if b), "seal_batch_max": max(batches, default=0)}
        lag, to_checkpoint, to_commit = seal_lag(last_row, signed)
        extra |= lag
        LAGS["to_checkpoint"] += to_checkpoint
        LAGS["to_commit"] += to_commit
    return {
        "layout": layout,
        "enders": enders,
        "ends": len(ends),
        "ends_per_s": round(len(ends) / elapsed, 1),
        "end_ms_p50": round(statistics.median(ends) * 1000, 2),
        "end_ms_p95": round(percentile(ends, 0.95) * 1000, 2),
        "hold_ms_p50": round(statistics.median(holds) * 1000, 3),
        **extra,
    }


def spread(rows: list[dict], layouts: tuple[str, ...] = LAYOUTS) -> list[dict]:
    """Per count of enders and layout, over the rounds: median ends/s, its min and max."""
    summary = []
    for enders in dict.fromkeys(r["enders"] for r in rows):
        for layout in layouts:
            rates = sorted(r["ends_per_s"] for r in rows if r["enders"] == enders and r["layout"] == layout)
            summary.append(
                {
                    "enders": enders,
                    "layout": layout,
                    "rounds": len(rates),
                    "ends_per_s_median": statistics.median(rates),
                    "ends_per_s_min": rates[0],
                    "ends_per_s_max": rates[-1],
                }
            )
    return summary


def run_cost(runs: int) -> dict:
    """Wall time and the database server's CPU per real run (submission, plan, three steps, end)."""
    from routing import engine, replay
    from routing.models import Run, Step, Task
    from routing.services import TaskSubmission, task_submit

    call_command("load_replay_pool", verbosity=0)
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.update_or_create(
        name="bench-static", defaults={"backend": "static", "config": {}, "is_active": True}
    )
    items = [i for i in replay.read_items(replay.split_path("dev")) if i.domain == "math-l5"]
    key = uuid.uuid4().hex[:8]

    def one(i: int) -> int:
        task, _ = task_submit(
            submission=TaskSubmission.of_replay(
                items[i % len(items)], idempotency_key=f"bench-chain-{key}-{i}"
            ),
            source=Task.Source.API,
        )
        run = task.runs.get(kind=Run.Kind.LIVE).pk
        engine.execute_run(run)
        return run

    one(runs)  # warm-up: imports, the replay index, litellm
    clock = Clock(connection)
    done = [one(i) for i in range(runs)]
    figures = clock.stop(lambda: len(done))  # "per step" here: per run
    steps = Step.objects.filter(run_id__in=done).count()
    return {
        "runs": runs,
        "steps_per_run": round(steps / runs, 2),
        "ms_per_run": round(figures["ms_per_step"], 2),
        "db_cpu_ms_per_run": None
        if figures["db_cpu_ms_per_step"] is None
        else round(figures["db_cpu_ms_per_step"], 2),
        "process_cpu_ms_per_run": round(figures["cpu_ms_per_step"], 2),
    }


def server_settings() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
            "current_setting('wal_sync_method')"
        )
        fsync, sync_commit, method = cursor.fetchone()
    return f"fsync {fsync}, synchronous_commit {sync_commit}, wal_sync_method {method}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--events", type=int, default=500, help="per thread")
    parser.add_argument("--enders", type=int, nargs="+", help="run ends at once: the global head's rate")
    parser.add_argument("--ends", type=int, default=150, help="runs each ender ends")
    parser.add_argument("--rounds", type=int, default=3, help="--enders: rounds of every layout (the spread)")
    parser.add_argument("--no-runs", action="store_true", help="--enders: leave out the real runs' cost")
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=("global", "pending", "run-only"),
        default=["global", "pending", "run-only"],
        help="--enders: which layouts to measure",
    )
    parser.add_argument("--runs", type=int, default=20, help="real runs for the per-run write cost")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    from routing.services import conductor_active

    conductor_active()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if args.enders:
        global_head(args, machine)
        return
    before = AuditEvent.objects.count()
    results = [measure(layout, args.threads, args.events) for layout in ("run chains", "one global chain")]
    for row in results:
        print(json.dumps({**row, "machine": machine}))
    print(json.dumps({"events_written": AuditEvent.objects.count() - before}))
    if args.write:
        rows = "\n".join(
            f"| {r['layout']} | {r['threads']} | {r['events']} | {r['events_per_s']} | {r['p50_ms']} ms | {r['p95_ms']} ms |"
            for r in results
        )
        write_section(
            "audit",
            f"""## Audit chain: cost per step

Command: `CONDUCTOR_VAR_DIR=/tmp/bench-var python -m bench.audit_chain --threads {args.threads} --events {args.events}`
(a private embedded PostgreSQL, so that the benchmark's events stay out of your record) on {machine}.
Each append is one transaction that locks its chain's head, computes sha256(previous hash + canonical
content) and inserts the event, as the engine does for every step and attempt.

| layout | writers | events | events/s | p50 per event | p95 per event |
|---|---|---|---|---|---|
{rows}

With one chain per run, concurrent runs do not wait for each other; with a single global chain every
append in the system queues behind one row lock.""",
        )


def global_head(args: argparse.Namespace, machine: str) -> None:
    """Run ends a second with N enders, with and without the global seal, against the per-run cost."""
    rows = []
    layouts = tuple(
        {"global": GLOBAL, "pending": PENDING, "run-only": RUN_ONLY}[name] for name in args.layouts
    )
    for enders in args.enders:
        for _ in range(args.rounds):  # interleaved: each count of enders in turn, each round every layout
            for layout in layouts:
                rows.append(measure_ends(layout, enders, args.ends))
                print(json.dumps({**rows[-1], "machine": machine}), flush=True)
    summary = spread(rows, layouts)
    for row in summary:
        print(json.dumps({"figure": "ends per second over the rounds", **row}), flush=True)
    if PENDING in layouts and RUN_ONLY in layouts:
        for enders in dict.fromkeys(r["enders"] for r in summary):
            by = {r["layout"]: r["ends_per_s_median"] for r in summary if r["enders"] == enders}
            print(
                json.dumps(
                    {
                        "figure": "pending over run chain only",
                        "enders": enders,
                        "ratio": round(by[PENDING] / by[RUN_ONLY], 3),
                    }
                ),
                flush=True,
            )
    for name, lags in LAGS.items():
        if lags:
            print(
                json.dumps(
                    {
                        "figure": f"seal latency, {name}, all rounds",
                        "rows": len(lags),
                        "p50_ms": round(statistics.median(lags) * 1000),
                        "p95_ms": round(percentile(lags, 0.95) * 1000),
                        "max_ms": round(max(lags) * 1000),
                    }
                ),
                flush=True,
            )
    if args.no_runs:
        return
    holds = [r["hold_ms_p50"] for r in rows if r["layout"] == GLOBAL and r["enders"] == min(args.enders)]
    hold = statistics.median(holds)
    cost = run_cost(args.runs)
    settings_line = server_settings()
    ceiling = 1000 / hold
    db = cost["db_cpu_ms_per_run"]
    cores = None if db is None else db / hold  # database cores at which per-run writes reach the ceiling
    finding = {
        "figure": "global chain head",
        "hold_ms_one_ender": hold,
        "ceiling_ends_per_s": round(ceiling),
        "run_cost": cost,
        "db_cores_to_reach_ceiling": None if cores is None else round(cores, 1),
        "server": settings_line,
    }
    print(json.dumps(finding), flush=True)
    if args.write:
        write_section("audit-global-head", _global_head_section(args, machine, summary, rows, finding))


def _global_head_section(
    args: argparse.Namespace, machine: str, summary: list[dict], rows: list[dict], f: dict
) -> str:
    table = "\n".join(
        f"| {r['enders']} | {r['layout']} | {r['ends_per_s_median']} ({r['ends_per_s_min']}..{r['ends_per_s_max']}) |"
        for r in summary
    )
    cost = f["run_cost"]
    db = cost["db_cpu_ms_per_run"]
    cores = f["db_cores_to_reach_ceiling"]
    by_ender = {
        n: {r["layout"]: r["ends_per_s_median"] for r in summary if r["enders"] == n}
        for n in sorted(set(args.enders))
    }
    ratios = ", ".join(f"{n}: {round(v[GLOBAL] / v[RUN_ONLY], 2)}" for n, v in by_ender.items())
    most = max(by_ender)
    commit = next(r["hold_ms_p50"] for r in rows if r["layout"] == RUN_ONLY and r["enders"] == min(by_ender))
    limited = by_ender[most][GLOBAL] < 0.8 * by_ender[most][RUN_ONLY]
    here = (
        f"On this machine the head already limits run ends at {most} enders: {by_ender[most][GLOBAL]}/s "
        f"with the global seal against {by_ender[most][RUN_ONLY]}/s without it. Each end waits for the "
        "head (see the held column, the wait included), and their commits cannot share a WAL flush: "
        "without the seal, concurrent ends' commits are flushed together."
        if limited
        else f"On this machine the head is not yet the limit: with {most} enders the ends ran at "
        f"{by_ender[most][GLOBAL]}/s with the global seal against {by_ender[most][RUN_ONLY]}/s without it; "
        "its two cores, shared by the database and the enders, run out first."
    )
    scaled = (
        "n/a"
        if cores is None
        else f"a database server with more than about {max(1, round(cores))} cores busy with runs "
        f"({db} ms of server CPU a run: {f['ceiling_ends_per_s']:,} runs a second need about {cores} cores)"
    )
    return f"""## Audit chain: the global chain's head under concurrent run ends

Command: `python -m bench.audit_chain --enders {" ".join(map(str, args.enders))} --ends {args.ends} --rounds {args.rounds} --runs {args.runs} --write`,
{date.today().isoformat()}, on {machine} (a shared machine: other work ran beside it, so the figures are
noisy); embedded PostgreSQL ({f["server"]}). Each ender is a thread ending runs one after another, as
a worker process does: a step's event in the run's chain, then in one transaction the run's last
event (sealing its chain) and its seal appended to the global chain (`audit.chain.append`, which
locks the global head until the commit), as the engine's fenced end does; "run chain only" leaves
the global seal out. Held: from the global seal's statement (or where it would be) to the end of the
commit, p50, the wait for the head included when enders contend; without the seal it is the commit
alone.

| enders | layout | ends/s, median (min..max) over {args.rounds} rounds |
|---|---|---|
{table}

Ends/s with the global seal over ends/s without it, per count of enders: {ratios}.

Per-run write cost, from {cost["runs"]} real runs (the replay pool, the static rules' plan of
{cost["steps_per_run"]} steps, submitted and executed in one process): {cost["ms_per_run"]} ms of wall
time a run, {"n/a" if db is None else db} ms of the database server's CPU, {cost["process_cpu_ms_per_run"]} ms
of the engine process's CPU.

**Finding.** An end holds the global head for {f["hold_ms_one_ender"]} ms (one ender, p50): the seal's
statement and the commit (the commit alone, without the seal: {commit} ms, its WAL flush). Every end in the system takes that lock in
turn, so the global chain takes at most about **{f["ceiling_ends_per_s"]:,} run ends a second**, and
that figure does not grow with workers or database cores (only with a faster flush). Everything else a
run writes goes to rows and a chain of its own and spreads over the server's cores. {here} A scaled-out
deployment hits the global head first once its database is larger than that: {scaled}. The engine's
one-statement end (`routing/engine/run_end.py`, `_end_at_once`) holds the head the same way, from the
statement's `g0` to its commit, and writes the run's, the task's and the rollups' rows in that
statement: its hold is no shorter than the one measured here.

**Batch seal (a design, not built).** A run's end would stop touching the global head: in its
transaction it seals its own chain as now and inserts one row into a table of pending seals (run,
chain, last seq, last hash), a plain insert that no other end waits for. One sealer at a time (a task
on the `maintenance` queue every second or so, or whichever end finds a batch due, under a try-lock)
takes the pending seals in id order, up to a batch size, appends one global event that commits to
them (their count, first and last ids, and the root of a Merkle tree over (chain, seq, hash) in id
order) and marks them sealed with that event's seq, in one transaction. The head is then taken once a
batch: the ceiling becomes the batch size over the hold (thousands of run ends a second at batches of
tens). What changes: a run's seal reaches the global chain within one sealing interval instead of at
its commit (its own chain is sealed at once, as now); a run's proof adds its batch's event and its
Merkle path; full verification also checks that every sealed run chain older than the interval has a
batched seal, and that each batch's root matches its seals."""


if __name__ == "__main__":
    main()
