"""Rollouts: K sampled runs per item from a conductor version, as a batch; or a survey, in which every
worker the item's policy allows answers it once (what a learned policy learns its workflows from on a
team's own items, as the replay files record it for the benchmark)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django.db import transaction

from audit.actions import Action
from audit.services import Actor, event_record
from routing.engine.planning import screened_workers
from routing.estimates import call_cost
from routing.models import ConductorVersion, Run, RunStatus, Task

from .. import quotas
from ..itemsets.selectors import REPLAY_SET, Resolved, classification_of, resolve
from ..models import JobStatus, Rollout, RolloutBatch
from .common import (
    FINISHED_RUN,
    MAX_K,
    MAX_TEMPERATURE,
    SERVICE,
    TrainingError,
    check_or_refuse,
    queued_runs_guard,
    rollout_temperature,
    user_of,
)
from .items import item_task, offline_runs, version_in_use


def _temperature(version: ConductorVersion, temperature: float | None) -> float:
    """The temperature asked for, or the default for the version's kind of conductor."""
    return rollout_temperature(version.backend) if temperature is None else temperature


def _rollouts_checked(item_set: str, items: list[str], k: int, temperature: float) -> Resolved:
    if not 1 <= k <= MAX_K:
        raise TrainingError(f"K must be between 1 and {MAX_K}")
    if not 0 < temperature <= MAX_TEMPERATURE:
        raise TrainingError(f"the temperature must be above 0 and at most {MAX_TEMPERATURE:g}")
    check_or_refuse(quotas.rollout_runs_check, len(dict.fromkeys(items)), k)  # before reading the items
    return resolve(item_set, items)


def survey_plan(worker: str, text: str) -> str:
    """A survey's plan: one worker answers the task as it is."""
    return json.dumps(
        {
            "thought": f"survey: {worker} answers the item",
            "steps": [{"worker": worker, "instruction": text, "access": []}],
        }
    )


def rollouts_estimate(
    *,
    version: ConductorVersion,
    items: list[str],
    k: int,
    temperature: float | None = None,
    user: Any = None,
    item_set: str = REPLAY_SET,
    survey: bool = False,
) -> quotas.Estimate:
    """What rollouts_start would start (runs, estimated cost), checked as it checks; starts nothing."""
    temperature = _temperature(version, temperature)
    found = _rollouts_checked(item_set, items, 1 if survey else k, temperature).items
    if survey:
        return _survey_estimate(found, user)
    runs = len(found) * k
    check_or_refuse(quotas.queued_runs_check, user, runs)
    return quotas.estimate([(version, runs)])


def _survey_estimate(found: list[Any], user: Any) -> quotas.Estimate:
    """A survey's runs and cost: each allowed worker's call on each item's text (routing.estimates)."""
    total, runs = Decimal("0"), 0
    for item in found:
        task = Task(text=item.task, source_item=item.id, classification=classification_of(item))
        for worker in screened_workers(task)[0]:
            total += call_cost(worker, item.task).usd
            runs += 1
    check_or_refuse(quotas.queued_runs_check, user, runs)
    return quotas.Estimate(
        runs=runs, usd=total.quantize(quotas.USD_PLACES), basis="each worker's price for each item's text"
    )


def rollouts_start(
    *,
    version: ConductorVersion,
    items: list[str],
    k: int,
    temperature: float | None = None,
    actor: Actor,
    user: Any = None,
    item_set: str = REPLAY_SET,
    survey: bool = False,
    shown_usd: Decimal | None = None,
    max_usd: Decimal | None = None,
) -> RolloutBatch:
    """Sample K workflows per item of `item_set` from `version` at `temperature` (None: the default for
    its kind of conductor, rollout_temperature); each runs through the engine. `survey`: instead, each
    worker the item's policy allows answers it once (K is ignored). Refused (nothing written) above
    training.quotas' runs per request or the user's queued runs, when the estimate is not the
    `shown_usd` a preview showed, or above the budget `max_usd`."""
    temperature = _temperature(version, temperature)
    if shown_usd is not None or max_usd is not None:
        found_estimate = rollouts_estimate(
            version=version, items=items, k=k, temperature=temperature, item_set=item_set, survey=survey
        )
        check_or_refuse(quotas.estimate_check, found_estimate, shown_usd, max_usd)
    resolved = _rollouts_checked(item_set, items, 1 if survey else k, temperature)
    found = resolved.items
    with transaction.atomic():
        set_version = version_in_use(resolved, actor, why="rollouts")
        tasks = [(item, item_task(item, actor)) for item in found]
        samples = (
            _survey_samples(tasks)
            if survey
            else [(item, task, s, "") for item, task in tasks for s in range(k)]
        )
        if not samples:
            raise TrainingError("no worker may answer these items under their data policies")
        queued_runs_guard(user, len(samples))
        batch = RolloutBatch.objects.create(
            conductor_version=version,
            k=max((s + 1 for *_, s, _ in samples), default=0) if survey else k,
            temperature=temperature,
            items=[i.id for i in found],
            item_set=resolved.item_set,
            item_set_version=set_version,
            survey=survey,
            status=JobStatus.RUNNING,
            created_by=user_of(user),
        )
        runs = offline_runs(
            [
                Run(
                    task=task,
                    conductor_version=version,
                    kind=Run.Kind.ROLLOUT,
                    temperature=temperature,
                    plan_override=plan,
                )
                for _, task, _, plan in samples
            ]
        )
        Rollout.objects.bulk_create(
            [
                Rollout(batch=batch, task=task, run=run, item=item.id, sample=sample)
                for (item, task, sample, _), run in zip(samples, runs, strict=True)
            ]
        )
        event_record(
            actor=actor,
            action=Action.ROLLOUTS_STARTED,
            obj=batch,
            payload=_started_payload(batch, len(samples)),
        )
    return batch


def _started_payload(batch: RolloutBatch, runs: int) -> dict[str, Any]:
    """The rollouts.started event's payload: what was sampled from which set's frozen version."""
    set_version = batch.item_set_version
    return {
        "conductor": batch.conductor_version.name,
        "k": batch.k,
        "temperature": batch.temperature,
        "items": len(batch.items),
        "runs": runs,
        "item_set": batch.item_set,
        "item_set_version": set_version.number if set_version else None,
        "content_hash": set_version.content_hash if set_version else None,
        "survey": batch.survey,
    }


def _survey_samples(tasks: list[tuple[Any, Task]]) -> list[tuple[Any, Task, int, str]]:
    """Each item's task once per worker its policies allow (sample = the worker's place, by slug)."""
    samples = []
    for item, task in tasks:
        workers, _withheld = screened_workers(task)
        samples += [(item, task, n, survey_plan(w.slug, task.text)) for n, w in enumerate(workers)]
    return samples


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
