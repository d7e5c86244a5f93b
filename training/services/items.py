"""Items (a team's sets and the bundled replay data) and the tasks and offline runs that stand for them."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import transaction

from audit.actions import Action
from audit.services import Actor, event_record
from routing import replay
from routing.hashing import content_hash
from routing.models import Run, RunStatus, Task
from routing.services import run_enqueue

from ..itemsets.selectors import REPLAY_SET, Resolved, classification_of, resolve, split_ids, task_scorer
from ..itemsets.services import version_freeze
from ..models import ItemSetVersion
from .common import TRAINING_KEY_PREFIX


def replay_item_ids(split: str, limit: int | None = None, domain: str = "") -> list[str]:
    """Recorded items of a split, in a fixed shuffled order (domains mixed), optionally of one domain."""
    return split_ids(REPLAY_SET, split, limit, domain)


def replay_items(item_ids: list[str]) -> list[replay.ReplayItem]:
    return resolve(REPLAY_SET, item_ids).items


def _task_key(item: Any) -> str:
    """The idempotency key of an item's task: its id, and for a team's item a hash of what it holds
    (a later version with other words for the same key is another task)."""
    if isinstance(item, replay.ReplayItem):
        return f"{TRAINING_KEY_PREFIX}{item.id}"
    held = json.dumps([item.task, item.reference, item.scorer, item.domain, item.classification])
    return f"{TRAINING_KEY_PREFIX}{item.id}@{content_hash(held)[:16]}"


def item_task(item: Any, actor: Actor) -> Task:
    """The task that stands for an item (a recorded one, or a team's) in rollouts and evaluations (one
    per item): its text, reference, kind, scorer and data class, so that its policy holds."""
    task, created = Task.objects.get_or_create(
        idempotency_key=_task_key(item),
        source=Task.Source.TRAINING,
        defaults={
            "text": item.task,
            "reference": item.reference,
            "domain": item.domain,
            "scorer": task_scorer(getattr(item, "scorer", "auto")),
            "source_item": item.id,
            "classification": classification_of(item),
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


def offline_runs(runs: list[Run]) -> list[Run]:
    """Runs of a training kind (unsaved), inserted at once and queued when the transaction commits."""
    created = Run.objects.bulk_create(runs)
    ids = [run.pk for run in created]

    def enqueue() -> None:
        for run_id in ids:
            run_enqueue(run_id=run_id)

    transaction.on_commit(enqueue)
    return created


def version_in_use(resolved: Resolved, actor: Actor, *, why: str) -> ItemSetVersion | None:
    """The set's version the request read, frozen before anything uses it (None: the replay set)."""
    if resolved.version is None:
        return None
    return version_freeze(version=resolved.version, actor=actor, why=why)
