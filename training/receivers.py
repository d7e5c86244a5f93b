"""Training's answers to what routing announces (routing.signals)."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists
from django.dispatch import receiver

from routing.models import Run, RunStatus, Task
from routing.signals import run_finished, task_purged, writes_at_end

from .itemsets.services import task_items_purge
from .models import Evaluation, EvaluationRun, Rollout, RolloutBatch
from .services import evaluation_refresh, rollout_batch_refresh

# The runs of training's items (rollouts, evaluations) end in one transaction with what settles them.
ITEM_RUNS = (Run.Kind.ROLLOUT, Run.Kind.EVALUATION)
writes_at_end(*ITEM_RUNS)


@receiver(run_finished, sender=Run, dispatch_uid="training.settle_item_task")
def settle_item_task(sender: Any, *, run: Run, now: Any, **kwargs: Any) -> None:
    """A training item's task (rollouts, evaluations; no live run) is done when its last run ends.
    Inside the transaction that ends the run."""
    if run.kind not in ITEM_RUNS:
        return
    # The task row is locked first: two runs ending at once each see the other finished, in turn.
    Task.objects.select_for_update().filter(pk=run.task_id).values_list("pk", flat=True).first()
    unfinished = Run.objects.filter(task_id=run.task_id).exclude(
        status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]
    )
    Task.objects.filter(pk=run.task_id, source=Task.Source.TRAINING).exclude(Exists(unfinished)).update(
        status=RunStatus.SUCCEEDED, finished_at=now
    )


@receiver(run_finished, sender=Run, dispatch_uid="training.settle_batch_or_evaluation")
def settle_batch_or_evaluation(sender: Any, *, run: Run, now: Any, **kwargs: Any) -> None:
    """A rollout batch or an evaluation finishes (audited) when its last run ends, in that run's
    transaction: no page has to write to show it finished."""

    # The batch's (evaluation's) row is locked before its runs are counted: two of its runs ending at
    # once each see the other finished, in turn, so the later one settles it.
    finished = [RunStatus.SUCCEEDED, RunStatus.FAILED]
    if run.kind == Run.Kind.ROLLOUT:
        batch_id = Rollout.objects.filter(run=run).values_list("batch_id", flat=True).first()
        batch = RolloutBatch.objects.select_for_update().filter(pk=batch_id).first() if batch_id else None
        if batch and not Run.objects.filter(rollout__batch=batch).exclude(status__in=finished).exists():
            rollout_batch_refresh(batch)
    elif run.kind == Run.Kind.EVALUATION:
        evaluation_id = EvaluationRun.objects.filter(run=run).values_list("evaluation_id", flat=True).first()
        evaluation = (
            Evaluation.objects.select_for_update().filter(pk=evaluation_id).first() if evaluation_id else None
        )
        unfinished = Run.objects.filter(evaluation_run__evaluation=evaluation).exclude(status__in=finished)
        if evaluation and not unfinished.exists():
            evaluation_refresh(evaluation)


@receiver(task_purged, sender=Task, dispatch_uid="training.purge_set_items")
def purge_set_items(sender: Any, *, task: Task, now: Any, actor: Any, **kwargs: Any) -> None:
    """The items made from a purged task lose its words in the purge's transaction."""
    task_items_purge(task=task, now=now, actor=actor)
