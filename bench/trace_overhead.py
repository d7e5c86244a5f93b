"""What exporting runs as OpenTelemetry traces costs the engine: steps per second, export on vs off.

    python -m bench.trace_overhead --tasks 40 --rounds 3 [--endpoint http://127.0.0.1:6006] [--write]

One process executes replay tasks (static conductor, replay workers that answer at once, so the
figures are the engine's own overhead) one after another, in interleaved rounds: a batch with export
off, a batch with export on, the order alternating. With export on each finished run's spans are
built from the record and queued for the SDK's batch processor, whose thread sends them over
OTLP/HTTP to --endpoint (a real receiver such as Phoenix) or, without one, to a sink process started
here that accepts every export. The time to send what is still queued after a batch (the flush) is
reported apart: it is not on any run's path.

Runs against the configured database (the embedded one when DATABASE_URL is unset); its tasks go to
a queue prefix of their own, which nothing consumes and which is emptied at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sink(port: int) -> None:
    """An OTLP/HTTP receiver that accepts everything (the bench's default, in its own process)."""

    class Accept(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Accept).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=40, help="tasks per batch")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of batches (off, on)")
    parser.add_argument("--endpoint", help="an OTLP/HTTP base URL (e.g. Phoenix's); default: a sink process")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    parser.add_argument("--sink", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        sink(args.sink)
        return

    prefix = f"bench-otel-{uuid.uuid4().hex[:8]}-"
    os.environ["CONDUCTOR_QUEUE_PREFIX"] = prefix
    os.environ["CONDUCTOR_REPLAY_LATENCY_S"] = "0"
    os.environ.setdefault("LOG_LEVEL", "WARNING")  # not a line per event on the console
    os.environ.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    receiver = None
    endpoint = args.endpoint
    if endpoint is None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        receiver = subprocess.Popen(
            [sys.executable, "-m", "bench.trace_overhead", "--sink", str(port)], cwd=ROOT
        )
        endpoint = f"http://127.0.0.1:{port}"
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint

    from conductor_web.embedded import django_setup

    django_setup()
    from django.conf import settings
    from django.core.management import call_command

    from bench.docs import write_section
    from observability import telemetry
    from routing import engine, replay
    from routing.models import Step, Task
    from routing.services import TaskSubmission, task_submit

    call_command("migrate", verbosity=0)
    call_command("load_replay_pool", verbosity=0)
    items = replay.read_items(replay.split_path(args.split))
    tag = uuid.uuid4().hex[:8]

    def batch(n: int, export: bool) -> dict:
        settings.OTEL_TRACES = export
        chosen = [items[(n * args.tasks + i) % len(items)] for i in range(args.tasks)]
        tasks = []
        for i, item in enumerate(chosen):
            task, _ = task_submit(
                submission=TaskSubmission.of_replay(item, idempotency_key=f"bench-otel-{tag}-{n}-{i}"),
                source=Task.Source.CLI,
            )
            tasks.append(task)
        before = telemetry.counts()
        started = time.perf_counter()
        for task in tasks:
            engine.execute_run(task.runs.get(kind="live").pk)
        elapsed = time.perf_counter() - started
        flush_started = time.perf_counter()
        telemetry.flush()
        flush_s = time.perf_counter() - flush_started
        after = telemetry.counts()
        steps = Step.objects.filter(run__task__in=tasks).count()
        return {
            "export": export,
            "tasks": len(tasks),
            "steps": steps,
            "elapsed_s": elapsed,
            "steps_per_s": steps / elapsed,
            "flush_s": flush_s,
            "spans_queued": after.spans_queued - before.spans_queued,
            "spans_exported": after.spans_exported - before.spans_exported,
            "spans_failed": after.spans_failed - before.spans_failed,
        }

    rows = []
    try:
        batch(0, True)  # warm-up: imports, the replay index, the exporter's first connection
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for export in order:
                rows.append(batch(1 + 2 * r + int(export), export))
    finally:
        telemetry.shutdown()
        if receiver is not None:
            receiver.terminate()
        from conductor_web.celery import app

        with app.connection_for_write() as conn:
            for queue in ("runs", "resume"):
                with contextlib.suppress(Exception):  # a queue that was never made
                    conn.default_channel.queue_purge(prefix + queue)

    off = [r["steps_per_s"] for r in rows if not r["export"]]
    on = [r["steps_per_s"] for r in rows if r["export"]]
    exported = sum(r["spans_exported"] for r in rows if r["export"])
    summary = {
        "figure": "trace_export_overhead",
        "receiver": "the given endpoint" if args.endpoint else "a sink process",
        "tasks_per_batch": args.tasks,
        "rounds": args.rounds,
        "steps_per_s_off": round(statistics.median(off), 2),
        "steps_per_s_on": round(statistics.median(on), 2),
        # Each round's own pair (on / off), so that drift between rounds cancels out.
        "change_pct": round(100 * (statistics.median(a / b for a, b in zip(on, off, strict=True)) - 1), 1),
        "spans_exported": exported,
        "spans_failed": sum(r["spans_failed"] for r in rows),
        "spans_per_step": round(exported / max(1, sum(r["steps"] for r in rows if r["export"])), 2),
        "flush_s_max": round(max(r["flush_s"] for r in rows if r["export"]), 3),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
    }
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    print(json.dumps(summary))
    if args.write:
        receiver_name = (
            "Arize Phoenix (`phoenix serve`)" if args.endpoint else "a sink process that accepts every export"
        )
        write_section(
            "traces",
            f"""## Trace export: steps per second with OpenTelemetry export on and off

Command: `python -m bench.trace_overhead --tasks {args.tasks} --rounds {args.rounds}{" --endpoint URL" if args.endpoint else ""}`
on {summary["machine"]}, embedded PostgreSQL; one process executes replay tasks (static conductor,
instant replay workers) one after another; batches with export off and on interleave. Receiver:
{receiver_name}. Medians over {args.rounds} batches of {args.tasks} tasks each:

| export | steps per second |
|---|---|
| off | {summary["steps_per_s_off"]} |
| on | {summary["steps_per_s_on"]} |

Median change within a round (export on against the same round's export off): {summary["change_pct"]:+} %.

{summary["spans_exported"]} spans sent ({summary["spans_per_step"]} per step: the run, its plans, its
steps and their calls), {summary["spans_failed"]} failed. Sending what was still queued after a batch
took at most {summary["flush_s_max"]} s, on the processor's own thread, not on a run's path.""",
        )


if __name__ == "__main__":
    main()
