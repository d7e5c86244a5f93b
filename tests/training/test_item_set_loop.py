"""The whole loop on a team's own items, none of them replay items: upload a file, survey the live
workers (the local model and a loopback OpenAI-protocol server), build a dataset, train the learned
policy on it, evaluate it against the static rules on the set's dev split, promote it."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from pathlib import Path

import pytest

from audit.models import AuditEvent
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, Run
from routing.services import conductor_active
from tests.openai_server import Reply
from training.itemsets.rows import read_file
from training.itemsets.selectors import split_ids
from training.itemsets.services import items_upload
from training.models import Evaluation, ItemSetVersion, JobStatus, Rollout
from training.services import (
    conductor_promote,
    dataset_build,
    evaluation_comparison,
    evaluation_start,
    job_start,
)
from training.services.rollouts import rollouts_start
from training.tasks import train_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ACTOR = Actor.service("test")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "unit-conversions.jsonl"


def _answers(references: dict[str, str]):
    """alpha is right and dear, beta right and cheap, gamma wrong (and the dearest)."""

    def reply(model: str):
        def program(body):
            text = next(m["content"] for m in body["messages"] if m["role"] == "user")
            right = next((ref for question, ref in references.items() if question in text), "0")
            return Reply(content=right if model != "gamma" else f"{right}1", completion_tokens=3)

        return program

    return reply


def run_all(runs) -> None:
    for run_id in runs:
        engine.execute_run(run_id)


def test_a_team_trains_evaluates_and_promotes_on_its_own_uploaded_items(
    live_pool, local_pool, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    server = live_pool["server"]
    ConductorVersion.objects.update(is_active=False)
    static = conductor_active()  # the static rules are the baseline
    content = EXAMPLE.read_bytes()
    rows = read_file(content, EXAMPLE.name)
    references = {row.text: row.reference for row in rows}
    for slug in ("alpha", "beta", "gamma"):
        server.programs[slug] = _answers(references)(slug)

    version, added = items_upload(
        name="unit-conversions",
        rows=rows,
        filename=EXAMPLE.name,
        content_sha256=hashlib.sha256(content).hexdigest(),
        actor=ACTOR,
    )
    assert added == 30
    splits = {s: version.items.filter(split=s).count() for s in ("train", "dev", "test")}
    assert splits == {"train": 18, "dev": 6, "test": 6}

    train = split_ids("unit-conversions", "train")
    batch = rollouts_start(
        version=static,
        items=train,
        k=1,
        temperature=1.0,
        actor=ACTOR,
        item_set="unit-conversions",
        survey=True,
    )
    version.refresh_from_db()
    assert version.frozen and len(version.content_hash) == 64  # frozen on first use
    workers = {"alpha", "beta", "gamma", local_pool["worker"].slug}
    assert batch.k == len(workers)
    run_all(Rollout.objects.filter(batch=batch).values_list("run_id", flat=True))
    answered = {
        json.loads(r.plan_override)["steps"][0]["worker"] for r in Run.objects.filter(rollout__batch=batch)
    }
    assert answered == workers
    assert Run.objects.filter(rollout__batch=batch, status="succeeded").count() == len(train) * len(workers)
    assert all(not item.startswith("cruxeval") for item in batch.items)

    dataset = dataset_build(name="uc-survey", batch_ids=[batch.pk], validation_fraction=0.0, actor=ACTOR)
    assert dataset.counts["train"] == len(train)
    assert dataset.counts["groups_with_signal"] == len(train)  # gamma is wrong where the others are right

    job = job_start(
        name="uc-learned",
        backend="learned",
        dataset=dataset,
        options={"epochs": 20, "frontier": False, "folds": 2},
        actor=ACTOR,
        queue=False,
    )
    train_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    assert "kinds: unit-conversion (numeric)" in job.log, job.log
    candidate = job.candidate

    evaluation = evaluation_start(
        candidate=candidate, baseline=static, split="dev", limit=6, actor=ACTOR, item_set="unit-conversions"
    )
    assert evaluation.item_set_version_id == version.pk
    run_all(evaluation.runs.values_list("run_id", flat=True))
    evaluation = Evaluation.objects.get(pk=evaluation.pk)
    assert evaluation.status == JobStatus.SUCCEEDED
    comparison = evaluation_comparison(evaluation)
    assert len(comparison.pairs) == 6
    assert comparison.accuracy.low is not None and comparison.accuracy.high is not None  # with intervals
    assert comparison.accuracy.candidate == 1.0, comparison.evidence()  # it learned to ask alpha or beta
    conductor_promote(version=candidate, actor=ACTOR, evaluation=evaluation)
    candidate.refresh_from_db()
    assert candidate.is_active
    # The record binds what was used: the version's hash is in its freeze and the evaluation's events.
    frozen = AuditEvent.objects.get(action="itemset.frozen", object_id=str(version.pk))
    assert frozen.payload["content_hash"] == version.content_hash
    started = AuditEvent.objects.get(action="evaluation.started", object_id=str(evaluation.pk))
    assert started.payload["content_hash"] == version.content_hash
    assert ItemSetVersion.objects.filter(item_set__name="unit-conversions").count() == 1
    assert Decimal(str(comparison.usd_per_1000.candidate)) >= 0
