"""The LLM conductor end to end on the CPU: a dataset from rollouts, a TRL GRPO + LoRA job whose rewards come
from executing the sampled plans through the engine, and promotion that loads the adapter into a vLLM-like
server, after which that conductor plans the next task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.models import AuditEvent
from audit.services import Actor
from routing import engine, replay
from routing.models import ConductorVersion, Decision, Run, Task
from routing.services import TaskSubmission, conductor_active, task_submit
from tests.openai_server import Reply
from training.models import Dataset, JobStatus, Rollout, RolloutBatch, TrainingMetric
from training.rewards import RewardConfig
from training.services import conductor_promote, dataset_build, job_start, rollouts_start
from training.tasks import train_job
from training.tiny_model import make_tiny_model

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
ITEMS = ["cruxeval-o:crux-test-#1", "gsm8k:gsm8k-main-test-#1000"]


def given(task: Task, worker: str) -> str:
    return json.dumps({"thought": "t", "steps": [{"worker": worker, "instruction": task.text, "access": []}]})


def dataset_of_two_items(name: str) -> Dataset:
    """A GRPO dataset from rollouts of two recorded items, two samples each (one strong worker's plan,
    one weak worker's), executed by the engine: the prompts a LoRA job trains on."""
    batch = rollouts_start(version=conductor_active(), items=ITEMS, k=2, temperature=1.0, actor=ACTOR)
    for rollout in Rollout.objects.filter(batch=batch).select_related("task"):
        worker = "gpt-4o-2024-08-06" if rollout.sample == 0 else "gemma-2-9b-it"
        Run.objects.filter(pk=rollout.run_id).update(plan_override=given(rollout.task, worker))
        engine.execute_run(rollout.run_id)
    return dataset_build(
        name=name,
        batch_ids=[batch.pk],
        reward_config=RewardConfig(format_term=True),
        validation_fraction=0.0,
        actor=ACTOR,
    )


def test_a_lora_job_trains_on_engine_rewards_and_its_promotion_loads_the_adapter(
    replay_pool, openai_server, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    settings.CONDUCTOR_VLLM_API_BASE = openai_server.base_url
    dataset = dataset_of_two_items("lora-data")
    make_tiny_model(tmp_path / "models" / "tiny-qwen2")

    job = job_start(
        name="lora-1",
        backend="llm-lora",
        dataset=dataset,
        options={"max_steps": 2, "num_generations": 2, "prompts_per_step": 2, "max_completion_length": 24},
        actor=ACTOR,
    )
    train_job(job.pk)  # what the training queue's worker runs
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    adapter = tmp_path / job.artifact_path
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    points = list(TrainingMetric.objects.filter(job=job).order_by("step"))
    assert [p.step for p in points] == [1, 2] and all(
        "reward" in p.values and "loss" in p.values for p in points
    )

    # every sampled plan ran through the engine as a rollout; the random model's text is no plan (reward 0)
    samples = Run.objects.filter(rollout__batch__in=RolloutBatch.objects.filter(training_job=job))
    assert samples.count() == 2 * 2 * 2  # steps x prompts x generations
    assert set(Decision.objects.filter(run__in=samples, depth=0).values_list("backend", flat=True)) == {
        "given"
    }
    assert all(p.values["reward"] == 0.0 for p in points)

    candidate = job.candidate
    assert (
        candidate.backend == ConductorVersion.Backend.LLM and Path(candidate.config["lora_path"]) == adapter
    )
    conductor_promote(version=candidate, actor=ACTOR)
    assert openai_server.loaded_adapters == {"lora-1": str(adapter)}

    # the promoted conductor plans the next task: asked through the same server, under its adapter's name
    item = replay.find_item(item_id=ITEMS[1], texts=[])
    task_text = item.task
    openai_server.program(
        "lora-1",
        [
            Reply(
                json.dumps(
                    {
                        "thought": "cheap",
                        "steps": [{"worker": "gemma-2-9b-it", "instruction": task_text, "access": []}],
                    }
                )
            )
        ],
    )
    task, _ = task_submit(
        submission=TaskSubmission(text=task_text, domain=item.domain, source_item=item.id),
        source=Task.Source.CLI,
    )
    run = task.runs.get()
    assert run.conductor_version == candidate
    engine.execute_run(run.pk)
    decision = Decision.objects.get(run=run, depth=0)
    assert decision.backend == "llm" and decision.version_name == "lora-1" and decision.valid
    assert len(openai_server.requests_for("lora-1")) == 1
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {
        "training.job_started",
        "training.job_succeeded",
        "conductorversion.registered",
        "conductor.promoted",
    } <= actions
