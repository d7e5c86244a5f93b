"""The ML staff's training pages through Django's test client: roles, forms, the progress JSON, downloads."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import redis
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor
from routing import engine, replay
from routing.models import ConductorVersion, Run, RunStatus, Task
from routing.services import conductor_active
from training import services
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

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def var_dir(settings, tmp_path) -> Path:
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    return settings.VAR_DIR


def queued(client: redis.Redis, queue: str) -> list[tuple[str, list]]:
    """(task name, args) of each message waiting in a queue of the broker (kombu's Redis list)."""
    messages = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        messages.append((message["headers"]["task"], args))
    return messages


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def ml(make_user) -> Client:
    return client_for(make_user("mira", Role.ML_STAFF))


@pytest.fixture
def job() -> TrainingJob:
    job = TrainingJob.objects.create(
        name="learned-a",
        backend=TrainingJob.Backend.LEARNED,
        options={"split": "train", "limit": 60, "epochs": 4},
        status=JobStatus.RUNNING,
        step=3,
        total_steps=4,
        log=f"epoch 1\nepoch 2\n{XSS}\n",
    )
    for step in range(1, 4):
        TrainingMetric.objects.create(job=job, step=step, values={"reward": 0.1 * step, "loss": 1.0 / step})
    return job


# --- Roles ------------------------------------------------------------------------------------

ACTIONS = [
    ("training:job-start", []),
    ("training:rollouts-start", []),
    ("training:dataset-build", []),
    ("training:rollback", []),
]


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get(reverse("training:home"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    response = client.post(reverse("training:rollback"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("roles", [(), (Role.OPERATOR,)], ids=["no-role", "operator"])
def test_users_without_ml_staff_or_auditor_roles_are_refused(make_user, job, roles):
    client = client_for(make_user("otto", *roles))
    for url in (
        reverse("training:home"),
        reverse("training:job", args=[job.pk]),
        reverse("training:job-progress", args=[job.pk]),
    ):
        assert client.get(url).status_code == 403, url
    for name, args in ACTIONS:
        assert client.post(reverse(name, args=args)).status_code == 403, name
    assert client.post(reverse("training:job-cancel", args=[job.pk])).status_code == 403


def test_auditors_read_the_pages_but_change_nothing(make_user, job):
    client = client_for(make_user("ann", Role.AUDITOR))
    page = client.get(reverse("training:home"))
    assert page.status_code == 200
    assert b"Read-only" in page.content and b"Launch a training job" not in page.content
    assert client.get(reverse("training:job", args=[job.pk])).status_code == 200
    assert client.get(reverse("training:job-progress", args=[job.pk])).status_code == 200
    for name, args in ACTIONS:
        assert client.post(reverse(name, args=args)).status_code == 403, name
    assert client.post(reverse("training:job-cancel", args=[job.pk])).status_code == 403
    job.refresh_from_db()
    assert not job.cancel_requested


@pytest.mark.parametrize("roles", [(Role.ML_STAFF,), (Role.ADMIN,)], ids=["ml-staff", "admin"])
def test_ml_staff_and_admins_see_the_forms_with_their_defaults(make_user, var_dir, roles):
    conductor_active()
    page = client_for(make_user("mira", *roles)).get(reverse("training:home"))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Launch a training job" in html and "Start rollouts" in html and "Build a dataset" in html
    assert "static-v1" in html and "Roll back" in html
    form = page.context["job_form"]
    assert form["epochs"].initial == 40 and form["learning_rate"].initial == 3.0
    assert form["group_size"].initial == 16 and form["cost_penalty_per_usd"].initial == 20.0
    assert form["max_steps"].initial == 20 and form["num_generations"].initial == 4
    assert form["lora_learning_rate"].initial == 1e-4 and form["lora_r"].initial == 8
    # The local model, installed by `make test`: its checkpoint is made by the job from its weights.
    assert form["base_model_path"].initial == str(var_dir / "models" / "smollm2-135m-instruct")


def test_the_nav_shows_training_to_ml_staff_only(make_user):
    conductor_active()
    ml_page = client_for(make_user("mira", Role.ML_STAFF)).get(reverse("routing:task-list"))
    assert reverse("training:home").encode() in ml_page.content
    op_page = client_for(make_user("otto", Role.OPERATOR)).get(reverse("routing:task-list"))
    assert reverse("training:home").encode() not in op_page.content


# --- Forms ------------------------------------------------------------------------------------


def job_post(**changes) -> dict[str, str]:
    data = {
        "name": "learned-b",
        "backend": "learned",
        "dataset": "",
        "split": "train",
        "limit": "60",
        "epochs": "8",
        "learning_rate": "3.0",
        "group_size": "16",
        "cost_penalty_per_usd": "20",
        "base_model_path": "",
        "max_steps": "20",
        "num_generations": "4",
        "prompts_per_step": "4",
        "max_completion_length": "256",
        "lora_learning_rate": "0.0001",
        "lora_r": "8",
    }
    data.update(changes)
    return {f"job-{k}": v for k, v in data.items()}


def test_a_job_form_with_errors_is_shown_again_with_them(ml):
    response = ml.post(reverse("training:job-start"), job_post(name="not a slug!", epochs="0"))
    assert response.status_code == 200
    form = response.context["job_form"]
    assert "name" in form.errors and "epochs" in form.errors
    assert b"errorlist" in response.content
    assert not TrainingJob.objects.exists()


def test_the_llm_backend_needs_a_dataset(ml):
    response = ml.post(reverse("training:job-start"), job_post(backend="llm-lora", base_model_path="/m"))
    assert "dataset" in response.context["job_form"].errors
    assert not TrainingJob.objects.exists()


def test_a_job_may_not_take_the_name_of_a_conductor_version(ml):
    conductor_active()
    response = ml.post(reverse("training:job-start"), job_post(name="static-v1"))
    assert "name" in response.context["job_form"].errors


@pytest.mark.django_db(transaction=True)
def test_a_valid_job_form_starts_a_job_with_the_backend_options_and_redirects(ml, broker, settings):
    response = ml.post(reverse("training:job-start"), job_post(limit=""))
    job = TrainingJob.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("training:job", args=[job.pk])
    assert (job.name, job.backend, job.dataset, job.status) == (
        "learned-b",
        "learned",
        None,
        JobStatus.QUEUED,
    )
    # the form's settings over the service's defaults: the empty limit is the default (every item)
    assert job.options == {**services.LEARNED_DEFAULTS, "epochs": 8}
    assert job.options["limit"] is None and job.created_by.username == "mira"
    event = AuditEvent.objects.get(action="training.job_started", object_id=str(job.pk))
    assert event.actor_name == "mira" and event.payload["options"] == job.options
    # queued on commit for the training worker (none runs here)
    assert queued(broker, settings.CONDUCTOR_QUEUE_PREFIX + "training") == [
        ("training.tasks.train_job", [job.pk])
    ]
    assert job.celery_task_id


@pytest.mark.django_db(transaction=True)
def test_a_lora_job_is_sized_from_the_form(ml, dataset, broker, var_dir):
    """Prompts per step and tokens per plan: what makes a job on the local model fit a CPU."""
    local = str(var_dir / "models" / "smollm2-135m-instruct")
    sized = {
        "prompts_per_step": "2",
        "max_completion_length": "128",
        "max_steps": "3",
        "num_generations": "2",
    }
    response = ml.post(
        reverse("training:job-start"),
        job_post(name="lora-b", backend="llm-lora", dataset=str(dataset.pk), base_model_path=local, **sized),
    )
    job = TrainingJob.objects.get(name="lora-b")
    assert response.status_code == 302
    assert {k: job.options[k] for k in sized} == {k: int(v) for k, v in sized.items()}
    html = ml.get(reverse("training:home")).content.decode()
    assert 'name="job-prompts_per_step"' in html and 'name="job-max_completion_length"' in html


def test_refusals_of_the_service_are_form_errors_not_500s(ml, job, dataset, var_dir):
    no_model = var_dir / "models" / "none"
    for changes, message in (
        ({"name": "learned-a"}, "the name 'learned-a' is taken; choose another"),
        (
            {"backend": "llm-lora", "dataset": str(dataset.pk), "base_model_path": str(no_model)},
            f"no model at {no_model} (a directory with config.json",
        ),
    ):
        response = ml.post(reverse("training:job-start"), job_post(**changes))
        assert response.status_code == 200, changes
        assert message in " ".join(response.context["job_form"].non_field_errors()), changes
        assert escape(message).encode() in response.content, changes
    # A value past the service's bounds is refused by the form itself, which takes them from the service.
    response = ml.post(reverse("training:job-start"), job_post(epochs="1000"))
    assert response.status_code == 200
    assert "less than or equal to 500" in " ".join(response.context["job_form"].errors["epochs"])
    assert list(TrainingJob.objects.values_list("name", flat=True)) == ["learned-a"]
    assert not AuditEvent.objects.filter(action="training.job_started").exists()


def test_the_rollouts_form_checks_k_and_temperature(ml):
    version = conductor_active()
    data = {"version": version.pk, "split": "train", "limit": "5", "k": "0", "temperature": "9"}
    response = ml.post(reverse("training:rollouts-start"), {f"rollouts-{k}": v for k, v in data.items()})
    assert response.status_code == 200
    errors = response.context["rollouts_form"].errors
    assert "k" in errors and "temperature" in errors


@pytest.mark.django_db(transaction=True)
def test_the_rollouts_form_starts_k_runs_per_item_of_the_split(ml, broker, settings):
    version = conductor_active()
    data = {
        "version": version.pk,
        "split": "train",
        "domain": "gsm8k",
        "limit": "3",
        "k": "2",
        "temperature": "0.7",
    }
    response = ml.post(reverse("training:rollouts-start"), {f"rollouts-{k}": v for k, v in data.items()})
    assert response.status_code == 302 and response["Location"] == reverse("training:home") + "#batches"
    batch = RolloutBatch.objects.get()
    assert (batch.conductor_version, batch.k, batch.temperature, batch.status) == (
        version,
        2,
        0.7,
        JobStatus.RUNNING,
    )
    assert batch.created_by.username == "mira"
    train = {item.id: item for item in replay.read_items(replay.split_path("train"))}
    assert len(set(batch.items)) == 3 and all(train[item].domain == "gsm8k" for item in batch.items)

    rollouts = list(Rollout.objects.filter(batch=batch).select_related("run", "task"))
    assert sorted((r.item, r.sample) for r in rollouts) == sorted(
        (item, sample) for item in batch.items for sample in (0, 1)
    )
    for rollout in rollouts:
        run = rollout.run
        assert (run.kind, run.temperature, run.conductor_version, run.status) == (
            Run.Kind.ROLLOUT,
            0.7,
            version,
            RunStatus.QUEUED,
        )
        assert run.task_id == rollout.task_id and rollout.task.source == Task.Source.TRAINING
        assert rollout.task.source_item == rollout.item and rollout.task.text == train[rollout.item].task
    # each run was handed to the broker on commit (no worker takes it here)
    assert sorted(args[0] for _, args in queued(broker, settings.CELERY_TASK_DEFAULT_QUEUE)) == sorted(
        r.run_id for r in rollouts
    )

    data["domain"] = "no-such-domain"
    response = ml.post(reverse("training:rollouts-start"), {f"rollouts-{k}": v for k, v in data.items()})
    assert response.status_code == 200
    assert (
        "no items in the train split of replay of kind 'no-such-domain'"
        in response.context["rollouts_form"].non_field_errors()
    )
    assert RolloutBatch.objects.count() == 1 and Rollout.objects.count() == 6


ITEM = "cruxeval-o:crux-test-#1"  # gpt-4o answers it right, gpt-3.5-turbo wrong (recorded outcomes)
RIGHT, WRONG = "gpt-4o-2024-08-06", "gpt-3.5-turbo-0125"


def finished_rollouts(plans: list[str]) -> tuple[RolloutBatch, list[Run]]:
    """A batch of K=len(plans) rollouts of ITEM, each run through the engine with a given plan."""
    batch = services.rollouts_start(
        version=conductor_active(), items=[ITEM], k=len(plans), temperature=1.0, actor=Actor.service("test")
    )
    task = Task.objects.get(source_item=ITEM, source=Task.Source.TRAINING)
    runs = [r.run for r in Rollout.objects.filter(batch=batch).select_related("run").order_by("sample")]
    for run, worker in zip(runs, plans, strict=True):
        text = (
            json.dumps(
                {
                    "thought": "t",
                    "steps": [{"worker": worker.lower(), "instruction": task.text, "access": []}],
                }
            )
            if worker in (RIGHT, WRONG)
            else worker
        )
        Run.objects.filter(pk=run.pk).update(plan_override=text)
        engine.execute_run(run.pk)
    return batch, [Run.objects.get(pk=r.pk) for r in runs]


@pytest.mark.django_db(transaction=True)
def test_the_dataset_form_checks_the_validation_fraction_and_builds_a_dataset_with_its_reward_config(
    ml, replay_pool, var_dir, broker
):
    bad = {"name": "grpo", "min_group_size": "2", "cost_penalty_per_usd": "-1", "validation_fraction": "2"}
    response = ml.post(reverse("training:dataset-build"), {f"dataset-{k}": v for k, v in bad.items()})
    assert response.status_code == 200
    errors = response.context["dataset_form"].errors
    assert "validation_fraction" in errors and "cost_penalty_per_usd" in errors
    assert not Dataset.objects.exists() and not (var_dir / "datasets").exists()

    batch, runs = finished_rollouts([RIGHT, WRONG, "not a plan at all"])
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.FAILED]
    assert [r.score for r in runs[:2]] == [1.0, 0.0] and runs[0].cost_usd > 0
    good = {
        "name": "grpo",
        "batches": [batch.pk],
        "min_group_size": "3",
        "cost_penalty_per_usd": "5",
        "format_term": "on",
        "validation_fraction": "0.2",
    }
    response = ml.post(reverse("training:dataset-build"), {f"dataset-{k}": v for k, v in good.items()})
    dataset = Dataset.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "training:dataset", args=[dataset.pk]
    )
    assert (dataset.name, dataset.version, dataset.created_by.username) == ("grpo", 1, "mira")
    assert dataset.reward_config == {
        "correctness": 1.0,
        "cost_penalty_per_usd": 5.0,
        "format_term": True,
        "human_labels": False,
    }
    assert dataset.filter["batch_ids"] == [batch.pk] and dataset.filter["min_group_size"] == 3
    assert dataset.counts["groups"] == 1 and dataset.counts["completions"] == 3
    assert dataset.source_run_ids == sorted(r.pk for r in runs)

    files = services.dataset_files(dataset)
    assert sorted(files) == sorted(services.DATASET_FILES)
    assert all(path.is_file() and path.is_relative_to(var_dir) for path in files.values())
    (row,) = [
        json.loads(line)
        for name in ("train.jsonl", "validation.jsonl")
        for line in files[name].read_text().splitlines()
    ]
    # the form's reward: the format term (1 right, 0.5 parsed but wrong, 0 unparseable) less 5 USD⁻¹ × cost
    assert row["item"] == ITEM and row["rewards"] == pytest.approx(
        [1.0 - 5 * float(runs[0].cost_usd), 0.5 - 5 * float(runs[1].cost_usd), 0.0]
    )
    assert json.loads(files["manifest.json"].read_text())["reward_config"] == dataset.reward_config
    page = ml.get(response["Location"])
    assert page.status_code == 200 and dataset.content_hash.encode() in page.content
    (group,) = page.context["preview"]  # the first groups, each sample with its reward and advantage
    assert [s["run_id"] for s in group["samples"]] == [r.pk for r in runs]
    assert [s["advantage"] for s in group["samples"]] == pytest.approx(row["advantages"])
    assert escape("not a plan at all") in page.content.decode()

    # the other filters reach the service: a version that sampled nothing, and a period, select no group
    other = ConductorVersion.objects.create(name="other", backend="static", config={})
    narrowed = {
        **good,
        "conductor_version": other.pk,
        "items": f"{ITEM}, elsewhere",
        "since": "2020-01-01 00:00",
        "correctness": "2",
    }
    response = ml.post(reverse("training:dataset-build"), {f"dataset-{k}": v for k, v in narrowed.items()})
    assert response.status_code == 200 and "no group of at least 3" in response.content.decode()
    narrowed["conductor_version"] = runs[0].conductor_version_id
    response = ml.post(reverse("training:dataset-build"), {f"dataset-{k}": v for k, v in narrowed.items()})
    second = Dataset.objects.get(version=2)
    assert second.filter["conductor_version"] == runs[0].conductor_version.name
    assert second.filter["items"] == [ITEM, "elsewhere"] and second.filter["since"].startswith("2020-01-01")
    assert second.reward_config["correctness"] == 2.0 and second.counts["groups"] == 1


# --- Versions ---------------------------------------------------------------------------------


def test_promote_shadow_and_rollback_go_through_the_services(ml):
    baseline = conductor_active()
    candidate = ConductorVersion.objects.create(name="static-v2", backend="static", config=baseline.config)

    response = ml.post(reverse("training:shadow", args=[candidate.pk]), {"on": "1"}, follow=True)
    candidate.refresh_from_db()
    assert candidate.is_shadow
    assert "shadow" in " ".join(str(m) for m in response.context["messages"])

    ml.post(reverse("training:shadow", args=[candidate.pk]), {"on": "0"})
    candidate.refresh_from_db()
    assert not candidate.is_shadow

    # Promote from the versions table asks for its box too, as roll back does.
    unconfirmed = ml.post(reverse("training:promote", args=[candidate.pk]), follow=True)
    assert "Not promoted: confirm it first." in " ".join(str(m) for m in unconfirmed.context["messages"])
    assert conductor_active().pk == baseline.pk
    assert 'name="confirm" value="yes" required' in ml.get(reverse("training:home")).content.decode()
    response = ml.post(reverse("training:promote", args=[candidate.pk]), {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == reverse("training:home")
    assert conductor_active().pk == candidate.pk

    response = ml.post(reverse("training:rollback"), {"confirm": "yes"}, follow=True)
    assert conductor_active().pk == baseline.pk
    assert "static-v1" in " ".join(str(m) for m in response.context["messages"])


def test_a_rollback_with_no_earlier_conductor_is_a_message_not_a_500(ml):
    active = conductor_active()
    response = ml.post(reverse("training:rollback"), {"confirm": "yes"}, follow=True)
    assert response.status_code == 200
    shown = " ".join(str(m) for m in response.context["messages"])
    assert "Not rolled back: no earlier conductor to roll back to from static-v1" in shown
    assert conductor_active() == active
    assert not AuditEvent.objects.filter(action="conductor.rolled_back").exists()

    # the message is escaped: an active version whose name was written to the database as is
    ConductorVersion.objects.update(is_active=False)
    odd = ConductorVersion.objects.create(name=XSS, backend="static", config=active.config, is_active=True)
    response = ml.post(reverse("training:rollback"), {"confirm": "yes"}, follow=True)
    assert response.status_code == 200
    assert f"to roll back to from {XSS_ESCAPED}".encode() in response.content
    assert XSS.encode() not in response.content
    assert conductor_active() == odd


@pytest.mark.django_db(transaction=True)
def test_evaluate_checks_its_form_and_starts_an_evaluation_against_the_active_conductor(ml, broker, settings):
    baseline = conductor_active()
    candidate = ConductorVersion.objects.create(name="static-v2", backend="static", config=baseline.config)
    response = ml.post(
        reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": "0"}, follow=True
    )
    assert "Not evaluated" in " ".join(str(m) for m in response.context["messages"])
    response = ml.post(
        reverse("training:evaluate", args=[baseline.pk]), {"split": "dev", "limit": "2"}, follow=True
    )
    assert response.status_code == 200
    assert "Not evaluated: static-v1 is the baseline itself" in " ".join(
        str(m) for m in response.context["messages"]
    )
    assert not Evaluation.objects.exists()

    response = ml.post(reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": "2"})
    evaluation = Evaluation.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("training:evaluation", args=[evaluation.pk])
    assert (evaluation.candidate, evaluation.baseline, evaluation.split, evaluation.limit) == (
        candidate,
        baseline,
        "dev",
        2,
    )
    assert evaluation.status == JobStatus.RUNNING and evaluation.created_by.username == "mira"
    dev = {item.id for item in replay.read_items(replay.split_path("dev"))}
    assert len(set(evaluation.items)) == 2 and set(evaluation.items) <= dev
    links = list(EvaluationRun.objects.filter(evaluation=evaluation).select_related("run"))
    assert sorted((link.item, link.side, link.run.conductor_version.name) for link in links) == sorted(
        (item, side, version.name)
        for item in evaluation.items
        for side, version in (("candidate", candidate), ("baseline", baseline))
    )
    assert {(link.run.kind, link.run.status) for link in links} == {(Run.Kind.EVALUATION, RunStatus.QUEUED)}
    assert sorted(args[0] for _, args in queued(broker, settings.CELERY_TASK_DEFAULT_QUEUE)) == sorted(
        link.run_id for link in links
    )
    assert conductor_active() == baseline
    assert b'data-refresh="1"' in ml.get(response["Location"]).content


@pytest.mark.django_db(transaction=True)
def test_evaluate_against_a_baseline_chosen_on_the_page(ml, broker):
    """A trained candidate against the base it was trained from, which is not the active version."""
    active = conductor_active()
    base = ConductorVersion.objects.create(name="base-v1", backend="static", config=active.config)
    candidate = ConductorVersion.objects.create(name="trained-v1", backend="static", config=active.config)
    home = ml.get(reverse("training:home")).content.decode()
    assert f'<option value="{base.pk}">vs base-v1</option>' in home

    preview = ml.post(
        reverse("training:evaluate", args=[candidate.pk]),
        {"split": "dev", "limit": "2", "baseline": base.pk, "preview": "1"},
    ).content.decode()
    assert "against <strong>base-v1</strong>" in preview and not Evaluation.objects.exists()
    ml.post(
        reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": "2", "baseline": base.pk}
    )

    evaluation = Evaluation.objects.get()
    assert (evaluation.candidate, evaluation.baseline) == (candidate, base)
    assert conductor_active() == active


def test_the_evaluation_page_compares_candidate_and_baseline(ml):
    baseline = conductor_active()
    candidate = ConductorVersion.objects.create(name="learned-z", backend="learned")
    side = {"accuracy": 0.75, "usd_per_1000": "1.2345", "p95_plan_ms": 12.5, "n": 20, "failed": 1}
    evaluation = Evaluation.objects.create(
        candidate=candidate,
        baseline=baseline,
        status=JobStatus.SUCCEEDED,
        results={
            "candidate": {"version": "learned-z", **side},
            "baseline": {"version": "static-v1", **side, "accuracy": 0.5, "usd_per_1000": "3.5"},
        },
    )
    response = ml.get(reverse("training:evaluation", args=[evaluation.pk]))
    html = response.content.decode()
    assert 'id="evaluation-chart"' in html and 'data-refresh="0"' in html
    assert "0.750" in html and "0.500" in html and "1.2345" in html and "12.5" in html
    chart = response.context["chart"]
    assert [p["name"] for p in chart] == ["learned-z", "static-v1"]
    queued = Evaluation.objects.create(candidate=candidate, baseline=baseline)
    assert b'data-refresh="1"' in ml.get(reverse("training:evaluation", args=[queued.pk])).content


# --- Jobs -------------------------------------------------------------------------------------


def test_the_progress_json_returns_the_points_after_a_step(ml, job):
    url = reverse("training:job-progress", args=[job.pk])
    data = ml.get(url).json()
    assert set(data) >= {"status", "step", "total_steps", "progress", "metrics", "log_tail", "finished"}
    assert data["status"] == "running" and data["step"] == 3 and data["total_steps"] == 4
    assert data["progress"] == pytest.approx(0.75) and data["finished"] is False
    assert [m["step"] for m in data["metrics"]] == [1, 2, 3]
    assert data["metrics"][0]["values"] == {"reward": pytest.approx(0.1), "loss": 1.0}
    assert XSS in data["log_tail"]  # JSON: the page writes it with textContent

    assert [m["step"] for m in ml.get(url, {"after": 1}).json()["metrics"]] == [2, 3]
    assert ml.get(url, {"after": 3}).json()["metrics"] == []
    assert ml.get(url, {"after": "x"}).status_code == 400
    too_far = ml.get(url, {"after": str(10**30)})  # past any step the column can hold: refused
    assert too_far.status_code == 400 and "after" in too_far.json()["detail"]

    TrainingMetric.objects.create(job=job, step=4, values={"reward": 0.5})
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED, step=4)
    data = ml.get(url, {"after": 3}).json()
    assert (
        data["finished"] is True and data["progress"] == 1.0 and [m["step"] for m in data["metrics"]] == [4]
    )


def test_the_job_page_embeds_its_state_and_escapes_the_log(ml, job):
    html = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    assert 'id="job-progress"' in html and 'aria-valuenow="75.0"' in html and 'value="75.0"' in html
    assert 'id="job-curves"' in html and "plotly/plotly.min.js" in html and "js/training.js" in html
    assert XSS_ESCAPED in html.split('id="job-log"')[1]
    assert XSS not in html.replace(json.dumps(XSS)[1:-1], "")  # json_script escapes < as \u003C
    state = json.loads(html.split('<script id="job-data" type="application/json">')[1].split("</script>")[0])
    assert (
        state["progress_url"] == reverse("training:job-progress", args=[job.pk])
        and len(state["metrics"]) == 3
    )


def test_cancel_goes_through_the_service(ml, job):
    response = ml.post(reverse("training:job-cancel", args=[job.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("training:job", args=[job.pk])
    job.refresh_from_db()
    assert job.cancel_requested or job.status == JobStatus.CANCELLED


def test_a_jobs_artifact_is_served_only_from_inside_var_dir(ml, job, var_dir, tmp_path):
    (var_dir / "policies").mkdir()
    (var_dir / "policies" / "learned-a.json").write_text('{"weights": []}')
    TrainingJob.objects.filter(pk=job.pk).update(artifact_path="policies/learned-a.json")
    page = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    link = reverse("training:job-artifact", args=[job.pk, "learned-a.json"])
    assert link in page
    response = ml.get(link)
    assert response.status_code == 200 and b"".join(response.streaming_content) == b'{"weights": []}'
    assert ml.get(reverse("training:job-artifact", args=[job.pk, "other.json"])).status_code == 404

    (tmp_path / "secret.txt").write_text("not yours")
    TrainingJob.objects.filter(pk=job.pk).update(artifact_path="../secret.txt")
    assert ml.get(reverse("training:job-artifact", args=[job.pk, "secret.txt"])).status_code == 404


# --- Datasets ---------------------------------------------------------------------------------


@pytest.fixture
def dataset(var_dir) -> Dataset:
    directory = var_dir / "datasets" / "grpo" / "v1"
    directory.mkdir(parents=True)
    dataset = Dataset.objects.create(
        name="grpo",
        version=1,
        filter={"batch_ids": [1]},
        counts={"train": 9, "validation": 1, "groups": 5},
        content_hash="0123456789abcdef" * 4,
        source_run_ids=[1, 2, 3],
        path="datasets/grpo/v1",
    )
    for name in services.DATASET_FILES:
        (directory / name).write_text(f"contents of {name}\n")
    (var_dir / "datasets" / "grpo" / "secret.txt").write_text("not a dataset file")
    return dataset


def test_the_dataset_page_shows_its_manifest_and_files(ml, dataset):
    response = ml.get(reverse("training:dataset", args=[dataset.pk]))
    html = response.content.decode()
    assert "grpo v1" in html and dataset.content_hash in html
    assert 'id="dataset-source-runs">3<' in html
    for name in services.dataset_files(dataset):
        assert reverse("training:dataset-file", args=[dataset.pk, name]) in html
    # these files were not written by a build: the page says the split cannot be previewed, no 500
    assert "cannot be previewed: JSONDecodeError" in html and response.context["preview"] == []


def test_dataset_downloads_serve_its_files_and_refuse_other_names(ml, dataset):
    files = services.dataset_files(dataset)
    assert "manifest.json" in files and "train.jsonl" in files
    response = ml.get(reverse("training:dataset-file", args=[dataset.pk, "train.jsonl"]))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"contents of train.jsonl\n"
    assert "attachment" in response["Content-Disposition"]
    for name in ("secret.txt", "..", "..%2Fsecret.txt", "train.csv"):
        assert ml.get(reverse("training:dataset", args=[dataset.pk]) + "files/" + name).status_code == 404, (
            name
        )


@pytest.mark.django_db(transaction=True)
def test_the_training_page_shows_a_batch_finished_once_its_runs_have_ended(ml, replay_pool, var_dir, broker):
    batch, _ = finished_rollouts([RIGHT, WRONG])
    assert batch.status == JobStatus.RUNNING  # nothing has looked at it since its runs ended
    page = ml.get(reverse("training:home"))
    batch.refresh_from_db()
    assert batch.status == JobStatus.SUCCEEDED and "Succeeded" in page.content.decode()
    assert AuditEvent.objects.filter(action="rollouts.finished", object_id=str(batch.pk)).count() == 1
