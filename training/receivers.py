"""Training's answers to what routing announces (routing.signals)."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists
from django.dispatch import receiver

from routing.models import Run, RunStatus, Task
from routing.signals import run_finished


@receiver(run_finished, sender=Run, dispatch_uid="training.settle_item_task")
def settle_item_task(sender: Any, *, run: Run, now: Any, **kwargs: Any) -> None:
    """A training item's task (rollouts, evaluations; no live run) is done when its last run ends.
    Inside the transaction that ends the run."""
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY, Run.Kind.SHADOW):
        return
    # The task row is locked first: two runs ending at once each see the other finished, in turn.
    Task.objects.select_for_update().filter(pk=run.task_id).values_list("pk", flat=True).first()
    unfinished = Run.objects.filter(task_id=run.task_id).exclude(
        status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]
    )
    Task.objects.filter(pk=run.task_id, source=Task.Source.TRAINING).exclude(Exists(unfinished)).update(
        status=RunStatus.SUCCEEDED, finished_at=now
    )
