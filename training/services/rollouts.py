"""Rollouts: K sampled runs per item from a conductor version, as a batch."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.actions import Action
from audit.services import Actor, event_record
from routing import replay
from routing.models import ConductorVersion, Run, RunStatus

from .. import limits
from ..models import JobStatus, Rollout, RolloutBatch
from .common import (
    FINISHED_RUN,
    MAX_K,
    MAX_TEMPERATURE,
    SERVICE,
    TrainingError,
    check_or_refuse,
    queued_runs_guard,
    user_of,
)
from .items import item_task, offline_runs, replay_items


def _rollouts_checked(items: list[str], k: int, temperature: float) -> list[replay.ReplayItem]:
    if not 1 <= k <= MAX_K:
        raise TrainingError(f"K must be between 1 and {MAX_K}")
    if not 0 < temperature <= MAX_TEMPERATURE:
        raise TrainingError(f"the temperature must be above 0 and at most {MAX_TEMPERATURE:g}")
    check_or_refuse(limits.rollout_runs_check, len(dict.fromkeys(items)), k)  # before reading the items
    return replay_items(items)


def rollouts_estimate(
    *, version: ConductorVersion, items: list[str], k: int, temperature: float, user: Any = None
) -> limits.Estimate:
    """What rollouts_start would start (runs, estimated cost), checked as it checks; starts nothing."""
    runs = len(_rollouts_checked(items, k, temperature)) * k
    check_or_refuse(limits.queued_runs_check, user, runs)
    return limits.estimate([(version, runs)])


def rollouts_start(
    *, version: ConductorVersion, items: list[str], k: int, temperature: float, actor: Actor, user: Any = None
) -> RolloutBatch:
    """Sample K workflows per item from `version` at `temperature`; each runs through the engine.
    Refused (nothing written) above training.limits' runs per request or the user's queued runs."""
    found = _rollouts_checked(items, k, temperature)
    with transaction.atomic():
        queued_runs_guard(user, len(found) * k)
        batch = RolloutBatch.objects.create(
            conductor_version=version,
            k=k,
            temperature=temperature,
            items=[i.id for i in found],
            status=JobStatus.RUNNING,
            created_by=user_of(user),
        )
        tasks = [(item, item_task(item, actor)) for item in found]
        runs = iter(
            offline_runs(
                [(task, version) for _, task in tasks for _ in range(k)],
                Run.Kind.ROLLOUT,
                temperature=temperature,
            )
        )
        Rollout.objects.bulk_create(
            [
                Rollout(batch=batch, task=task, run=next(runs), item=item.id, sample=sample)
                for item, task in tasks
                for sample in range(k)
            ]
        )
        event_record(
            actor=actor,
            action=Action.ROLLOUTS_STARTED,
            obj=batch,
            payload={
                "conductor": version.name,
                "k": k,
                "temperature": temperature,
                "items": len(found),
                "runs": len(found) * k,
            },
        )
    return batch


def rollout_batch_counts(batch: RolloutBatch) -> dict[str, int]:
    """Counts of the batch's runs (reads only: what pages and the API show)."""
    runs = Run.objects.filter(rollout__batch=batch)
    return {
        "runs": runs.count(),
        "finished": runs.filter(status__in=FINISHED_RUN).count(),
        "failed": runs.filter(status=RunStatus.FAILED).count(),
    }


def rollout_batch_refresh(batch: RolloutBatch) -> dict[str, int]:
    """Counts of the batch's runs; marks the batch finished (audited) once every run has ended. Called
    when a batch's last run ends (training.receivers) and by beat's settle, never by a page."""
    counts = rollout_batch_counts(batch)
    if batch.status == JobStatus.RUNNING and counts["finished"] == counts["runs"]:
        with transaction.atomic():
            updated = RolloutBatch.objects.filter(pk=batch.pk, status=JobStatus.RUNNING).update(
                status=JobStatus.SUCCEEDED
            )
            if updated:
                event_record(
                    actor=SERVICE,
                    action=Action.ROLLOUTS_FINISHED,
                    obj=batch,
                    payload=counts,
                )
        batch.status = JobStatus.SUCCEEDED
    return counts
