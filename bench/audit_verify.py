"""What verification costs: one run's proof (what a dossier checks) and the whole record.

    CONDUCTOR_VAR_DIR=/tmp/bench-verify python -m bench.audit_verify --runs 20000 --events 20 --write

Builds a record in a private database: `--runs` sealed run chains of `--events` events each (hashed
exactly as the app hashes them, inserted in bulk), their seals in the global chain and a signed
checkpoint every `--per-checkpoint` runs, as beat makes them; plus a few real runs made by the engine
on the replay pool, so that one run's proof includes the comparison of its rows with its events. Then
times one run's proof on random runs, and a full verification with its peak Python memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from audit import chain  # noqa: E402
from audit.checkpoints import checkpoint_create  # noqa: E402
from audit.models import GLOBAL_CHAIN, AuditEvent, ChainHead, LogNode, PendingSeal  # noqa: E402
from audit.seals import seal_pending  # noqa: E402
from audit.verify import full as verify_full  # noqa: E402
from audit.verify import tree as verify_tree  # noqa: E402
from audit.verify import verify  # noqa: E402

# Where a full verification's time goes: each part's problems are consumed (list) inside the timer.
PARTS: dict[str, float] = {}


def _timed_part(module, name: str, label: str) -> None:
    original = getattr(module, name)

    def part(*args, **kwargs):
        started = time.perf_counter()
        try:
            return list(original(*args, **kwargs))
        finally:
            PARTS[label] = PARTS.get(label, 0.0) + time.perf_counter() - started

    setattr(module, name, part)


for _module, _name, _label in (
    (verify_full, "_seals_against_tails", "seals against chain tails"),
    (verify_full, "all_end_problems", "ended chains and pending seals"),
    (verify_full, "_unrecorded_purges_all", "purges"),
    (verify_full, "_anchor_problems", "checkpoint files and signed heads"),
    (verify_full, "tree_problems", "tree: all"),
    (verify_tree, "_leaf_problems", "tree: leaves against seals"),
    (verify_tree, "_root_problems", "tree: signed and grown roots"),
):
    _timed_part(_module, _name, _label)


def synthetic_chains(runs: int, events: int, per_checkpoint: int, with_log: bool = True) -> None:
    """Sealed run chains in bulk, a seal for each in the global chain, a checkpoint now and then.

    `with_log` (the record the sealer makes now): each run's end's PendingSeal row in bulk, then each
    batch of `per_checkpoint` sealed by the sealer itself (audit.seals.seal_pending, as beat calls it):
    the run.sealed events, the rows' leaves and the Merkle tree's LogNode rows, an audit.log_grown
    event and a signed tree head, in one transaction. Without it, the record of before the log: each
    seal appended to the global chain in turn, and a checkpoint of the heads per batch."""
    start = datetime.now(UTC) - timedelta(hours=1)
    done = 0
    while done < runs:
        batch = min(per_checkpoint, runs - done)
        rows, heads, seals, pending = [], [], [], []
        for _ in range(batch):
            correlation = uuid.uuid4()
            name = chain.run_chain(correlation)
            prev = chain.GENESIS
            for seq in range(1, events + 1):
                at = start + timedelta(milliseconds=seq)
                fields = {
                    "actor_type": "service",
                    "actor_id": "",
                    "actor_name": "engine",
                    "action": "bench.step",
                    "object_type": "step",
                    "object_id": str(seq),
                    "task_id": None,
                    "correlation_id": correlation,
                    "payload": {"index": seq, "note": "x" * 200},
                }
                content = chain.content_of(chain=name, seq=seq, occurred_at=at, **fields)
                digest = chain.digest(prev, content)
                rows.append(
                    AuditEvent(chain=name, seq=seq, prev_hash=prev, hash=digest, occurred_at=at, **fields)
                )
                prev = digest
            heads.append(
                ChainHead(chain=name, seq=events, hash=prev, sealed=True, updated_at=datetime.now(UTC))
            )
            seals.append((name, events, prev))
            pending.append(
                PendingSeal(
                    chain=name,
                    object_type="run",
                    object_id="0",
                    task_id=None,
                    seq=events,
                    hash=prev,
                    created_at=start + timedelta(milliseconds=events + 1),
                )
            )
        if with_log:
            with transaction.atomic():
                AuditEvent.objects.bulk_create(rows, batch_size=5000)
                ChainHead.objects.bulk_create(heads, batch_size=5000)
                PendingSeal.objects.bulk_create(pending, batch_size=5000)
            while seal_pending(limit=per_checkpoint):  # the sealer's batches, each signed
                pass
            done += batch
            print(f"  {done} synthetic runs", file=sys.stderr, flush=True)
            continue
        with transaction.atomic():
            AuditEvent.objects.bulk_create(rows, batch_size=5000)
            ChainHead.objects.bulk_create(heads, batch_size=5000)
            for name, seq, head_hash in seals:
                chain.append(
                    chain=GLOBAL_CHAIN,
                    actor_type="service",
                    actor_id="",
                    actor_name="engine",
                    action="run.sealed",
                    object_type="run",
                    object_id="0",
                    task_id=None,
                    correlation_id=None,
                    payload={"chain": name, "seq": seq, "hash": head_hash},
                )
        checkpoint_create(only_if_moved=True)
        done += batch
        print(f"  {done} synthetic runs", file=sys.stderr, flush=True)


def real_runs(count: int) -> list[str]:
    from routing import engine, replay
    from routing.models import Task
    from routing.services import TaskSubmission, task_submit

    call_command("load_replay_pool", verbosity=0)
    names = []
    for item in replay.read_items(replay.split_path("dev"))[:count]:
        task, _ = task_submit(
            submission=TaskSubmission(
                text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
            ),
            source=Task.Source.API,
        )
        run = task.runs.get()
        engine.execute_run(run.pk)
        names.append(chain.run_chain(run.correlation_id))
    while seal_pending():  # their pending seals, as beat's sealer takes them
        pass
    checkpoint_create(only_if_moved=True)
    return names


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return sorted(out)


def pct(values: list[float], q: float) -> float:
    return round(values[int(q * (len(values) - 1))], 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20000)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--per-checkpoint", type=int, default=500)
    parser.add_argument("--real", type=int, default=10)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--no-log", action="store_true", help="the record of before the log (no tree)")
    parser.add_argument("--rounds", type=int, default=1, help="full verifications timed (the spread)")
    parser.add_argument("--no-memory", action="store_true", help="skip the traced pass for peak memory")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    from routing.services import conductor_active

    conductor_active()
    started = time.perf_counter()
    synthetic_chains(args.runs, args.events, args.per_checkpoint, with_log=not args.no_log)
    print(f"  built in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    real = real_runs(args.real)
    total = AuditEvent.objects.count()
    synthetic = list(
        ChainHead.objects.filter(sealed=True).exclude(chain__in=real).values_list("chain", flat=True)[:5000]
    )
    rng = random.Random(7)

    def one_synthetic() -> None:
        report = verify(chains=[rng.choice(synthetic)], rows=False)
        assert report.intact, report.summary()

    def one_real() -> None:
        report = verify(chains=[rng.choice(real)])
        assert report.intact, report.summary()

    synthetic_ms = timed(one_synthetic, args.samples)
    real_ms = timed(one_real, args.samples)
    rounds, parts = [], []
    for _ in range(args.rounds):
        PARTS.clear()
        started = time.perf_counter()
        # rows=False: the synthetic chains have no run rows, and the row check (governance.run_rows)
        # reports every sealed chain without a run row as a run deleted; the real runs' rows are
        # timed above (one_real_run_with_rows).
        report = verify(rows=False)
        rounds.append(time.perf_counter() - started)
        assert report.intact, report.summary()
        parts.append(
            {
                "walk of every chain (the rest)": rounds[-1]
                - sum(v for k, v in PARTS.items() if not k.startswith("tree: ") or k == "tree: all"),
                **PARTS,
            }
        )
        print(
            json.dumps(
                {"full_verify_s": round(rounds[-1], 2), **{k: round(v, 2) for k, v in parts[-1].items()}}
            ),
            flush=True,
        )
    full_s = statistics.median(rounds)
    peak_mb = float("nan")
    if not args.no_memory:
        tracemalloc.start()  # a second pass for memory: tracing slows Python several times over
        verify(rows=False)
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result = {
        "events": total,
        "chains": report.chains,
        "checkpoints": report.checkpoints_checked,
        "one_run_proof_ms_p50": round(statistics.median(synthetic_ms), 2),
        "one_run_proof_ms_p95": pct(synthetic_ms, 0.95),
        "one_real_run_with_rows_ms_p50": round(statistics.median(real_ms), 2),
        "one_real_run_with_rows_ms_p95": pct(real_ms, 0.95),
        "log": not args.no_log,
        "leaves": PendingSeal.objects.filter(leaf_index__isnull=False).count(),
        "log_nodes": LogNode.objects.count(),
        "full_verify_s": round(full_s, 1),
        "full_verify_s_min": round(min(rounds), 1),
        "full_verify_s_max": round(max(rounds), 1),
        "rounds": args.rounds,
        "parts_s_median": {k: round(statistics.median(p[k] for p in parts), 2) for k in parts[0]},
        "full_verify_events_per_s": round(total / full_s),
        "full_verify_peak_python_mb": round(peak_mb, 1),
        "machine": machine,
    }
    print(json.dumps(result))
    if args.write:
        write_section(
            "audit-verify",
            f"""## Audit verification: one run's proof and the whole record

Command: `CONDUCTOR_VAR_DIR=/tmp/bench-verify python -m bench.audit_verify --runs {args.runs} --events {args.events} --write`
(a private embedded PostgreSQL) on {machine}. The record: {args.runs} sealed run chains of {args.events}
events each, hashed as the app hashes them, a signed checkpoint every {args.per_checkpoint} runs, and
{args.real} real runs made by the engine on the replay pool: {total} events in {report.chains} chains,
{report.checkpoints_checked} checkpoint files.

| check | p50 | p95 |
|---|---|---|
| one run's proof (its chain, its seal, the checkpoint that covers it, its file) | {result["one_run_proof_ms_p50"]} ms | {result["one_run_proof_ms_p95"]} ms |
| the same with its rows compared with its events (a real run; what a dossier shows) | {result["one_real_run_with_rows_ms_p50"]} ms | {result["one_real_run_with_rows_ms_p95"]} ms |

Full verification (every chain, every checkpoint file, every run's rows): {result["full_verify_s"]} s,
{result["full_verify_events_per_s"]} events/s, peak Python memory {result["full_verify_peak_python_mb"]} MB.
It holds one chain's walk and one batch of events, seals or signed heads at a time: what must be
compared across chains (seals with the ends of their chains, signed heads with seals, purges with the
global chain) goes to temporary tables that PostgreSQL compares, so its memory does not grow with
the number of events, chains or checkpoints (PostgreSQL's own work memory and temporary files do).""",
        )


if __name__ == "__main__":
    main()
