"""Live graph benchmark: commit-to-browser latency of the engine's live events.

    python -m bench.live_latency --steps 500

Runs against the configured database and Redis (the embedded ones when DATABASE_URL / REDIS_URL
are unset): starts the project's ASGI app under daphne, a loopback OpenAI-protocol server whose
workers answer instantly, and headless Chromium. For each task it opens the task's graph page,
runs the engine in this process (as a Celery worker would) and waits until the page shows the
finished run; tasks run one after another until at least --steps steps were executed.

Each live event carries `sent_at` (wall clock right after the commit); the page records
`Date.now() - sent_at` on arrival. All events of the runs are counted, whatever their action.
Prints one JSON line and, with --write, replaces the live section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

from accounts.models import Role  # noqa: E402
from audit.chain import run_chain  # noqa: E402
from audit.grants import user_set_roles  # noqa: E402
from audit.models import ChainHead  # noqa: E402
from routing import engine  # noqa: E402
from routing.models import ConductorVersion, RunStatus, Step, Task, Worker  # noqa: E402
from routing.services import TaskSubmission, task_submit  # noqa: E402
from tests.openai_server import OpenAIServer, Reply, plan_json  # noqa: E402

STEPS_PER_TASK = 5
WORKERS = ("live-a", "live-b")
USERNAME = "live-bench"
PASSWORD = uuid.uuid4().hex


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def set_up(server: OpenAIServer) -> None:
    """Workers and an LLM conductor on the loopback server (5-step sequential plans); a user with a role."""
    from decimal import Decimal

    for slug in WORKERS:
        Worker.objects.update_or_create(
            slug=slug,
            defaults={
                "display_name": slug,
                "litellm_model": f"openai/{slug}",
                "api_base": server.base_url,
                "vendor": "bench",
                "enabled": True,
                "input_usd_per_mtok": Decimal("1.00"),
                "output_usd_per_mtok": Decimal("2.00"),
                "price_source": Worker.PriceSource.OVERRIDE,
            },
        )
        server.program(slug, [Reply(f"{slug}: done")])
    plan = plan_json(
        *[
            (WORKERS[i % len(WORKERS)], f"Step {i} of the chain", [i - 1] if i else [])
            for i in range(STEPS_PER_TASK)
        ],
        thought="a sequential chain",
    )
    server.program("conductor", [Reply(plan)])
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.update_or_create(
        name="live-bench",
        defaults={
            "backend": ConductorVersion.Backend.LLM,
            "is_active": True,
            "config": {
                "model": "hosted_vllm/conductor",
                "api_base": server.base_url,
                "input_usd_per_mtok": "0.10",
                "output_usd_per_mtok": "0.20",
            },
        },
    )
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_password(PASSWORD)
    user.save()
    user_set_roles(user=user, roles=[Role.OPERATOR])


def run_engine(run_id: int) -> None:
    """In a thread of its own: Playwright's loop is marked running in the main thread, where the
    engine's publishing (async_to_sync) would refuse to run."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            engine.execute_run(run_id)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=500, help="run tasks until at least this many steps ran")
    parser.add_argument("--write", action="store_true", help="write the figures to docs/benchmarks.md")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, DaphneServer

    call_command("migrate", verbosity=0)
    server = OpenAIServer().start()
    set_up(server)
    var_dir = Path(tempfile.mkdtemp(prefix="live-bench-"))
    DaphneServer.collectstatic(var_dir, settings.DATABASE_URL, settings.REDIS_URL)
    daphne = DaphneServer(
        database_url=settings.DATABASE_URL,
        redis_url=settings.REDIS_URL,
        var_dir=var_dir,
        log_path=var_dir / "daphne.log",
    ).wait_ready()
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop runs in this thread; see tests
    playwright = sync_playwright().start()
    latencies: list[float] = []
    tasks = steps = reloads = 0
    started = time.monotonic()
    try:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(base_url=daphne.url).new_page()
        page.set_default_timeout(30_000)
        page.goto("/login/")
        page.get_by_label("Username").fill(USERNAME)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(re.compile(re.escape(daphne.url) + r"/$"))
        prefix = uuid.uuid4().hex[:8]
        while steps < args.steps:
            task, _ = task_submit(
                submission=TaskSubmission(text=f"live bench {prefix} #{tasks}"), source=Task.Source.CLI
            )
            run = task.runs.get()
            page.goto(f"/tasks/{task.pk}/graph/")
            page.wait_for_function("() => document.getElementById('live-state').textContent === 'live'")
            page.wait_for_function("() => window.__conductorGraph.run !== null")
            run_engine(run.pk)
            run.refresh_from_db()
            if run.status != RunStatus.SUCCEEDED:
                raise SystemExit(f"run {run.pk} ended {run.status}: {run.error}")
            final_seq = ChainHead.objects.get(chain=run_chain(run.correlation_id)).seq
            # The page has caught up: the finished run on screen, every event of the chain seen.
            page.wait_for_function(
                "(seq) => document.getElementById('graph').dataset.runStatus === 'succeeded'"
                " && window.__conductorGraph.lastSeq === seq",
                arg=final_seq,
                timeout=10_000,
            )
            seen = page.evaluate(
                "() => ({ latencies: window.__conductorGraph.latencies, reloads: window.__conductorGraph.reloads })"
            )
            latencies.extend(seen["latencies"])
            reloads += seen["reloads"]
            steps += Step.objects.filter(run=run).count()
            tasks += 1
        browser.close()
    finally:
        playwright.stop()
        daphne.stop()
        server.stop()
    elapsed = time.monotonic() - started
    if not latencies:
        raise SystemExit("no live event reached the browser")
    ms = [v * 1000 for v in latencies]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result = {
        "figure": "live_event_commit_to_browser_ms",
        "tasks": tasks,
        "steps": steps,
        "events": len(ms),
        "p50": round(statistics.median(ms), 2),
        "p95": round(percentile(ms, 0.95), 2),
        "max": round(max(ms), 2),
        "page_rereads": reloads,
        "elapsed_s": round(elapsed, 1),
        "machine": machine,
    }
    print(json.dumps(result))
    if args.write:
        write_docs(result, args)


def write_docs(result: dict, args: argparse.Namespace) -> None:
    write_section(
        "live",
        f"""## Live graph: commit-to-browser latency

Command: `python -m bench.live_latency --steps {args.steps}` on {result["machine"]}, PostgreSQL and
Redis on loopback, the ASGI app under daphne, headless Chromium with one graph page open. The engine
runs {result["tasks"]} tasks of {STEPS_PER_TASK} sequential steps one after another ({result["steps"]} steps) with workers
that answer instantly; every live event's `sent_at` (taken right after its transaction commits) is
compared with the page's clock when the event arrives over the websocket.

| figure | value |
|---|---|
| live events received (every event the runs published) | {result["events"]} |
| commit to browser, p50 / p95 / max | {result["p50"]} ms / {result["p95"]} ms / {result["max"]} ms |
| REST re-reads by the pages (initial loads, finished steps, gaps) | {result["page_rereads"]} |

The path measured: `transaction.on_commit` → Redis channel layer → daphne → websocket → the page's
handler. Redrawing after a re-read over REST is not included.""",
    )


if __name__ == "__main__":
    main()
