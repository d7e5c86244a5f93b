"""From rollouts to a dataset to a job: the rollout form's defaults give groups that teach, and a job
trained on a dataset learns every kind the dataset holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.services import Actor
from routing import engine, replay
from routing.models import ConductorVersion
from routing.services import conductor_active
from training.forms import RolloutsForm
from training.kinds import MIN_KIND_ITEMS
from training.models import JobStatus, Rollout
from training.policy import GRPOConfig, Policy, default_actions, train
from training.services import dataset_build, job_start, replay_item_ids, rollouts_start
from training.tasks import train_job

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")


def run_batch(batch) -> None:
    for rollout in Rollout.objects.filter(batch=batch):
        engine.execute_run(rollout.run_id)


def test_a_job_on_a_dataset_learns_every_kind_the_dataset_holds(replay_pool, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    # Many items of one kind, few of two others (as a small rollout batch has them).
    counts = {"gsm8k": MIN_KIND_ITEMS + 2, "cruxeval-o": 5, "math-l5": 2}
    items = [i for kind, n in counts.items() for i in replay_item_ids("train", n, domain=kind)]
    batch = rollouts_start(version=conductor_active(), items=items, k=2, temperature=1.0, actor=ACTOR)
    run_batch(batch)
    dataset = dataset_build(name="three-kinds", batch_ids=[batch.pk], validation_fraction=0.0, actor=ACTOR)
    assert dataset.counts["train"] == len(items)

    job = job_start(
        name="on-three-kinds",
        backend="learned",
        dataset=dataset,
        options={"epochs": 3, "frontier": False, "folds": 2},
        actor=ACTOR,
        queue=False,
    )
    train_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    assert "kinds: gsm8k (numeric), cruxeval-o (literal), math-l5 (math)" in job.log, job.log
    saved = json.loads(Path(job.candidate.config["policy_path"]).read_text())
    assert [kind for kind, _ in saved["kinds"]] == ["gsm8k", "cruxeval-o", "math-l5"]
    assert job.candidate.config["kinds"] == ["gsm8k", "cruxeval-o", "math-l5"]
    # Too few items to trust the learned choice on: those kinds plan their own best fixed workflow.
    assert {"cruxeval-o", "math-l5"} <= set(saved["fallback"])
    policy = Policy.from_json(Path(job.candidate.config["policy_path"]).read_text())
    math_item = replay.find_item(item_id=items[-1], texts=[])
    assert policy.kind("math-l5") == "math-l5"
    assert policy.ranked(math_item.task, "math-l5")[0][0] == policy.fallback["math-l5"]


def test_rollouts_with_the_forms_defaults_give_groups_that_teach(replay_pool, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    # The learned conductor as a training job leaves it: GRPO at the job's defaults on the train split.
    train_items = replay.read_items(replay.split_path("train"))
    policy = Policy.for_items(default_actions(sorted(train_items[0].outcomes)), train_items)
    train(policy, train_items, GRPOConfig())
    path = tmp_path / "policy.json"
    path.write_text(policy.to_json())
    version = ConductorVersion.objects.create(
        name="trained", backend="learned", config={"policy_path": str(path)}
    )

    fields = RolloutsForm().fields
    limit, k, temperature = (fields[name].initial for name in ("limit", "k", "temperature"))
    items = replay_item_ids(fields["split"].initial, limit=limit)
    batch = rollouts_start(version=version, items=items, k=k, temperature=temperature, actor=ACTOR)
    run_batch(batch)
    dataset = dataset_build(name="defaults", batch_ids=[batch.pk], validation_fraction=0.0, actor=ACTOR)
    assert dataset.counts["groups"] == limit
    assert dataset.counts["groups_with_signal"] >= 1, dataset.counts
