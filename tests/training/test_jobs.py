"""Training jobs: queued on the training queue, run by a real Celery worker, cancellable, all audited."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from audit.services import Actor
from routing.models import ConductorVersion
from tests.conftest import wait_for
from training.frontier import COST_PENALTIES, REFINE
from training.models import JobStatus, TrainingJob, TrainingMetric
from training.services import TrainingError, job_cancel, job_start
from training.tasks import train_job

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")


def job_actions(job: TrainingJob) -> list[str]:
    return list(
        AuditEvent.objects.filter(object_type="trainingjob", object_id=str(job.pk))
        .order_by("id")
        .values_list("action", flat=True)
    )


@pytest.mark.integration
def test_a_learned_job_runs_on_the_training_queue_and_registers_a_candidate(
    replay_pool, celery_workers, settings, tmp_path, page
):
    settings.VAR_DIR = tmp_path  # the worker process gets the same directory below
    celery_workers("trainer", queues=("training",), CONDUCTOR_VAR_DIR=str(tmp_path))
    job = job_start(
        name="learned-job", backend="learned", dataset=None, options={"limit": 80, "epochs": 6}, actor=ACTOR
    )
    assert job.options["group_size"] == 16 and job.options["split"] == "train"  # defaults filled in
    wait_for(lambda: TrainingJob.objects.get(pk=job.pk).finished, timeout=120, what="the job to finish")
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    assert (job.step, job.total_steps, job.progress) == (6, 6, 1.0)
    points = list(TrainingMetric.objects.filter(job=job).order_by("step"))
    assert [p.step for p in points] == [1, 2, 3, 4, 5, 6]
    assert {"reward", "accuracy", "usd_per_1000"} <= set(points[0].values)
    candidate = job.candidate
    assert candidate.name == "learned-job" and candidate.backend == ConductorVersion.Backend.LEARNED
    assert not candidate.is_active  # a candidate plans nothing until promoted
    assert (tmp_path / job.artifact_path).is_file() and Path(candidate.config["policy_path"]).is_file()
    # The cross-validated frontier it was chosen from: every penalty of the grid and its own (20 per USD),
    # and at most REFINE more between them where the points lay far apart in cost.
    frontier = candidate.config["frontier"]
    assert frontier["chosen"] == 20.0 and frontier["folds"] == 3 and frontier["items"] == 80
    swept = [p["cost_penalty_per_usd"] for p in frontier["points"]]
    assert swept == sorted(swept) and {*COST_PENALTIES, 20.0} <= set(swept)
    assert len(swept) <= len({*COST_PENALTIES, 20.0}) + REFINE
    assert any(p["on_frontier"] for p in frontier["points"])
    shown = page.get(reverse("training:job", args=[job.pk])).content.decode()
    assert 'id="frontier-chart"' in shown and shown.count('<td class="num">1000.0</td>') == 1
    assert job_actions(job) == ["training.job_started", "training.job_running", "training.job_succeeded"]
    assert AuditEvent.objects.filter(
        action="conductorversion.registered", object_id=str(candidate.pk)
    ).exists()
    assert "finished: candidate learned-job" in job.log
    # The log reads as the page shows settings, not as Python prints a dict (None, {'folds': 3}).
    assert "started (learned) with " in job.log and "limit = 80" in job.log and "split = train" in job.log
    assert "None" not in job.log and "{'" not in job.log and "falls back to " in job.log


@pytest.mark.integration
def test_a_running_job_stops_when_cancelled_and_registers_nothing(
    replay_pool, celery_workers, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    celery_workers("trainer", queues=("training",), CONDUCTOR_VAR_DIR=str(tmp_path))
    job = job_start(
        name="long-job", backend="learned", dataset=None, options={"limit": 300, "epochs": 400}, actor=ACTOR
    )
    wait_for(
        lambda: TrainingJob.objects.get(pk=job.pk).step >= 2, timeout=120, what="the job to make progress"
    )
    job_cancel(job=job, actor=ACTOR)
    wait_for(lambda: TrainingJob.objects.get(pk=job.pk).finished, timeout=60, what="the job to stop")
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.step < 400 and job.candidate is None
    assert not ConductorVersion.objects.filter(name="long-job").exists()
    assert job_actions(job)[-2:] == ["training.job_cancel_requested", "training.job_cancelled"]
    with pytest.raises(TrainingError, match="already cancelled"):
        job_cancel(job=job, actor=ACTOR)


@pytest.mark.integration
def test_a_job_whose_worker_process_is_killed_starts_again_and_finishes(
    replay_pool, celery_workers, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    celery_workers("trainer", queues=("training",), CONDUCTOR_VAR_DIR=str(tmp_path))
    job = job_start(
        name="killed-job",
        backend="learned",
        dataset=None,
        # The frontier's sweep (13 penalties x 3 folds) would run twice here; the restart is what matters.
        options={"limit": 300, "epochs": 150, "frontier": False},
        actor=ACTOR,
    )
    wait_for(
        lambda: TrainingJob.objects.get(pk=job.pk).step >= 2, timeout=120, what="the job to make progress"
    )
    killed = TrainingJob.objects.get(pk=job.pk).worker_pid
    os.kill(killed, signal.SIGKILL)
    wait_for(
        lambda: TrainingJob.objects.get(pk=job.pk).finished,
        timeout=240,
        what="the job to finish after the kill",
    )
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error + job.log
    assert job.deliveries == 2 and job.worker_pid != killed
    assert [p.step for p in TrainingMetric.objects.filter(job=job).order_by("step")] == list(range(1, 151))
    assert "training.job_restarted" in job_actions(job) and job_actions(job)[-1] == "training.job_succeeded"
    assert "restarted from the beginning" in job.log


def test_a_job_cancelled_before_it_starts_never_runs(replay_pool):
    job = job_start(
        name="never", backend="learned", dataset=None, options={"limit": 10, "epochs": 1}, actor=ACTOR
    )
    job_cancel(job=job, actor=ACTOR)
    train_job(job.pk)  # the queued message arrives after the cancel
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.started_at is None
    assert not TrainingMetric.objects.filter(job=job).exists()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"name": "bad name!", "backend": "learned", "options": {}}, "A name is 1 to 80 ASCII characters"),
        ({"name": "j", "backend": "nope", "options": {}}, "unknown backend"),
        ({"name": "j", "backend": "learned", "options": {"epochs": 0}}, "epochs must be between"),
        ({"name": "j", "backend": "learned", "options": {"epochs": "many"}}, "epochs must be a number"),
        ({"name": "j", "backend": "learned", "options": {"warp": 9}}, "unknown settings"),
        ({"name": "j", "backend": "learned", "options": {"split": "nosuch"}}, "no split"),
        ({"name": "j", "backend": "llm-lora", "options": {}}, "choose one"),
    ],
)
def test_bad_job_settings_are_refused_with_a_reason(replay_pool, kwargs, message):
    with pytest.raises(TrainingError, match=message):
        job_start(dataset=None, actor=ACTOR, **kwargs)
    assert not TrainingJob.objects.exists()


def test_a_candidate_name_is_used_once(replay_pool):
    from routing.services import conductor_active

    conductor_active()  # static-v1
    with pytest.raises(TrainingError, match="is taken"):
        job_start(name="static-v1", backend="learned", dataset=None, options={}, actor=ACTOR)


def test_lora_settings_are_checked_and_vllm_generation_needs_its_server(tmp_path):
    from training.models import Dataset
    from training.services import job_options

    (tmp_path / "config.json").write_text("{}")
    dataset = Dataset(name="d", version=1)
    base = {"base_model_path": str(tmp_path)}
    checked = job_options("llm-lora", base, dataset)
    assert checked["use_vllm"] is False and checked["num_generations"] == 4 and checked["format_term"] is True
    with pytest.raises(TrainingError, match="needs vllm_server_base_url"):
        job_options("llm-lora", {**base, "use_vllm": True}, dataset)
    served = job_options(
        "llm-lora", {**base, "use_vllm": True, "vllm_server_base_url": "http://trl:8000"}, dataset
    )
    assert served["use_vllm"] and served["vllm_server_base_url"] == "http://trl:8000"
    with pytest.raises(TrainingError, match="no model at"):
        job_options("llm-lora", {"base_model_path": str(tmp_path / "missing")}, dataset)
    # Each sampled plan is run through the engine for its reward: the job's runs have the same limit.
    with pytest.raises(TrainingError, match=r"would start 32,000 runs .*at most 2,000 runs"):
        job_options(
            "llm-lora", {**base, "max_steps": 1000, "prompts_per_step": 4, "num_generations": 8}, dataset
        )


def test_a_lora_job_is_refused_where_the_train_extra_is_not_installed(tmp_path, monkeypatch):
    """Without TRL the job would fail in the worker minutes later; it is refused at start, saying what to
    install. (A None in sys.modules is how Python marks a module that cannot be imported.)"""
    from training.models import Dataset
    from training.services import job_options

    (tmp_path / "config.json").write_text("{}")
    dataset = Dataset(name="d", version=1)
    assert job_options("llm-lora", {"base_model_path": str(tmp_path)}, dataset)["base_model_path"]
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(TrainingError, match=r"needs the train extra .*pip install -e '\.\[train\]'"):
        job_options("llm-lora", {"base_model_path": str(tmp_path)}, dataset)
