"""Does GRPO make the LLM conductor better? SmolLM2-135M-Instruct, trained on the CPU, against itself.

    python -m bench.llm_conductor --train-items 64 --steps 10 --dev-items 40 [--write]

What ML staff do from the browser, in one process: rollouts on the first --train-items items of the
replay pool's train split give the prompts, a dataset is built from them, and an `llm-lora` job trains
a LoRA adapter on the local model with TRL's GRPO (--steps steps of 2 prompts x 4 plans, sampled under
the workflow's JSON schema as the server writes them; each plan executed by the engine on the replay pool and rewarded by the project's one formula: correctness
with the format term, minus the cost penalty). The trained adapter (served by the local model's
llama.cpp server) and the base model (`smollm2-local`) then each plan --dev-items items (an evaluation's mixed sample) of
the dev split, which nothing was tuned on, through the engine. Reported, candidate minus base over the
paired items, each with a 95% paired-bootstrap interval: reward, accuracy, USD per 1,000 tasks; and
each side's valid-plan rate. With --write, the figures replace their section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
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
from routing import engine, replay  # noqa: E402
from routing.local_pool import local_model_register  # noqa: E402
from routing.models import Decision, Run  # noqa: E402
from routing.services import conductor_active  # noqa: E402
from training.local_base import local_base_dir  # noqa: E402
from training.models import EvaluationRun, Rollout, TrainingMetric  # noqa: E402
from training.rewards import RewardConfig, run_reward  # noqa: E402
from training.services import (  # noqa: E402
    dataset_build,
    evaluation_comparison,
    evaluation_refresh,
    evaluation_start,
    job_start,
    rollouts_start,
)
from training.services.evaluations import bootstrap_interval  # noqa: E402
from training.tasks import train_job  # noqa: E402

ACTOR = Actor.service("bench")
REWARD = RewardConfig(format_term=True)  # the jobs' default: cost penalty 0, the paper's format term


def execute(run_ids: list[int]) -> None:
    for run_id in run_ids:
        engine.execute_run(run_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-items", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--dev-items", type=int, default=40)
    parser.add_argument("--write", action="store_true", help="write the figures into docs/benchmarks.md")
    o = parser.parse_args()
    stamp = time.strftime("%Y%m%d%H%M%S")

    call_command("load_replay_pool", verbosity=0)
    api_base = local_model.start(settings.VAR_DIR, port=settings.LOCAL_MODEL_PORT)
    _, base = local_model_register(api_base=api_base, actor=ACTOR)

    # The prompts: rollouts of the active conductor on train items (each item becomes a task once).
    items = [i.id for i in replay.read_items(replay.split_path("train"))[: o.train_items]]
    batch = rollouts_start(version=conductor_active(), items=items, k=2, temperature=1.0, actor=ACTOR)
    execute(list(Rollout.objects.filter(batch=batch).values_list("run_id", flat=True)))
    dataset = dataset_build(
        name=f"bench-smollm2-{stamp}",
        batch_ids=[batch.pk],
        reward_config=REWARD,
        validation_fraction=0.0,
        actor=ACTOR,
    )

    started = time.monotonic()
    job = job_start(
        name=f"smollm2-grpo-{stamp}",
        backend="llm-lora",
        dataset=dataset,
        options={
            "base_model_path": str(local_base_dir()),
            "max_steps": o.steps,
            "num_generations": o.generations,
            "prompts_per_step": o.prompts_per_step,
            "max_completion_length": o.max_completion_length,
            "learning_rate": o.learning_rate,
        },
        actor=ACTOR,
    )
    train_job(job.pk)
    job.refresh_from_db()
    train_s = time.monotonic() - started
    if job.candidate is None:
        sys.exit(f"the job did not succeed: {job.error}\n{job.log}")
    curve = [
        (p.step, p.values.get("reward")) for p in TrainingMetric.objects.filter(job=job).order_by("step")
    ]

    started = time.monotonic()
    evaluation = evaluation_start(
        candidate=job.candidate, baseline=base, split="dev", limit=o.dev_items, actor=ACTOR
    )
    execute(
        list(
            EvaluationRun.objects.filter(evaluation=evaluation)
            .order_by("pk")
            .values_list("run_id", flat=True)
        )
    )
    evaluation = evaluation_refresh(evaluation)
    eval_s = time.monotonic() - started
    comparison = evaluation_comparison(evaluation)

    by_item: dict[str, dict[str, Run]] = {}
    for link in EvaluationRun.objects.filter(evaluation=evaluation).select_related("run"):
        by_item.setdefault(link.item, {})[link.side] = link.run
    pairs = [sides for sides in by_item.values() if len(sides) == 2]
    rewards = {
        side: [run_reward(p[side], REWARD).reward for p in pairs] for side in ("candidate", "baseline")
    }
    differences = [c - b for c, b in zip(rewards["candidate"], rewards["baseline"], strict=True)]
    reward_ci = bootstrap_interval(differences, seed=evaluation.pk)

    def valid_rate(side: str) -> float:
        runs = [p[side].pk for p in pairs]
        first = Decision.objects.filter(run_id__in=runs, depth=0, attempt=1)
        return round(sum(d.valid for d in first) / max(1, first.count()), 3)

    def last_workers(side: str) -> dict[str, int]:
        """How often each worker answers last in the side's valid top-level plans (what the plans chose)."""
        counts: dict[str, int] = {}
        runs = [p[side].pk for p in pairs]
        for decision in Decision.objects.filter(run_id__in=runs, depth=0, valid=True):
            steps = (decision.plan or {}).get("steps") or []
            if steps:
                counts[steps[-1]["worker"]] = counts.get(steps[-1]["worker"], 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    figures = {
        "train_items": len(items),
        "steps": o.steps,
        "train_s": round(train_s),
        "reward_curve": curve,
        "dev_pairs": len(pairs),
        "eval_s": round(eval_s),
        "reward": {
            "base": round(sum(rewards["baseline"]) / len(pairs), 4),
            "trained": round(sum(rewards["candidate"]) / len(pairs), 4),
            "delta": round(sum(differences) / len(pairs), 4),
            "ci95": reward_ci,
        },
        "accuracy": dataclasses.asdict(comparison.accuracy) if comparison.accuracy else None,
        "usd_per_1000": dataclasses.asdict(comparison.usd_per_1000) if comparison.usd_per_1000 else None,
        "valid_first_try": {"base": valid_rate("baseline"), "trained": valid_rate("candidate")},
        "answered_last_by": {"base": last_workers("baseline"), "trained": last_workers("candidate")},
        "results": evaluation.results,
    }
    print(json.dumps(figures, default=str))
    if o.write:
        write_section("llm-conductor", report(o, figures))


def report(o: argparse.Namespace, f: dict) -> str:
    r, a, c = f["reward"], f["accuracy"] or {}, f["usd_per_1000"] or {}
    base, trained = f["results"]["baseline"], f["results"]["candidate"]

    def interval(ci) -> str:
        return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "n/a"

    return f"""## GRPO on the local LLM conductor (SmolLM2-135M on a CPU)

Command: `python -m bench.llm_conductor --train-items {o.train_items} --steps {o.steps} --prompts-per-step {o.prompts_per_step} --generations {o.generations} --dev-items {o.dev_items} --write`
({os.cpu_count()} cores, {platform.processor() or platform.machine()}). TRL GRPO + LoRA (r=8, learning
rate {o.learning_rate:g}) on SmolLM2-135M-Instruct, {o.steps} steps of {o.prompts_per_step} prompts x
{o.generations} sampled plans (at most {o.max_completion_length} tokens, temperature 1.0, under the
workflow's JSON schema as the server writes plans), prompts from the first {f["train_items"]} train items; each plan executed
by the engine on the replay pool; reward = correctness with the format term (0 unparsed, 0.5 parsed
and wrong, 1 right), no cost penalty. Training took {f["train_s"]} s. Then the trained adapter and the
base model each planned {f["dev_pairs"]} dev items, an evaluation's sample of the split (domains mixed; llama.cpp's
server, the schema as its grammar; {f["eval_s"]} s). Candidate minus base over the paired items, 95% paired-bootstrap intervals:

| | base | trained | trained minus base | 95% interval |
|---|---|---|---|---|
| reward | {r["base"]} | {r["trained"]} | {r["delta"]:+.3f} | {interval(r["ci95"])} |
| accuracy | {base["accuracy"]} | {trained["accuracy"]} | {a.get("delta", 0):+.3f} | {interval((a.get("low"), a.get("high")) if a.get("low") is not None else None)} |
| USD per 1,000 tasks | {base["usd_per_1000"]} | {trained["usd_per_1000"]} | {c.get("delta", "n/a")} | {c.get("low", "n/a")} to {c.get("high", "n/a")} |
| valid plan, first try | {f["valid_first_try"]["base"]:.1%} | {f["valid_first_try"]["trained"]:.1%} | | |

Mean reward of the sampled plans per training step: {", ".join(f"{s}: {v:.3f}" for s, v in f["reward_curve"] if v is not None)}.

The worker answering last in the valid plans on dev (the answer's source): base {plain_counts(f["answered_last_by"]["base"])};
trained {plain_counts(f["answered_last_by"]["trained"])}.
"""


def plain_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{worker} {n}" for worker, n in counts.items()) or "none"


if __name__ == "__main__":
    main()
