"""The training REST API through DRF's APIClient: the real services, the real PostgreSQL and broker."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.urls import include, path
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from accounts.models import ApiToken, Role
from audit.grants import token_create
from audit.models import AuditEvent
from routing import engine
from routing.models import ConductorVersion, Run, RunStatus, Task
from routing.services import conductor_active
from tests.conftest import clear_queues
from training.models import (
    Dataset,
    Evaluation,
    EvaluationRun,
    JobStatus,
    Rollout,
    RolloutBatch,
    TrainingJob,
    TrainingMetric,
)
from training.policy import Policy, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/training/"
JOBS = API + "jobs/"
ITEM = "cruxeval-o:crux-test-#1"  # gpt-4o answers it right, gpt-3.5-turbo wrong (recorded outcomes)
RIGHT, WRONG = "gpt-4o-2024-08-06", "gpt-3.5-turbo-0125"
WHO = ["anonymous", "no role", "auditor", "operator", "ml_staff", "admin"]
READERS = {"auditor", "ml_staff", "admin"}
WRITERS = {"ml_staff", "admin"}


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _empty_queues() -> Iterator[None]:
    """Runs and jobs are queued on commit to the real broker; no worker takes them here."""
    clear_queues()
    yield
    clear_queues()


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path


def token_client(token: ApiToken) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def client_as(who: str, make_user) -> APIClient:
    if who == "anonymous":
        return APIClient()
    if who == "admin":
        root = get_user_model().objects.create_superuser("root", password="y" * 12)
        return token_client(token_create(user=root, role=Role.ADMIN))
    if who == "no role":
        client = APIClient()
        client.force_login(make_user("nobody"))  # such a user cannot be given a token
        return client
    return token_client(token_create(user=make_user(who.replace("_", "-"), who), role=who))


@pytest.fixture
def ml(make_user) -> APIClient:
    return token_client(token_create(user=make_user("mira", Role.ML_STAFF), role=Role.ML_STAFF))


def learned_version(tmp_path, name: str, worker: str) -> ConductorVersion:
    path = tmp_path / f"{name}.json"
    path.write_text(Policy.new([Workflow("single", (worker,))]).to_json())
    return ConductorVersion.objects.create(name=name, backend="learned", config={"policy_path": str(path)})


def queued_job(name: str = "learned-a", **fields) -> TrainingJob:
    job = TrainingJob.objects.create(
        name=name, backend=TrainingJob.Backend.LEARNED, options={"split": "train", "epochs": 4}, **fields
    )
    for step in range(1, 4):
        TrainingMetric.objects.create(job=job, step=step, values={"reward": 0.1 * step})
    return job


# --- roles ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", WHO)
def test_role_matrix(who, make_user):
    conductor_active()
    job = queued_job()
    client = client_as(who, make_user)
    reads = [
        API,
        JOBS,
        f"{JOBS}{job.pk}/",
        f"{JOBS}{job.pk}/metrics/",
        API + "datasets/",
        API + "conductors/",
    ]

    for url in reads:
        response = client.get(url)
        if who in READERS:
            assert response.status_code == 200, (who, url, response.status_code)
        else:
            assert response.status_code in ((401, 403) if who == "anonymous" else (403,)), (who, url)

    cancel = client.post(f"{JOBS}{job.pk}/cancel/")
    rollback = client.post(API + "conductors/rollback/")
    job.refresh_from_db()
    if who in WRITERS:
        assert cancel.status_code == 200, cancel.data
        assert job.status == JobStatus.CANCELLED and job.cancel_requested
        assert rollback.status_code == 400  # allowed, but the static baseline has nothing to roll back to
        assert rollback.data["detail"] == "no earlier conductor to roll back to from static-v1"
    else:
        refused = (401, 403) if who == "anonymous" else (403,)
        assert cancel.status_code in refused and rollback.status_code in refused
        assert job.status == JobStatus.QUEUED and not job.cancel_requested
        assert not AuditEvent.objects.filter(action="training.job_cancel_requested").exists()


def test_an_auditor_token_of_an_ml_staff_member_may_only_read(make_user):
    both = make_user("bo", Role.ML_STAFF, Role.AUDITOR)
    as_auditor = token_client(token_create(user=both, role=Role.AUDITOR))
    body = {"name": "learned-api", "backend": "learned", "options": {"limit": 10}}

    assert as_auditor.get(JOBS).status_code == 200
    refused = as_auditor.post(JOBS, body, format="json")
    assert refused.status_code == 403 and refused.data["detail"] == "your role does not allow this"
    assert not TrainingJob.objects.exists()
    as_ml = token_client(token_create(user=both, role=Role.ML_STAFF))
    assert as_ml.post(JOBS, body, format="json").status_code == 201


def test_unknown_ids_are_404(ml):
    for url in (
        f"{JOBS}999999/",
        f"{JOBS}999999/metrics/",
        f"{JOBS}not-a-number/",
        API + "datasets/999999/",
        API + "rollouts/999999/",
        API + "evaluations/999999/",
        API + "conductors/no-such-version/",
    ):
        assert ml.get(url).status_code == 404, url
    assert ml.post(f"{JOBS}999999/cancel/").status_code == 404
    assert ml.post(API + "conductors/no-such-version/promote/").status_code == 404
    assert ml.post(API + "conductors/no-such-version/shadow/", {"on": True}, format="json").status_code == 404


# --- jobs -----------------------------------------------------------------------------------------


def test_ml_staff_start_a_learned_job_with_the_defaults_filled_in(ml, settings):
    from conductor_web.celery import app

    response = ml.post(
        JOBS,
        {"name": "learned-api", "backend": "learned", "options": {"limit": 10, "epochs": 2}},
        format="json",
    )

    assert response.status_code == 201, response.data
    job = TrainingJob.objects.get(pk=response.data["id"])
    assert (job.name, job.backend, job.dataset, job.status) == (
        "learned-api",
        "learned",
        None,
        JobStatus.QUEUED,
    )
    assert job.options == {
        "item_set": "replay",
        "item_set_version": None,
        "split": "train",
        "limit": 10,
        "epochs": 2,
        "learning_rate": 3.0,
        "group_size": 16,
        "cost_penalty_per_usd": 20.0,
        "folds": 3,
        "frontier": True,
    }
    assert job.created_by.username == "mira"
    assert response.data["options"] == job.options and response.data["progress"] == 0.0
    assert response.data["candidate"] is None and response.data["artifact_path"] == ""
    event = AuditEvent.objects.get(action="training.job_started", object_id=str(job.pk))
    assert (event.actor_type, event.actor_name) == ("user", "mira")
    # queued on commit on the training queue, for a training worker
    with app.connection_for_write() as conn:
        waiting = conn.default_channel.client.lrange(settings.CONDUCTOR_QUEUE_PREFIX + "training", 0, -1)
    assert [json.loads(m)["headers"]["task"] for m in waiting] == ["training.tasks.train_job"]

    listed = ml.get(JOBS, {"status": "queued", "backend": "learned"})
    assert [j["name"] for j in listed.data["results"]] == ["learned-api"]
    assert ml.get(JOBS, {"status": "running"}).data["results"] == []
    assert ml.get(JOBS, {"status": "nonsense"}).status_code == 400
    detail = ml.get(f"{JOBS}{job.pk}/").data
    assert detail["status"] == "queued" and detail["options"]["group_size"] == 16


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"options": {"epochs": 0}}, "epochs must be between 1 and 500"),
        ({"options": {"epochs": "many"}}, "epochs must be a number"),
        ({"options": {"momentum": 0.9}}, "unknown settings for the learned backend: ['momentum']"),
        ({"options": {"split": "nope"}}, "no split 'nope'"),
        ({"name": "not a slug!"}, "name: A name is 1 to 80 ASCII characters"),
        ({"name": "static-v1"}, "the name 'static-v1' is taken; choose another"),
        ({"backend": "llm-lora"}, "the llm-lora backend trains on a dataset: choose one"),
    ],
)
def test_a_job_the_service_refuses_is_a_400_with_its_message(ml, body, message):
    conductor_active()
    response = ml.post(JOBS, {"name": "learned-api", "backend": "learned", **body}, format="json")

    assert response.status_code == 400
    assert message in response.data["detail"]
    assert not TrainingJob.objects.exists()
    assert not AuditEvent.objects.filter(action="training.job_started").exists()


def test_a_malformed_job_request_is_a_400_from_the_serializer(ml):
    for body in (
        {"backend": "learned"},
        {"name": "x", "backend": "sklearn"},
        {"name": "x", "backend": "learned", "dataset": 999999},
        {"name": "x", "backend": "learned", "options": [1, 2]},
    ):
        assert ml.post(JOBS, body, format="json").status_code == 400, body
    assert not TrainingJob.objects.exists()


def test_metrics_after_a_step_and_cancel(ml):
    job = queued_job(status=JobStatus.RUNNING, step=3, total_steps=4)

    everything = ml.get(f"{JOBS}{job.pk}/metrics/")
    later = ml.get(f"{JOBS}{job.pk}/metrics/", {"after": 1})

    assert [p["step"] for p in everything.data["points"]] == [1, 2, 3]
    assert later.status_code == 200
    assert [p["step"] for p in later.data["points"]] == [2, 3]
    assert later.data["points"][0]["values"] == {"reward": 0.2}
    assert (later.data["after"], later.data["step"], later.data["total_steps"], later.data["more"]) == (
        1,
        3,
        4,
        False,
    )
    assert ml.get(f"{JOBS}{job.pk}/metrics/", {"after": 3}).data["points"] == []
    assert ml.get(f"{JOBS}{job.pk}/metrics/", {"after": "x"}).status_code == 400
    assert ml.get(f"{JOBS}{job.pk}/").data["progress"] == 0.75

    cancelled = ml.post(f"{JOBS}{job.pk}/cancel/")
    assert cancelled.status_code == 200
    assert (
        cancelled.data["cancel_requested"] is True and cancelled.data["status"] == "running"
    )  # the worker stops it
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.CANCELLED)
    again = ml.post(f"{JOBS}{job.pk}/cancel/")
    assert again.status_code == 400 and again.data == {"detail": "the job has already cancelled"}


# --- rollouts and datasets ------------------------------------------------------------------------


def test_rollouts_from_a_split_make_k_runs_per_item(ml):
    version = conductor_active()

    response = ml.post(
        API + "rollouts/", {"version": version.name, "split": "dev", "limit": 3, "k": 2}, format="json"
    )

    assert response.status_code == 201, response.data
    batch = RolloutBatch.objects.get(pk=response.data["id"])
    assert len(batch.items) == 3 and batch.k == 2 and batch.created_by.username == "mira"
    runs = Run.objects.filter(rollout__batch=batch)
    assert runs.count() == 6 and set(runs.values_list("kind", flat=True)) == {Run.Kind.ROLLOUT}
    assert set(runs.values_list("conductor_version", flat=True)) == {version.pk}
    assert response.data["counts"] == {"runs": 6, "finished": 0, "failed": 0}
    assert response.data["conductor"] == version.name and response.data["status"] == "running"
    detail = ml.get(f"{API}rollouts/{batch.pk}/")
    assert detail.status_code == 200 and detail.data["items"] == batch.items
    assert AuditEvent.objects.get(action="rollouts.started").actor_name == "mira"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"items": ["no-such-item"]}, "unknown items"),
        ({"items": []}, "choose at least one item"),
        ({"items": [ITEM], "k": 0}, "K must be between 1 and 64"),
        ({"items": [ITEM], "temperature": 0}, "the temperature must be above 0"),
        ({"split": "nope"}, "no split 'nope'"),
        (
            {"split": "dev", "domain": "no-such-domain"},
            "no items in the dev split of replay of kind 'no-such-domain'",
        ),
    ],
)
def test_rollouts_the_service_refuses(ml, body, message):
    response = ml.post(API + "rollouts/", {"version": conductor_active().name, **body}, format="json")

    assert response.status_code == 400
    assert message in response.data["detail"]
    assert not RolloutBatch.objects.exists() and not Run.objects.exists()


def test_rollouts_need_a_known_version_and_items_or_a_split_not_both(ml):
    conductor_active()
    both = ml.post(
        API + "rollouts/", {"version": "static-v1", "items": [ITEM], "split": "dev"}, format="json"
    )
    unknown = ml.post(API + "rollouts/", {"version": "no-such-version", "items": [ITEM]}, format="json")

    assert both.status_code == 400 and "not both" in str(both.data)
    assert unknown.status_code == 400 and "version" in unknown.data["errors"]
    assert not RolloutBatch.objects.exists()


def run_with_plans(batch_id: int, workers: list[str | None]) -> None:
    """Give each sampled run of the batch a known plan (None: an unparseable one), then run it."""
    task = Task.objects.get(source_item=ITEM, source=Task.Source.TRAINING)
    rollouts = Rollout.objects.filter(batch_id=batch_id).order_by("sample")
    for rollout, worker in zip(rollouts, workers, strict=True):
        plan = (
            json.dumps(
                {
                    "thought": "t",
                    "steps": [{"worker": worker.lower(), "instruction": task.text, "access": []}],
                }
            )
            if worker
            else "not a plan at all"
        )
        Run.objects.filter(pk=rollout.run_id).update(plan_override=plan)
        engine.execute_run(rollout.run_id)


def test_a_dataset_from_finished_rollouts(ml, make_user, replay_pool, var_dir):
    version = conductor_active()
    started = ml.post(API + "rollouts/", {"version": version.name, "items": [ITEM], "k": 3}, format="json")
    assert started.status_code == 201, started.data
    batch_id = started.data["id"]
    run_with_plans(batch_id, [RIGHT, WRONG, None])
    finished = ml.get(f"{API}rollouts/{batch_id}/").data
    assert finished["counts"] == {"runs": 3, "finished": 3, "failed": 1} and finished["status"] == "succeeded"

    response = ml.post(
        API + "datasets/",
        {
            "name": "crux",
            "batch_ids": [batch_id],
            "conductor_version": version.name,
            "min_group_size": 3,
            "reward": {"format_term": True},
            "validation_fraction": 0.0,
        },
        format="json",
    )

    assert response.status_code == 201, response.data
    dataset = Dataset.objects.get(pk=response.data["id"])
    assert (dataset.name, dataset.version, dataset.created_by.username) == ("crux", 1, "mira")
    assert dataset.counts == {
        "groups": 1,
        "train": 1,
        "validation": 0,
        "completions": 3,
        "skipped_groups": 0,
        "ungraded_samples": 0,
        "groups_with_signal": 1,
        "reward_spread_mean": 1.0,
    }
    assert dataset.reward_config == {
        "correctness": 1.0,
        "cost_penalty_per_usd": 0.0,
        "format_term": True,
        "human_labels": False,
    }
    assert dataset.filter["batch_ids"] == [batch_id] and dataset.filter["conductor_version"] == version.name
    detail = ml.get(f"{API}datasets/{dataset.pk}/").data
    assert detail["content_hash"] == dataset.content_hash and detail["counts"] == dataset.counts
    assert detail["source_run_ids"] == dataset.source_run_ids and len(detail["source_run_ids"]) == 3
    files = {f["name"]: f for f in detail["files"]}
    assert set(files) == {
        "train.parquet",
        "validation.parquet",
        "train.jsonl",
        "validation.jsonl",
        "manifest.json",
    }
    url = files["train.jsonl"]["url"]
    assert url == f"http://testserver/api/training/datasets/{dataset.pk}/files/train.jsonl/"
    # a script downloads with a reader's token
    from audit.grants import token_create

    script = token_client(token_create(user=make_user("ann", Role.AUDITOR), role=Role.AUDITOR))
    download = script.get(url)
    row = json.loads(b"".join(download.streaming_content))
    assert download.status_code == 200 and files["train.jsonl"]["size"] > 0
    assert script.get(url.replace("train.jsonl", "secret.txt")).status_code == 404
    assert APIClient().get(url).status_code in (401, 403)
    assert row["rewards"] == [1.0, 0.5, 0.0] and row["item"] == ITEM
    assert [d["name"] for d in ml.get(API + "datasets/").data["results"]] == ["crux"]

    again = ml.post(API + "datasets/", {"name": "crux", "batch_ids": [batch_id]}, format="json")
    assert again.status_code == 201 and again.data["version"] == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"reward": {"correctness": -1}}, "reward weights must not be negative"),
        ({"min_group_size": 4}, "no group of at least 4 finished rollouts matches the filter"),
        ({"name": "no spaces"}, "name: A name is 1 to 80 ASCII characters"),
        ({"validation_fraction": 1.5}, "the validation fraction is between 0 and 1"),
        (
            {"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"},
            "the period is empty: 'since' is not before 'until'",
        ),
    ],
)
def test_a_dataset_the_service_refuses(ml, var_dir, body, message):
    response = ml.post(API + "datasets/", {"name": "crux", **body}, format="json")

    assert response.status_code == 400
    assert message in response.data["detail"]
    assert not Dataset.objects.exists()


def test_a_malformed_dataset_request_is_a_400_from_the_serializer(ml, var_dir):
    for body, field in (
        ({"name": "crux", "reward": {"bonus": 1}}, "reward"),
        ({"name": "crux", "batch_ids": [999999]}, "batch_ids"),
        ({"name": "crux", "conductor_version": "no-such-version"}, "conductor_version"),
    ):
        response = ml.post(API + "datasets/", body, format="json")
        assert response.status_code == 400 and field in response.data["errors"], body
    assert not Dataset.objects.exists()


# --- evaluations, promotion, rollback, shadow -----------------------------------------------------


def test_an_evaluation_is_created_and_read_with_its_results(ml, replay_pool, tmp_path):
    baseline = conductor_active()
    candidate = learned_version(tmp_path, "strong", RIGHT)

    response = ml.post(
        API + "evaluations/", {"candidate": "strong", "split": "dev", "limit": 2}, format="json"
    )

    assert response.status_code == 201, response.data
    evaluation = Evaluation.objects.get(pk=response.data["id"])
    assert (evaluation.candidate, evaluation.baseline) == (candidate, baseline)
    assert response.data["baseline"] == baseline.name and len(response.data["items"]) == 2
    links = EvaluationRun.objects.filter(evaluation=evaluation)
    assert links.count() == 4 and {link.run.kind for link in links} == {Run.Kind.EVALUATION}
    assert ml.get(f"{API}evaluations/{evaluation.pk}/").data["status"] == "running"

    for link in links:
        engine.execute_run(link.run_id)
    detail = ml.get(f"{API}evaluations/{evaluation.pk}/")

    assert detail.status_code == 200 and detail.data["status"] == "succeeded"
    results = detail.data["results"]
    assert results["candidate"]["version"] == "strong" and results["baseline"]["version"] == baseline.name
    assert results["candidate"]["n"] == results["candidate"]["finished"] == 2
    assert Run.objects.filter(evaluation_run__evaluation=evaluation, status=RunStatus.SUCCEEDED).count() == 4
    refused = ml.post(API + "evaluations/", {"candidate": baseline.name, "limit": 2}, format="json")
    assert refused.status_code == 400 and refused.data["detail"].endswith(
        "is the baseline itself; choose another candidate"
    )
    assert ml.post(API + "evaluations/", {"candidate": "strong", "limit": 0}, format="json").data == {
        "detail": "evaluate on 1 to 5000 items"
    }


def test_promote_rollback_and_shadow_change_the_active_conductor(ml, replay_pool, tmp_path):
    baseline = conductor_active()
    candidate = learned_version(tmp_path, "learned-candidate", RIGHT)

    promoted = ml.post(f"{API}conductors/{candidate.name}/promote/")
    assert promoted.status_code == 200, promoted.data
    assert promoted.data["is_active"] is True and conductor_active() == candidate
    again = ml.post(f"{API}conductors/{candidate.name}/promote/")
    assert again.status_code == 400 and again.data == {
        "detail": "learned-candidate is already the active conductor"
    }
    assert AuditEvent.objects.get(action="conductor.promoted").actor_name == "mira"

    rolled_back = ml.post(API + "conductors/rollback/")
    assert rolled_back.status_code == 200 and rolled_back.data["name"] == baseline.name
    assert conductor_active() == baseline

    shadow_on = ml.post(f"{API}conductors/{candidate.name}/shadow/", {"on": True}, format="json")
    assert shadow_on.status_code == 200 and shadow_on.data["is_shadow"] is True
    assert ConductorVersion.objects.get(is_shadow=True) == candidate and conductor_active() == baseline
    active_shadow = ml.post(f"{API}conductors/{baseline.name}/shadow/", {"on": True}, format="json")
    assert active_shadow.status_code == 400
    assert active_shadow.data["detail"] == "static-v1 is the active conductor; shadow a candidate instead"
    assert ml.post(f"{API}conductors/{candidate.name}/shadow/", {}, format="json").status_code == 400

    shadow_off = ml.post(f"{API}conductors/{candidate.name}/shadow/", {"on": False}, format="json")
    assert shadow_off.status_code == 200 and shadow_off.data["is_shadow"] is False
    assert not ConductorVersion.objects.filter(is_shadow=True).exists()
    assert list(
        AuditEvent.objects.filter(action__startswith="conductor.shadow").values_list("action", flat=True)
    ) == ["conductor.shadow_set", "conductor.shadow_cleared"]
    listed = {c["name"]: c for c in ml.get(API + "conductors/").data}
    assert listed[baseline.name]["is_active"] and not listed[candidate.name]["is_active"]


# --- the schema -----------------------------------------------------------------------------------


def _schema_warnings(patterns) -> set[str]:
    GENERATOR_STATS.reset()
    try:
        with GENERATOR_STATS.silence():
            SchemaGenerator(patterns=patterns).get_schema(request=None, public=True)
        return set(GENERATOR_STATS._warn_cache) | set(GENERATOR_STATS._error_cache)
    finally:
        GENERATOR_STATS.reset()


def test_the_schema_is_served_and_generates_without_warnings(ml):
    from conductor_web import urls

    response = ml.get("/api/schema/")
    assert response.status_code == 200
    schema = response.content.decode()
    for documented in (
        "/api/training/jobs/{id}/metrics/",
        "/api/training/conductors/rollback/",
        "JobStartInput",
    ):
        assert documented in schema

    assert _schema_warnings([path("api/training/", include("training.api_urls"))]) == set()
    assert _schema_warnings(urls.urlpatterns) == set()  # the whole API: one name per choice set
