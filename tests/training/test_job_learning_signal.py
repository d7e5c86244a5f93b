"""A training job that could learn nothing: a LoRA job on a dataset with no learning signal is refused at
its start (unless asked for explicitly), as is one whose dataset has fewer prompts than one step takes;
and a job whose trainer took no optimizer step fails and registers no candidate."""

from __future__ import annotations

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from audit.services import Actor
from routing.models import ConductorVersion
from routing.services import conductor_active
from tests.training.test_datasets import ITEM, RIGHT, execute_with_plans, plan
from tests.training.test_lora_job import dataset_of_two_items
from training.models import Dataset, JobStatus, TrainingJob
from training.services import TrainingError, dataset_build, job_start, rollouts_start
from training.tasks import train_job
from training.tiny_model import make_tiny_model

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
JOBS = "/api/training/jobs/"
# One prompt a step (the flat dataset has one group); two generations: the least a GRPO group takes.
SMALL = {"max_steps": 2, "num_generations": 2, "prompts_per_step": 1, "max_completion_length": 24}


@pytest.fixture
def tiny_model(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return make_tiny_model(tmp_path / "models" / "tiny-qwen2")


def flat_dataset() -> Dataset:
    """One group of three samples that all earned the same reward: every advantage is 0."""
    batch = rollouts_start(version=conductor_active(), items=[ITEM], k=3, temperature=1.0, actor=ACTOR)
    execute_with_plans(batch, [plan(RIGHT)] * 3)
    dataset = dataset_build(
        name="flat", batch_ids=[batch.pk], min_group_size=3, validation_fraction=0.0, actor=ACTOR
    )
    assert dataset.teaches_nothing
    return dataset


def started_events() -> list[dict]:
    return list(AuditEvent.objects.filter(action="training.job_started").values_list("payload", flat=True))


def test_a_lora_job_on_a_dataset_without_signal_is_refused_unless_asked_for(replay_pool, tiny_model):
    dataset = flat_dataset()
    with pytest.raises(TrainingError) as refused:
        job_start(name="flat-lora", backend="llm-lora", dataset=dataset, options=SMALL, actor=ACTOR)
    reason = str(refused.value)
    assert "flat v1" in reason and "0 of 1 groups carry a learning signal" in reason, reason
    assert "allow_no_signal" in reason  # how to train on it anyway
    assert not TrainingJob.objects.exists() and started_events() == []

    job = job_start(
        name="flat-lora",
        backend="llm-lora",
        dataset=dataset,
        options={**SMALL, "allow_no_signal": True},
        actor=ACTOR,
        queue=False,
    )
    assert job.options["allow_no_signal"] is True
    [payload] = started_events()
    assert payload["options"]["allow_no_signal"] is True  # the override is in the audit record
    with pytest.raises(TrainingError, match="allow_no_signal must be true or false"):
        job_start(
            name="flat-lora-2",
            backend="llm-lora",
            dataset=dataset,
            options={**SMALL, "allow_no_signal": "perhaps"},
            actor=ACTOR,
        )


def test_the_api_and_the_form_refuse_it_with_the_reason_and_take_the_override(
    replay_pool, tiny_model, api, page
):
    dataset = flat_dataset()
    body = {"name": "flat-api", "backend": "llm-lora", "dataset": dataset.pk, "options": SMALL}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 400, response.data
    assert "0 of 1 groups carry a learning signal" in str(response.data)
    body["options"] = {**SMALL, "allow_no_signal": True}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 201, response.data
    assert response.data["options"]["allow_no_signal"] is True

    form = {
        "job-name": "flat-form",
        "job-backend": "llm-lora",
        "job-dataset": str(dataset.pk),
        "job-base_model_path": str(tiny_model),
        **{f"job-{k}": str(v) for k, v in SMALL.items()},
        "job-lora_learning_rate": "0.0001",
        "job-lora_r": "8",
    }
    home = page.get(reverse("training:home")).content.decode()
    assert 'name="job-allow_no_signal"' in home
    response = page.post(reverse("training:job-start"), form)
    assert response.status_code == 200
    refused = " ".join(response.context["job_form"].non_field_errors())
    assert "has no learning signal: 0 of 1 groups carry a learning signal" in refused, refused
    assert not TrainingJob.objects.filter(name="flat-form").exists()
    response = page.post(reverse("training:job-start"), {**form, "job-allow_no_signal": "on"})
    assert response.status_code == 302, response.context["job_form"].errors
    assert TrainingJob.objects.get(name="flat-form").options["allow_no_signal"] is True


def test_a_lora_job_on_fewer_prompts_than_a_step_takes_is_refused(replay_pool, tiny_model):
    dataset = dataset_of_two_items("two")
    assert dataset.counts["train"] == 2 and not dataset.teaches_nothing, dataset.counts
    options = {**SMALL, "prompts_per_step": 4}
    with pytest.raises(TrainingError) as refused:
        job_start(name="too-few", backend="llm-lora", dataset=dataset, options=options, actor=ACTOR)
    reason = str(refused.value)
    assert "2 training prompts" in reason and "prompts_per_step" in reason and "4" in reason, reason
    assert not TrainingJob.objects.exists()
    job = job_start(
        name="enough", backend="llm-lora", dataset=dataset, options=SMALL, actor=ACTOR, queue=False
    )
    assert job.options["allow_no_signal"] is False  # it had signal: no override


def test_a_job_whose_trainer_took_no_step_fails_and_registers_nothing(replay_pool, tiny_model, page):
    dataset = dataset_of_two_items("two")
    job = job_start(
        name="no-step", backend="llm-lora", dataset=dataset, options=SMALL, actor=ACTOR, queue=False
    )
    # A job queued before its start checked the prompts a step takes (or on a dataset built before they
    # were counted): TRL finds no batch of 4 prompts in 2 and stops at step 0.
    TrainingJob.objects.filter(pk=job.pk).update(options={**job.options, "prompts_per_step": 4})

    train_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED, job.log
    assert "0 optimizer steps" in job.error and "nothing was registered" in job.error, job.error
    assert job.candidate_id is None and not ConductorVersion.objects.filter(name="no-step").exists()
    actions = list(
        AuditEvent.objects.filter(object_type="trainingjob", object_id=str(job.pk)).values_list(
            "action", flat=True
        )
    )
    assert "training.job_failed" in actions and "training.job_succeeded" not in actions
    assert not AuditEvent.objects.filter(action="conductorversion.registered").exists()
    assert job.artifact_path == ""  # the untrained adapter is not kept as if it were one

    html = page.get(reverse("training:job", args=[job.pk])).content.decode()
    assert "failed" in html and "0 optimizer steps" in html and "Candidate: no-step" not in html
