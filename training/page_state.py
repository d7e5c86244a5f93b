"""What the training pages say of a job's or an evaluation's state: the sentence at the top of the page
(it follows the status, as the pages re-read it) and what is true of a job's candidate version."""

from __future__ import annotations

from typing import Any

from .models import Evaluation, JobStatus, TrainingJob


def job_banner(job: TrainingJob) -> str:
    """The sentence at the top of a job's page: what the job is doing now (it follows the status)."""
    name = f"Training job {job.name}"
    if job.status == JobStatus.QUEUED:
        return f"{name} is queued: it starts when a training worker takes it."
    if job.status == JobStatus.RUNNING:
        if job.phase:
            return f"{name} is running, past its last step: {job.phase}."
        return f"{name} is running: step {job.step} of {job.total_steps or '?'}."
    if job.status == JobStatus.SUCCEEDED:
        return f"{name} succeeded." + (f" Candidate: {job.candidate.name}." if job.candidate_id else "")
    if job.status == JobStatus.FAILED:
        return f"{name} failed: the reason is below."
    return f"{name} was cancelled."


def evaluation_banner(evaluation: Evaluation, sides: list[dict[str, Any]]) -> str:
    """The sentence at the top of an evaluation's page: what it is doing now (it follows the status)."""
    name = f"Evaluation #{evaluation.pk}"
    if evaluation.status == JobStatus.QUEUED:
        return f"{name} is queued: its runs start when a worker takes it."
    if evaluation.status == JobStatus.RUNNING:
        done = sum(row.get("n") or 0 for row in sides)
        total = sum(row.get("total") or 0 for row in sides)
        if total and done >= total:
            return f"{name} is running, past its last item: every run has ended; recording the results."
        return f"{name} is running: {done} of {total or '?'} runs done."
    if evaluation.status == JobStatus.SUCCEEDED:
        return f"{name} finished: every run has ended and the figures below are final."
    return f"{name} {evaluation.get_status_display().lower()}."


def candidate_note(job: TrainingJob) -> str:
    """What is true of the job's candidate version while there is none to link to."""
    if job.candidate_id:
        return ""
    if job.status == JobStatus.CANCELLED:
        return "none: the job was cancelled, nothing was registered"
    if job.status == JobStatus.FAILED:
        return "none: the job failed, nothing was registered"
    if job.status == JobStatus.SUCCEEDED:
        return "none: no version was registered"
    if job.cancel_requested:
        return "cancellation requested: nothing is registered unless the job succeeds first"
    return f"{job.name} is registered when the job succeeds"
