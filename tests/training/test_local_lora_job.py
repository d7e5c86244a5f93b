"""GRPO on the real local model: a TRL + LoRA job on SmolLM2-135M-Instruct (its checkpoint made from the
GGUF its server serves), rewards from executing the sampled plans through the engine, and a promotion
that the local model's server (llama.cpp) loads: the promoted conductor then plans a task there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from audit.models import AuditEvent
from audit.services import Actor
from conductor_web import local_model
from routing import engine, replay
from routing.models import ConductorVersion, Decision, Run, RunStatus, Task
from routing.services import TaskSubmission, conductor_active, task_submit
from training.local_base import local_base_dir
from training.models import JobStatus, Rollout, TrainingMetric
from training.rewards import RewardConfig
from training.services import conductor_promote, dataset_build, job_start, rollouts_start
from training.tasks import train_job

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
ITEMS = ["cruxeval-o:crux-test-#1", "gsm8k:gsm8k-main-test-#1000"]


@pytest.fixture
def served_adapters_restored(local_model_server):
    """The local model's server serves what it served before the test (the test's adapter dropped)."""
    before = local_model.served_adapters(settings.VAR_DIR)
    yield
    if local_model.served_adapters(settings.VAR_DIR) != before:
        (local_model.model_dir(settings.VAR_DIR) / "adapters.json").write_text(json.dumps(before))
        local_model.stop(settings.VAR_DIR)
        local_model.start(settings.VAR_DIR, port=settings.LOCAL_MODEL_PORT)


def test_grpo_on_the_local_model_and_its_promotion_into_llama_cpp(replay_pool, local_pool, served_adapters_restored):
    batch = rollouts_start(version=conductor_active(), items=ITEMS, k=2, temperature=1.0, actor=ACTOR)
    for rollout in Rollout.objects.filter(batch=batch).select_related("task"):
        worker = "gpt-4o-2024-08-06" if rollout.sample == 0 else "gemma-2-9b-it"
        plan = {"thought": "t", "steps": [{"worker": worker, "instruction": rollout.task.text, "access": []}]}
        Run.objects.filter(pk=rollout.run_id).update(plan_override=json.dumps(plan))
        engine.execute_run(rollout.run_id)
    dataset = dataset_build(
        name="local-lora-data",
        batch_ids=[batch.pk],
        reward_config=RewardConfig(format_term=True),
        validation_fraction=0.0,
        actor=ACTOR,
    )

    job = job_start(
        name="smollm2-grpo-test",
        backend="llm-lora",
        dataset=dataset,
        options={
            "base_model_path": str(local_base_dir()),
            "max_steps": 1,
            "num_generations": 2,
            "prompts_per_step": 2,
            "max_completion_length": 48,
        },
        actor=ACTOR,
    )
    train_job(job.pk)  # what the training queue's worker runs
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    adapter = settings.VAR_DIR / job.artifact_path
    try:
        assert "base: the local model, SmolLM2-135M-Instruct" in job.log
        (point,) = TrainingMetric.objects.filter(job=job)
        assert "reward" in point.values and "loss" in point.values
        candidate = job.candidate
        assert candidate.backend == ConductorVersion.Backend.LLM
        assert (candidate.config["serving"], candidate.config["model"]) == ("llama.cpp", "openai/smollm2-grpo-test")
        assert Path(candidate.config["lora_path"]) == adapter

        conductor_promote(version=candidate, actor=ACTOR)

        assert (adapter / "adapter.gguf").is_file()  # converted by llama.cpp's own script
        assert "smollm2-grpo-test" in local_model.models_served(local_pool["api_base"])
        promoted = AuditEvent.objects.get(action="conductor.promoted")
        assert promoted.payload["adapter"]["served_as"] == "smollm2-grpo-test"
        # The promoted conductor plans the next task on the local model's server, under its own name.
        item = replay.sample_items()[0]
        task, _ = task_submit(
            submission=TaskSubmission(
                text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
            ),
            source=Task.Source.CLI,
        )
        run = task.runs.get()
        assert run.conductor_version == candidate
        engine.execute_run(run.pk)
        run.refresh_from_db()
        decision = Decision.objects.filter(run=run, depth=0).latest("attempt")
        assert (decision.backend, decision.version_name) == ("llm", "smollm2-grpo-test")
        assert decision.valid and run.status == RunStatus.SUCCEEDED, decision.error or run.error
    finally:
        shutil.rmtree(adapter, ignore_errors=True)
