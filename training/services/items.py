"""Recorded items (the replay data) and the tasks and offline runs that stand for them."""

from __future__ import annotations

import random
from typing import Any

from django.conf import settings
from django.db import transaction

from audit.actions import Action
from audit.services import Actor, event_record
from routing import replay
from routing.hashing import content_hash
from routing.models import ConductorVersion, DataClass, Run, RunStatus, Task
from routing.services import run_enqueue

from .common import MAX_ITEMS, TRAINING_KEY_PREFIX, TrainingError


def replay_item_ids(split: str, limit: int | None = None, domain: str = "") -> list[str]:
    """Recorded items of a split, in a fixed shuffled order (domains mixed), optionally of one domain."""
    try:
        items = replay.read_items(replay.split_path(split))
    except replay.ReplayDataError as exc:
        raise TrainingError(str(exc)) from exc
    ids = [item.id for item in items if not domain or item.domain == domain]
    if not ids:
        raise TrainingError(f"no items in the {split} split" + (" for this domain" if domain else ""))
    random.Random(0).shuffle(ids)
    return ids[:limit] if limit else ids


def replay_items(item_ids: list[str]) -> list[replay.ReplayItem]:
    if not item_ids:
        raise TrainingError("choose at least one item")
    if len(item_ids) > MAX_ITEMS:
        raise TrainingError(f"{len(item_ids)} items; at most {MAX_ITEMS} at once")
    found: list[replay.ReplayItem] = []
    missing: list[Any] = []
    for item_id in dict.fromkeys(item_ids):
        try:
            item = replay.find_item(item_id=item_id, texts=[])
        except replay.ReplayDataError as exc:
            raise TrainingError(str(exc)) from exc
        if item is not None and item.id == item_id:
            found.append(item)
        else:
            missing.append(item or item_id)
    if missing:
        raise TrainingError(f"unknown items: {', '.join(map(str, missing[:5]))}")
    return found


def item_task(item: replay.ReplayItem, actor: Actor) -> Task:
    """The task that stands for a recorded item in rollouts and evaluations (one per item)."""
    task, created = Task.objects.get_or_create(
        idempotency_key=f"{TRAINING_KEY_PREFIX}{item.id}",
        source=Task.Source.TRAINING,
        defaults={
            "text": item.task,
            "reference": item.reference,
            "domain": item.domain,
            "source_item": item.id,
            "classification": DataClass.PUBLIC,
            "max_steps": settings.CONDUCTOR_DEFAULT_MAX_STEPS,
            "max_depth": settings.CONDUCTOR_DEFAULT_MAX_DEPTH,
            "max_usd": settings.CONDUCTOR_DEFAULT_MAX_USD,
            "status": RunStatus.RUNNING,
        },
    )
    if created:
        event_record(
            actor=actor,
            action=Action.TASK_SUBMITTED,
            obj=task,
            task_id=task.id,
            payload={
                "source": Task.Source.TRAINING,
                "item": item.id,
                "classification": task.classification,
                "text_sha256": content_hash(task.text),
            },
        )
    else:
        Task.objects.filter(pk=task.pk).update(status=RunStatus.RUNNING, finished_at=None)
    return task


def offline_runs(specs: list[tuple[Task, ConductorVersion]], kind: str, **fields: Any) -> list[Run]:
    """Runs of a training kind, inserted at once and queued when the transaction commits."""
    runs = Run.objects.bulk_create(
        [Run(task=task, conductor_version=version, kind=kind, **fields) for task, version in specs]
    )
    ids = [run.pk for run in runs]

    def enqueue() -> None:
        for run_id in ids:
            run_enqueue(run_id=run_id)

    transaction.on_commit(enqueue)
    return runs
