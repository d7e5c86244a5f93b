"""What the training pages say while work goes on: a roll back is confirmed as a promotion is, and a
job's or an evaluation's page says what it is doing now (its status, and the phase after its last step)."""

from __future__ import annotations

import pytest
from django.template.loader import get_template
from django.test import Client
from django.urls import reverse

from accounts.models import Role
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion
from routing.services import conductor_active
from training import trainers
from training.models import Evaluation, EvaluationRun, JobStatus, TrainingJob
from training.services import conductor_promote, job_start
from training.tasks import train_job

pytestmark = pytest.mark.django_db
ACTOR = Actor.service("test")
CONFIRM_BOX = '<label class="confirm-box"><input type="checkbox" name="confirm" value="yes" required>'


@pytest.fixture
def ml(make_user) -> Client:
    client = Client()
    client.force_login(make_user("mira", Role.ML_STAFF))
    return client


def test_roll_back_asks_for_the_confirmation_a_promotion_asks_for(ml):
    baseline = conductor_active()
    home = ml.get(reverse("training:home")).content.decode()
    assert 'id="rollback-form"' not in home and "No earlier conductor to roll back to." in home

    newer = ConductorVersion.objects.create(
        name="static-v2", backend=baseline.backend, config=baseline.config
    )
    conductor_promote(version=newer, actor=ACTOR)
    home = ml.get(reverse("training:home")).content.decode()
    form = home[home.index('id="rollback-form"') : home.index("</form>", home.index('id="rollback-form"'))]
    assert CONFIRM_BOX + f" Re-activate {baseline.name} in place of static-v2</label>" in form

    refused = ml.post(reverse("training:rollback"), follow=True)
    assert "Not rolled back: confirm the roll back first." in refused.content.decode()
    assert conductor_active() == newer
    ml.post(reverse("training:rollback"), {"confirm": "yes"})
    assert conductor_active() == baseline


def test_the_promote_form_of_an_evaluation_uses_the_same_confirmation():
    source = get_template("training/evaluation_detail.html").template.source
    assert '{% include "training/confirm.html" with label="I have read these deltas" %}' in source


def job_state(ml: Client, job: TrainingJob) -> dict:
    return ml.get(reverse("training:job-progress", args=[job.pk])).json()


def test_a_job_page_banner_follows_the_status_and_says_the_phase_after_the_last_step(ml, settings):
    job = TrainingJob.objects.create(
        name="learned-a", backend=TrainingJob.Backend.LEARNED, options={"epochs": 40}, total_steps=40
    )
    page = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    assert 'id="job-banner" data-status="queued">Training job learned-a is queued' in page

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, step=40)
    assert job_state(ml, job)["banner"] == "Training job learned-a is running: step 40 of 40."
    TrainingJob.objects.filter(pk=job.pk).update(
        phase="cross-validating the cost penalties: 6 of up to 45 trainings"
    )
    state = job_state(ml, job)
    assert state["phase"] == "cross-validating the cost penalties: 6 of up to 45 trainings"
    assert state["banner"] == (
        "Training job learned-a is running, past its last step: "
        "cross-validating the cost penalties: 6 of up to 45 trainings."
    )
    page = ml.get(reverse("training:job", args=[job.pk])).content.decode()
    assert (
        '<span id="job-phase">· cross-validating the cost penalties: 6 of up to 45 trainings</span>' in page
    )

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.FAILED, phase="", error="boom")
    state = job_state(ml, job)
    assert state["banner"] == "Training job learned-a failed: the reason is below." and state["phase"] == ""
    assert "queued" not in ml.get(reverse("training:job", args=[job.pk])).content.decode().lower()


@pytest.mark.django_db(transaction=True)
def test_a_running_job_says_each_phase_after_its_last_epoch(replay_pool, settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    seen: list[str] = []
    sweep = trainers.sweep

    def watched(*args, on_fold, **kwargs):
        def fold(done: int, total: int) -> None:
            on_fold(done, total)
            seen.append(TrainingJob.objects.get().phase)

        return sweep(*args, on_fold=fold, **kwargs)

    monkeypatch.setattr(trainers, "sweep", watched)
    gate = trainers.gate_policy

    def watched_gate(*args):
        seen.append(TrainingJob.objects.get().phase)
        return gate(*args)

    monkeypatch.setattr(trainers, "gate_policy", watched_gate)
    job = job_start(
        name="phases",
        backend="learned",
        dataset=None,
        options={"limit": 30, "epochs": 2, "frontier": False, "folds": 2},
        actor=ACTOR,
        queue=False,
    )
    train_job(job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    assert seen == [
        "cross-validating the cost penalties: 1 of up to 2 trainings",
        "cross-validating the cost penalties: 2 of up to 2 trainings",
        "gating: choosing each kind's fallback workflow",
    ]
    assert job.phase == ""  # finished: nothing runs any more


@pytest.mark.django_db(transaction=True)
def test_an_evaluation_page_banner_follows_the_status(ml, replay_pool):
    candidate = ConductorVersion.objects.create(
        name="static-v2", backend=conductor_active().backend, config=conductor_active().config
    )
    started = ml.post(
        reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": 1}, follow=True
    )
    evaluation = Evaluation.objects.get()
    assert len(evaluation.items) == 1
    page = started.content.decode()
    assert "queued" not in page.lower()
    assert 'id="evaluation-banner" data-status="running">Evaluation #' in page and "0 of 2 runs done" in page

    for link in EvaluationRun.objects.filter(evaluation=evaluation):
        engine.execute_run(link.run_id)
    Evaluation.objects.filter(pk=evaluation.pk).update(status=JobStatus.RUNNING)  # before it is refreshed
    page = ml.get(reverse("training:evaluation", args=[evaluation.pk])).content.decode()
    assert "is running, past its last item: every run has ended; recording the results." in page
    Evaluation.objects.filter(pk=evaluation.pk).update(status=JobStatus.SUCCEEDED)
    page = ml.get(reverse("training:evaluation", args=[evaluation.pk])).content.decode()
    assert "finished: every run has ended and the figures below are final." in page
    assert "is running" not in page
