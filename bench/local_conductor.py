"""The local LLM conductor on a CPU: how often SmolLM2-135M writes a valid workflow, how long a plan
takes, and what its workflows score against the static rules on recorded items.

    python -m bench.local_conductor --items 40 [--write]

Starts (or finds) the local model's server (llama.cpp, SmolLM2-135M-Instruct Q4_1), registers the
replay pool and the local model, and evaluates the `smollm2-local` conductor against the static
rules on the first --items items of the dev split, as an evaluation from the training page does:
every run goes through the engine in this process (as a Celery worker runs it), the plan's time
included from the conductor's request to its recorded decision. Prints one JSON line and, with
--write, replaces its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from bench.docs import write_section
from conductor_web.embedded import django_setup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
django_setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from audit.services import Actor  # noqa: E402
from conductor_web import local_model  # noqa: E402
from routing import engine  # noqa: E402
from routing.local_pool import local_model_register  # noqa: E402
from routing.models import ConductorVersion, Decision  # noqa: E402
from routing.services import conductor_active  # noqa: E402
from training.models import EvaluationRun  # noqa: E402
from training.services import evaluation_refresh, evaluation_start  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--write", action="store_true", help="write the figures into docs/benchmarks.md")
    o = parser.parse_args()

    call_command("load_replay_pool", verbosity=0)
    api_base = local_model.start(settings.VAR_DIR, port=settings.LOCAL_MODEL_PORT)
    _, local = local_model_register(api_base=api_base, actor=Actor.service("bench"))
    conductor_active()  # the static rules exist
    static = ConductorVersion.objects.get(name="static-v1")
    evaluation = evaluation_start(
        candidate=local, baseline=static, split=o.split, limit=o.items, actor=Actor.service("bench")
    )
    started = time.monotonic()
    for link in EvaluationRun.objects.filter(evaluation=evaluation).order_by("pk"):
        engine.execute_run(link.run_id)
    wall = time.monotonic() - started
    evaluation = evaluation_refresh(evaluation)
    runs = EvaluationRun.objects.filter(evaluation=evaluation, side="candidate").values_list(
        "run_id", flat=True
    )
    decisions = list(Decision.objects.filter(run_id__in=list(runs), depth=0).order_by("run_id", "attempt"))
    first = [d for d in decisions if d.attempt == 1]
    latencies = [d.latency_ms / 1000 for d in decisions]
    out_tokens = [d.output_tokens for d in decisions]
    figures = {
        "items": len(first),
        "valid_first_try": round(sum(d.valid for d in first) / len(first), 3),
        "valid_after_retry": round(len({d.run_id for d in decisions if d.valid}) / len(first), 3),
        "plan_s_p50": round(statistics.median(latencies), 2),
        "plan_s_p95": round(percentile(latencies, 0.95), 2),
        "output_tokens_p50": statistics.median(out_tokens),
        "with_alternatives": round(
            sum(bool(d.alternatives) for d in decisions if d.valid) / max(1, sum(d.valid for d in decisions)),
            3,
        ),
        "candidate": evaluation.results["candidate"],
        "baseline": evaluation.results["baseline"],
        "wall_s": round(wall, 1),
    }
    print(json.dumps(figures))
    if o.write:
        c, b = figures["candidate"], figures["baseline"]
        write_section(
            "local-conductor",
            f"""## The local LLM conductor on a CPU

Command: `python -m bench.local_conductor --items {o.items} --write` (SmolLM2-135M-Instruct Q4_1 on
llama.cpp's server, {os.cpu_count()} cores, {platform.processor() or platform.machine()}; the first
{figures["items"]} items of the `{o.split}` split; the workflow's JSON schema as the server's grammar,
the alternatives probed at each worker's name; every run through the engine in one process).

| | figure |
|---|---|
| valid workflow, first try | {figures["valid_first_try"]:.1%} |
| valid workflow after the one retry with the error shown | {figures["valid_after_retry"]:.1%} |
| plan latency p50 / p95 (request to recorded decision) | {figures["plan_s_p50"]} s / {figures["plan_s_p95"]} s |
| output tokens per plan (median) | {figures["output_tokens_p50"]} |
| valid plans that carry the alternatives weighed | {figures["with_alternatives"]:.0%} |

| conductor | accuracy | USD per 1,000 tasks | failed runs | p95 plan |
|---|---|---|---|---|
| {c["version"]} (SmolLM2-135M, untrained) | {c["accuracy"]} | {c["usd_per_1000"]} | {c["failed"]} | {c["p95_plan_ms"]} ms |
| {b["version"]} (static rules) | {b["accuracy"]} | {b["usd_per_1000"]} | {b["failed"]} | {b["p95_plan_ms"]} ms |
""",
        )


if __name__ == "__main__":
    main()
