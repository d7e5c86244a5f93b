"""Training under concurrency and bad input: nothing lost, nothing half-written, a reason for each refusal."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, Run, Task
from routing.scoring.scorers import regex
from routing.services import SubmissionError, TaskSubmission, conductor_active, task_submit
from training.models import Dataset, Rollout, TrainingJob
from training.rewards import RewardConfig
from training.services import (
    TrainingError,
    conductor_promote,
    conductor_rollback,
    dataset_build,
    dataset_files,
    job_options,
    replay_item_ids,
    rollouts_start,
)

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
ITEM = "cruxeval-o:crux-test-#1"


def finished_batch(workers: list[str]):
    batch = rollouts_start(
        version=conductor_active(), items=[ITEM], k=len(workers), temperature=1.0, actor=ACTOR
    )
    task = Task.objects.get(source_item=ITEM, source=Task.Source.TRAINING)
    runs = [r.run for r in Rollout.objects.filter(batch=batch).select_related("run").order_by("sample")]
    for run, worker in zip(runs, workers, strict=True):
        plan = {"thought": "t", "steps": [{"worker": worker, "instruction": task.text, "access": []}]}
        Run.objects.filter(pk=run.pk).update(plan_override=json.dumps(plan))
        engine.execute_run(run.pk)
    return batch, [Run.objects.get(pk=r.pk) for r in runs]


def test_two_builds_of_one_name_at_once_make_two_versions_with_their_files(replay_pool, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    batch, _ = finished_batch(["gpt-4o-2024-08-06", "gemma-2-9b-it"])
    results: list[object] = []

    def build() -> None:
        try:
            results.append(dataset_build(name="same", batch_ids=[batch.pk], actor=ACTOR))
        except Exception as exc:  # the test reports it below
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(r, Dataset) for r in results), results
    assert sorted(d.version for d in Dataset.objects.filter(name="same")) == [1, 2]
    for dataset in Dataset.objects.all():
        files = dataset_files(dataset)
        assert (
            len(files) == 5 and json.loads(files["manifest.json"].read_text())["version"] == dataset.version
        )


def test_ungraded_samples_are_left_out_of_a_group_not_rewarded_as_wrong(replay_pool, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    batch, runs = finished_batch(["gpt-4o-2024-08-06", "gemma-2-9b-it", "gpt-3.5-turbo-0125"])
    Run.objects.filter(pk=runs[2].pk).update(score=None)  # e.g. the judge was down for this one
    dataset = dataset_build(
        name="graded", batch_ids=[batch.pk], reward_config=RewardConfig(format_term=True), actor=ACTOR
    )
    assert dataset.counts["completions"] == 2 and dataset.counts["ungraded_samples"] == 1
    assert runs[2].pk not in dataset.source_run_ids
    # Without a reference (none, or empty) there was nothing to grade against: the sample stays in.
    for reference in (None, ""):
        Task.objects.filter(pk=runs[2].task_id).update(reference=reference)
        again = dataset_build(name="graded", batch_ids=[batch.pk], actor=ACTOR)
        assert again.counts["completions"] == 3 and again.counts["ungraded_samples"] == 0


def test_training_idempotency_keys_are_reserved(db):
    with pytest.raises(SubmissionError, match="reserved for training items"):
        task_submit(
            submission=TaskSubmission(text="x", idempotency_key=f"training:{ITEM}"), source=Task.Source.API
        )


def test_a_hostile_regex_reference_scores_nothing_within_its_time_limit():
    started = time.monotonic()
    assert regex("a" * 5000 + "!", r"(a|aa)+$") == 0.0
    assert time.monotonic() - started < 5


def test_odd_settings_are_refused_with_a_reason(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    dataset = Dataset(name="d", version=1)
    checked = job_options("llm-lora", {"base_model_path": str(tmp_path), "format_term": "false"}, dataset)
    assert checked["format_term"] is False  # the text "false" is false
    with pytest.raises(TrainingError, match="true or false"):
        job_options("llm-lora", {"base_model_path": str(tmp_path), "use_vllm": "perhaps"}, dataset)
    with pytest.raises(TrainingError, match="not a usable model path"):
        job_options("llm-lora", {"base_model_path": "x" * 300}, dataset)
    with pytest.raises(TrainingError, match="not a split name"):
        replay_item_ids("../../etc/secrets")


def test_rollback_to_an_llm_conductor_loads_its_adapter_again(db, openai_server, tmp_path):
    adapter_version = ConductorVersion.objects.create(
        name="llm-a",
        backend="llm",
        config={"model": "hosted_vllm/llm-a", "api_base": openai_server.base_url, "lora_path": str(tmp_path)},
    )
    conductor_promote(version=adapter_version, actor=ACTOR)
    conductor_promote(version=ConductorVersion.objects.create(name="static-b", backend="static"), actor=ACTOR)
    openai_server.loaded_adapters.clear()  # vLLM restarted: its runtime adapters are gone
    openai_server.lora_status = 500
    with pytest.raises(TrainingError, match="vLLM refused"):
        conductor_rollback(actor=ACTOR)
    assert conductor_active().name == "static-b"
    openai_server.lora_status = 200
    assert conductor_rollback(actor=ACTOR) == adapter_version
    assert openai_server.loaded_adapters == {"llm-a": str(tmp_path)}
    assert AuditEvent.objects.filter(
        action="conductor.promotion_failed", object_id=str(adapter_version.pk)
    ).exists()


def test_a_job_name_is_unique_in_the_database(db):
    TrainingJob.objects.create(name="once", backend="learned")
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        TrainingJob.objects.create(name="once", backend="learned")
