"""What the hash chain costs per engine step, and why one chain per run matters.

    python -m bench.audit_chain --threads 4 --events 500

Each thread appends events in its own transactions (one event per transaction, as the engine does
per step) either to its own run chain, or all threads to the single global chain. Prints one JSON
line per layout and, with --write, replaces the audit section of docs/benchmarks.md.
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
from pathlib import Path

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402

from audit.models import AuditEvent  # noqa: E402
from audit.services import ENGINE, event_record  # noqa: E402
from routing.models import ConductorVersion  # noqa: E402


def append_events(obj, correlation_id, count: int, latencies: list[float]) -> None:
    try:
        for i in range(count):
            started = time.perf_counter()
            with transaction.atomic():
                event_record(
                    actor=ENGINE,
                    action="bench.step",
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--events", type=int, default=500, help="per thread")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    from routing.services import conductor_active

    conductor_active()
    before = AuditEvent.objects.count()
    results = [measure(layout, args.threads, args.events) for layout in ("run chains", "one global chain")]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
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


if __name__ == "__main__":
    main()
