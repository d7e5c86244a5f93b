"""Review: reviewers mark runs and steps correct or wrong (audited), the queue lists what waits for a
verdict, and a training dataset may take the verdicts as rewards in place of the scorers'."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from audit.models import AuditEvent
from audit.services import Actor
from review.annotations import services as review
from routing.models import Annotation, Run, RunStatus, Step
from routing.services import conductor_active
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json
from tests.training.test_datasets import ITEM, RIGHT, WRONG, execute_with_plans, plan
from training.models import Dataset
from training.rewards import RewardConfig
from training.services import dataset_build, dataset_files, rollouts_start

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "<script>alert(1)</script> \u202eexe.txt"


@pytest.fixture
def two_runs(live_pool):
    """Two ended runs of the engine: one succeeded with two steps, one failed."""
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Draft", []), ("beta", "Check", "all")))])
    server.program("alpha", [Reply("draft: 42")])
    server.program("beta", [Reply("42")])
    good = run_now(submit("What is 6 * 7?"))
    server.program("conductor", [Reply("not a plan"), Reply("still not a plan")])
    bad = run_now(submit("What is 7 * 8?"))
    assert good.status == RunStatus.SUCCEEDED and bad.status == RunStatus.FAILED
    return good, bad


def session(make_user, name: str, *roles: str) -> Client:
    client = Client()
    client.force_login(make_user(name, *roles))
    return client


def test_a_reviewer_marks_a_run_and_a_step_from_the_task_page_and_each_verdict_is_audited(
    two_runs, make_user
):
    good, _ = two_runs
    reviewer = session(make_user, "ann", Role.AUDITOR)
    step = Step.objects.filter(run=good).order_by("index").first()

    page = reviewer.get(f"/tasks/{good.task_id}/").content.decode()
    assert f'action="/runs/{good.pk}/annotations/"' in page and "No verdict yet." in page
    on_step = reviewer.post(
        f"/runs/{good.pk}/annotations/", {"verdict": "wrong", "step": step.pk, "label": "arithmetic"}
    )
    on_run = reviewer.post(
        f"/runs/{good.pk}/annotations/", {"verdict": "correct", "label": "ok", "comment": HOSTILE}
    )

    assert on_run.status_code == 302 and on_run["Location"] == f"/tasks/{good.task_id}/#run-{good.pk}"
    assert on_step.status_code == 302
    notes = list(Annotation.objects.filter(run=good).order_by("id"))
    assert [(a.verdict, a.step_id, a.label, a.author_name) for a in notes] == [
        ("wrong", step.pk, "arithmetic", "ann"),
        ("correct", None, "ok", "ann"),
    ]
    events = list(AuditEvent.objects.filter(action="annotation.added").order_by("id"))
    assert [e.object_id for e in events] == [str(a.pk) for a in notes]
    assert events[1].task_id == good.task_id and events[1].actor_name == "ann"
    assert events[1].payload == {
        "run_id": good.pk,
        "step_id": None,
        "verdict": "correct",
        "label": "ok",
        "comment_sha256": hashlib.sha256(HOSTILE.encode()).hexdigest(),
    }
    page = reviewer.get(f"/tasks/{good.task_id}/").content.decode()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\u27e8U+202E\u27e9" in page  # the override is shown, not obeyed
    assert "the run&#x27;s label" in page or "the run's label" in page


def test_verdicts_that_cannot_be_recorded_are_refused_with_the_reason_and_store_nothing(
    two_runs, make_user, live_pool
):
    good, bad = two_runs
    reviewer = session(make_user, "ann", Role.ML_STAFF)
    other_step = Step.objects.filter(run=good).first()
    Run.objects.filter(pk=bad.pk).update(status=RunStatus.RUNNING)

    cases = [
        (good.pk, {"verdict": "maybe"}, "a verdict is correct or wrong"),
        (bad.pk, {"verdict": "wrong"}, "has not ended"),
        (good.pk, {"verdict": "wrong", "label": "x" * 61}, "at most 60 characters"),
        (good.pk, {"verdict": "wrong", "step": "999999"}, "has no step 999999"),
    ]
    for run_id, form, reason in cases:
        response = reviewer.post(f"/runs/{run_id}/annotations/", form, follow=True)
        assert reason in response.content.decode(), reason
    Run.objects.filter(pk=bad.pk).update(status=RunStatus.FAILED)
    on_other_run = reviewer.post(
        f"/runs/{bad.pk}/annotations/", {"verdict": "wrong", "step": other_step.pk}, follow=True
    )
    assert f"has no step {other_step.pk}" in on_other_run.content.decode()
    assert (
        not Annotation.objects.exists() and not AuditEvent.objects.filter(action="annotation.added").exists()
    )
    # An operator may not review; nor a user without a role.
    assert (
        session(make_user, "olga", Role.OPERATOR)
        .post(f"/runs/{good.pk}/annotations/", {"verdict": "wrong"})
        .status_code
        == 403
    )
    assert not Annotation.objects.exists()


def test_the_queue_lists_runs_waiting_for_a_verdict_and_filters_them(two_runs, make_user):
    good, bad = two_runs
    reviewer = session(make_user, "ann", Role.AUDITOR)

    def listed(**query) -> str:
        response = reviewer.get("/review/", query)
        assert response.status_code == 200
        return response.content.decode()

    waiting = listed()
    assert f"#run-{good.pk}" in waiting and f"#run-{bad.pk}" in waiting
    reviewer.post(f"/runs/{good.pk}/annotations/", {"verdict": "wrong"})
    assert f"#run-{good.pk}" not in listed() and f"#run-{bad.pk}" in listed()
    reviewed = listed(state="reviewed")
    assert f"#run-{good.pk}" in reviewed and f"#run-{bad.pk}" not in reviewed
    assert "verdict-wrong" in reviewed
    assert f"#run-{good.pk}" in listed(state="all", verdict="wrong")
    assert f"#run-{good.pk}" in listed(verdict="wrong")  # a verdict asked for: the reviewed runs
    assert f"#run-{good.pk}" not in listed(state="all", verdict="correct")
    assert f"#run-{good.pk}" in listed(state="all", worker="beta")
    assert f"#run-{bad.pk}" not in listed(state="all", worker="beta")
    assert f"#run-{good.pk}" not in listed(state="all", kind="retry")
    assert reviewer.get("/review/", {"score": "lots"}).status_code == 400
    assert session(make_user, "olga", Role.OPERATOR).get("/review/").status_code == 403


def test_the_api_records_verdicts_for_reviewers_tokens_and_lists_them_for_every_role(two_runs, make_user):
    good, _ = two_runs

    def api(name: str, role: str) -> APIClient:
        client = APIClient()
        client.credentials(
            HTTP_AUTHORIZATION=f"Token {token_create(user=make_user(name, role), role=role).key}"
        )
        return client

    ml, operator = api("mira", Role.ML_STAFF), api("olga", Role.OPERATOR)
    made = ml.post(
        "/api/annotations/", {"run": good.pk, "verdict": "correct", "label": "checked"}, format="json"
    )
    refused = operator.post("/api/annotations/", {"run": good.pk, "verdict": "wrong"}, format="json")
    unknown = ml.post("/api/annotations/", {"run": 999999, "verdict": "wrong"}, format="json")

    assert made.status_code == 201, made.json()
    assert made.json()["task_id"] == str(good.task_id) and made.json()["author_name"] == "mira"
    assert refused.status_code == 403 and unknown.status_code == 404
    assert unknown.json() == {"detail": "there is no run 999999"}
    listed = operator.get("/api/annotations/", {"run": good.pk}).json()["results"]
    assert [(a["verdict"], a["label"]) for a in listed] == [("correct", "checked")]


def test_a_dataset_with_human_labels_rewards_a_reviewers_verdict_over_the_scorers(
    replay_pool, settings, tmp_path, make_user
):
    settings.VAR_DIR = tmp_path
    actor = Actor.service("test")
    batch = rollouts_start(version=conductor_active(), items=[ITEM], k=2, temperature=1.0, actor=actor)
    right, wrong = execute_with_plans(batch, [plan(RIGHT), plan(WRONG)])
    assert (right.score, wrong.score) == (1.0, 0.0)
    # A reviewer finds the scorer's "right" answer wrong, and the "wrong" one right.
    reviewer = make_user("mira", Role.ML_STAFF)
    review.annotation_add(verdict=review.Verdict(run_id=right.pk, verdict="wrong"), user=reviewer)
    review.annotation_add(verdict=review.Verdict(run_id=wrong.pk, verdict="correct"), user=reviewer)

    def rewards(config: RewardConfig, name: str) -> tuple[list[float], Dataset]:
        dataset = dataset_build(
            name=name, batch_ids=[batch.pk], reward_config=config, validation_fraction=0.0, actor=actor
        )
        return json.loads(dataset_files(dataset)["train.jsonl"].read_text())["rewards"], dataset

    by_scorer, _ = rewards(RewardConfig(), "scored")
    by_review, labelled = rewards(RewardConfig(human_labels=True), "reviewed")

    assert by_scorer == [1.0, 0.0]
    assert by_review == [0.0, 1.0]
    assert labelled.counts["human_labels"] == 2 and labelled.reward_config["human_labels"] is True
