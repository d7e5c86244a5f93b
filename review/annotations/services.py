"""Review: reviewers (auditors, ML staff) mark a run's answer, or one step's, correct or wrong, with a
label and a comment; the queue lists the runs still waiting for a verdict.

The newest verdict on a run (not on one of its steps) is the run's human label. A training dataset may
take it as the correctness term of the reward in place of the scorer's (training.rewards.RewardConfig
`human_labels`): a label made in review feeds the conductor's next training round.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Case, Exists, FloatField, OuterRef, QuerySet, Subquery, Value, When
from django.db.models.lookups import Exact

from accounts.models import Role
from audit.actions import Action
from audit.services import Actor, event_record
from routing.errors import ServiceError
from routing.models import RUN_ENDED, Annotation, Run, Step, Task
from routing.selectors import final_worker

REVIEWERS = (Role.AUDITOR, Role.ML_STAFF)  # admins pass every role check
LABEL_MAX, COMMENT_MAX = 60, 4000
ID_MAX = 2**63 - 1  # a bigint's largest value: no step id is larger


class ReviewError(ServiceError):
    """A verdict that cannot be recorded as given (400)."""


class NoSuchRun(ReviewError):
    status = 404


@dataclass(frozen=True)
class Verdict:
    """What a reviewer says of a run, or of one of its steps (`step_id`)."""

    run_id: int
    verdict: str
    label: str = ""
    comment: str = ""
    step_id: int | None = None


def step_id(value: str | None) -> int | None:
    """The step a review form names: None when blank (the verdict is on the run's answer); refused
    (ReviewError) unless a step id, digits 0-9 from 1 to ID_MAX. Never dropped: a verdict meant for a
    step is not recorded on the whole run."""
    text = (value or "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(ID_MAX)) and 1 <= int(text) <= ID_MAX):
        shown = text if len(text) <= 40 else text[:40] + "\u2026"
        raise ReviewError(f"step {shown!r} is not a step id (a whole number from 1 to {ID_MAX})")
    return int(text)


def annotation_add(*, verdict: Verdict, user: Any) -> Annotation:
    """Record a reviewer's verdict, with its `annotation.added` event, in one transaction. Refused with
    the reason: a run that is not there or has not ended, a step of another run, a verdict other than
    correct or wrong, a label or comment over its limit, a purged task."""
    if verdict.verdict not in Annotation.Verdict.values:
        raise ReviewError(f"a verdict is correct or wrong, not {verdict.verdict!r}")
    label, comment = verdict.label.strip(), verdict.comment.strip()
    if len(label) > LABEL_MAX:
        raise ReviewError(f"a label has at most {LABEL_MAX} characters")
    if len(comment) > COMMENT_MAX:
        raise ReviewError(f"a comment has at most {COMMENT_MAX:,} characters")
    if "\x00" in label + comment:
        raise ReviewError("a label or comment cannot hold a NUL character")
    with transaction.atomic():
        run = Run.objects.filter(pk=verdict.run_id).first()
        if run is None:
            raise NoSuchRun(f"there is no run {verdict.run_id}")
        # Read under the task's lock: a purge (which takes it) cannot slip in between.
        task = Task.objects.select_for_update().get(pk=run.task_id)
        if run.status not in RUN_ENDED:
            raise ReviewError(f"run {run.pk} has not ended ({run.status}): review it once it has")
        if task.purged_at is not None:
            raise ReviewError("its content was deleted under the retention policy: nothing to review")
        step = None
        if verdict.step_id is not None:
            # An id out of a bigint's range matches no row (Django's lookups see to it): "no step".
            step = Step.objects.filter(pk=verdict.step_id, run=run).first()
            if step is None:
                raise ReviewError(f"run {run.pk} has no step {verdict.step_id}")
        actor = Actor.for_user(user)
        annotation = Annotation.objects.create(
            run=run,
            step=step,
            verdict=verdict.verdict,
            label=label,
            comment=comment,
            author=user if getattr(user, "is_authenticated", False) else None,
            author_name=actor.name,
        )
        event_record(
            actor=actor,
            action=Action.ANNOTATION_ADDED,
            obj=annotation,
            task_id=run.task_id,
            payload={
                "run_id": run.pk,
                "step_id": step.pk if step else None,
                "verdict": annotation.verdict,
                "label": annotation.label,
                # The comment is the reviewer's text; its hash binds it (as a task's text is bound).
                "comment_sha256": hashlib.sha256(annotation.comment.encode()).hexdigest(),
            },
        )
    return annotation


def human_verdict(**runs: Any) -> Subquery:
    """The newest verdict on the whole run selected by `runs` (lookups on Annotation), as an expression."""
    newest = Annotation.objects.filter(step__isnull=True, **runs).order_by("-id")
    return Subquery(newest.values("verdict")[:1])


def human_score(**runs: Any) -> Case:
    """The run's human label as a score (1.0 correct, 0.0 wrong; NULL where no verdict was given on the
    whole run), for a reward's correctness term in place of the scorer's."""
    verdict = human_verdict(**runs)
    return Case(
        When(Exact(verdict, Annotation.Verdict.CORRECT), then=Value(1.0)),
        When(Exact(verdict, Annotation.Verdict.WRONG), then=Value(0.0)),
        default=None,
        output_field=FloatField(),
    )


# --- the queue -------------------------------------------------------------------------------------

WAITING, REVIEWED, ALL = "waiting", "reviewed", "all"
SCORES = {"right": {"score__gte": 1}, "wrong": {"score__lt": 1}, "unscored": {"score__isnull": True}}


def review_queue(
    *, state: str = WAITING, worker: str = "", kind: str = "", score: str = "", verdict: str = ""
) -> QuerySet[Run]:
    """Ended runs, newest first, with their task, final worker and newest verdict: those waiting for a
    verdict (none on the whole run yet), those reviewed, or all; by final worker, kind and score."""
    reviewed = Exists(Annotation.objects.filter(run=OuterRef("pk"), step__isnull=True))
    runs = (
        Run.objects.filter(status__in=RUN_ENDED)
        .select_related("task", "conductor_version")
        .defer("task__search_vector", "task__final_answer")
        .annotate(
            reviewed=reviewed,
            verdict=human_verdict(run=OuterRef("pk")),
            final_worker=final_worker(run=OuterRef("pk")),
        )
    )
    if state == WAITING:
        runs = runs.filter(reviewed=False)
    elif state == REVIEWED:
        runs = runs.filter(reviewed=True)
    if worker:
        runs = runs.filter(final_worker=worker)
    if kind:
        runs = runs.filter(kind=kind)
    if score:
        runs = runs.filter(**SCORES[score])
    if verdict:
        runs = runs.filter(verdict=verdict)
    return runs


@dataclass(frozen=True)
class RunReview:
    """A run's verdicts, newest first, and which of them is its label (the newest on the whole run)."""

    annotations: list[Annotation]
    label_id: int | None


def annotations_of(task: Task) -> dict[int, RunReview]:
    """A task's verdicts by run."""
    by_run: dict[int, list[Annotation]] = {}
    for a in Annotation.objects.filter(run__task=task).select_related("step").order_by("-id"):
        by_run.setdefault(a.run_id, []).append(a)
    return {
        run_id: RunReview(notes, next((a.pk for a in notes if a.step_id is None), None))
        for run_id, notes in by_run.items()
    }
