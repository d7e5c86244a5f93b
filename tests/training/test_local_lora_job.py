"""GRPO on the real local model: a TRL + LoRA job on SmolLM2-135M-Instruct (its checkpoint made from the
GGUF its server serves), rewards from executing the sampled plans through the engine, and a promotion
that the local model's server (llama.cpp) loads: the promoted conductor then plans a task there."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from audit.models import AuditEvent
from audit.services import Actor
from conductor_web import local_model
from routing import engine, replay
from routing.models import ConductorVersion, Decision, RunStatus, Task
from routing.services import TaskSubmission, task_submit
from tests.training.test_lora_job import dataset_of_two_items
from training.local_base import local_base_dir
from training.models import JobStatus, TrainingMetric
from training.services import conductor_promote, dataset_files, job_start
from training.tasks import train_job

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")


@pytest.fixture
def served_adapters_restored(local_model_server):
    """The local model's server serves what it served before the test (the test's adapter dropped)."""
    before = local_model.served_adapters(settings.VAR_DIR)
    yield
    if local_model.served_adapters(settings.VAR_DIR) != before:
        (local_model.model_dir(settings.VAR_DIR) / "adapters.json").write_text(json.dumps(before))
        local_model.stop(settings.VAR_DIR)
        local_model.start(settings.VAR_DIR, port=settings.LOCAL_MODEL_PORT)


def test_grpo_on_the_local_model_and_its_promotion_into_llama_cpp(
    replay_pool, local_pool, served_adapters_restored
):
    dataset = dataset_of_two_items(f"local-lora-{uuid.uuid4().hex[:8]}")  # var/ outlives the test database

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
        assert "samples drawn under the workflow's JSON schema" in job.log
        (point,) = TrainingMetric.objects.filter(job=job)
        assert "reward" in point.values and "loss" in point.values
        candidate = job.candidate
        assert candidate.backend == ConductorVersion.Backend.LLM
        assert (candidate.config["serving"], candidate.config["model"]) == (
            "llama.cpp",
            "openai/smollm2-grpo-test",
        )
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
        shutil.rmtree(dataset_files(dataset)["manifest.json"].parent.parent, ignore_errors=True)
