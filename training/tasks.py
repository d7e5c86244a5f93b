"""Celery tasks of the training queue: thin, they take ids. A training job (its run: training.trainers)
and the backstop that settles rollout batches and evaluations."""

from __future__ import annotations

import logging
import time

from celery import shared_task

from routing.engine import advisory_lock, advisory_locked

from .models import Evaluation, JobStatus, RolloutBatch, TrainingJob
from .services import evaluation_refresh, rollout_batch_refresh
from .trainers import run_job

log = logging.getLogger(__name__)


JOB_LOCK_NAMESPACE = 0x54726E67  # "Trng": one process trains a job at a time


@shared_task(name="training.tasks.train_job", acks_late=True, reject_on_worker_lost=True)
def train_job(job_id: int) -> None:
    """Train one job. The job's advisory lock keeps a second delivery out while one process trains it; a
    job whose process died (lock free, still running) starts again from the beginning on redelivery."""

    with advisory_lock(JOB_LOCK_NAMESPACE, job_id) as acquired:
        if acquired:
            run_job(job_id)


def job_is_locked(job_id: int) -> bool:

    return advisory_locked(JOB_LOCK_NAMESPACE, job_id)


@shared_task(name="training.tasks.settle")
def settle() -> dict[str, int]:
    """The backstop: mark finished rollout batches and evaluations (done when their last run ends, by
    training.receivers), and queue again the training jobs whose process died."""

    requeued = 0
    for job_id in TrainingJob.objects.filter(status=JobStatus.RUNNING).values_list("pk", flat=True):
        if not job_is_locked(job_id):  # running, yet no process holds it: its worker died
            log.warning("training job %s lost its process; queueing it again", job_id)
            train_job.delay(job_id)
            requeued += 1
    batches = evaluations = 0
    for batch in RolloutBatch.objects.filter(status=JobStatus.RUNNING)[:100]:
        rollout_batch_refresh(batch)
        batches += 1
    for evaluation in Evaluation.objects.filter(status=JobStatus.RUNNING)[:100]:
        evaluation_refresh(evaluation)
        evaluations += 1
    return {"batches": batches, "evaluations": evaluations, "requeued_jobs": requeued, "at": int(time.time())}
