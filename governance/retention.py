"""Retention: after its data class's period, a finished task's content is deleted and its runs' audit
chains with it; a legal hold stops both. Every deletion is recorded in the global chain, so the record
still verifies: the seal of each deleted run chain stays, and a ChainPurge row says why it is empty."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit import signing
from audit.actions import Action
from audit.chain import canonical, run_chain
from audit.checkpoints import purge_body
from audit.models import AuditEvent, ChainHead, ChainPurge, LegalHold, PendingSeal
from audit.seals import seal_pending
from audit.services import Actor, event_record
from governance.holds import holds_active
from routing.models import Annotation, Attempt, Decision, Run, RunStatus, Step, Task
from routing.signals import task_purged

PURGED = "[deleted under the retention policy]"
BATCH = 100  # tasks per transaction: bounded lock time and memory


def due_tasks(now: datetime) -> list[Task]:
    due = []
    for classification, days in settings.RETENTION_DAYS.items():
        cutoff = now - timedelta(days=days)
        due += list(
            Task.objects.filter(
                classification=classification,
                finished_at__lt=cutoff,
                purged_at__isnull=True,
                status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED],
            )
            .exclude(pk__in=LegalHold.objects.filter(released_at__isnull=True).values("task_id"))
            .order_by("finished_at")[:BATCH]
        )
    return due


def kept_after_purge(task_id: Any) -> dict[str, list[list[Any]]]:
    """What a purge keeps of a task's runs: who was called, at what vendor, for what cost. The
    task.purged event records it and verification compares the rows with it (the run chains that
    bound these values are deleted with the content)."""
    return {
        "runs": [
            [r.pk, r.kind, r.status, str(r.cost_usd), r.input_tokens, r.output_tokens]
            for r in Run.objects.filter(task_id=task_id).order_by("pk")
        ],
        "steps": [
            [s.pk, s.run_id, s.worker_slug, s.vendor, s.status]
            for s in Step.objects.filter(run__task_id=task_id).order_by("pk")
        ],
        "attempts": [
            [a.pk, a.step_id, a.status, str(a.cost_usd), a.input_tokens, a.output_tokens]
            for a in Attempt.objects.filter(step__run__task_id=task_id).order_by("pk")
        ],
    }


def task_purge(*, task: Task, actor: Actor, now: datetime) -> None:
    # A chain is emptied only once its seal is in the global chain: its seal is what verification
    # checks the purge against. The sealer runs first, for any run that ended a moment ago.
    seal_pending()
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.purged_at is not None or holds_active(task.pk).exists():
            return
        runs = list(Run.objects.filter(task=task))
        if any(run.status not in (RunStatus.SUCCEEDED, RunStatus.FAILED) for run in runs):
            return  # a run still going: its chain is open
        names = [run_chain(run.correlation_id) for run in runs]
        if PendingSeal.objects.filter(chain__in=names, seal_event_id__isnull=True).exists():
            return  # a seal not yet in the global chain (another sealer holds it): the next purge
        chains = []
        for run in runs:
            name = run_chain(run.correlation_id)
            head = ChainHead.objects.filter(chain=name).first()
            if head is None or not head.sealed:
                continue
            # Signed by the checkpoint key, which the database does not hold: a purge row written by
            # hand (the trigger would let it delete a chain) does not verify.
            body = purge_body(
                chain_name=name, last_seq=head.seq, last_hash=head.hash, purged_at=now, reason="retention"
            )
            ChainPurge.objects.create(
                chain=name,
                last_seq=head.seq,
                last_hash=head.hash,
                purged_at=now,
                reason="retention",
                signature=signing.sign(canonical(body)),
                key_id=signing.key_id(),
            )
            deleted, _ = AuditEvent.objects.filter(chain=name).delete()
            chains.append({"chain": name, "events": deleted, "last_seq": head.seq, "last_hash": head.hash})
        Step.objects.filter(run__task=task).update(
            instruction=PURGED, messages_sent=None, response=PURGED, error=""
        )
        Decision.objects.filter(run__task=task).update(
            prompt=[], raw_output=PURGED, plan=None, alternatives=[]
        )
        Attempt.objects.filter(step__run__task=task).update(error="")
        Run.objects.filter(task=task).update(final_answer=PURGED, error="")
        # A plan given to a run (a playground's, a trainer's sample) holds the task's words too.
        Run.objects.filter(task=task).exclude(plan_override="").update(plan_override=PURGED)
        # Reviewers' comments may quote what they reviewed; their verdicts and labels stay.
        Annotation.objects.filter(run__task=task).exclude(comment="").update(comment=PURGED)
        Task.objects.filter(pk=task.pk).update(
            text=PURGED, reference=None, final_answer=PURGED, error="", purged_at=now
        )
        task_purged.send(sender=Task, task=task, now=now, actor=actor)  # copies of its words go too
        event_record(
            actor=actor,
            action=Action.TASK_PURGED,
            obj=task,
            task_id=task.pk,
            payload={
                "classification": task.classification,
                "finished_at": task.finished_at,
                "retention_days": settings.RETENTION_DAYS[task.classification],
                "chains": chains,
                "kept": kept_after_purge(task.pk),
            },
        )


def retention_purge(*, now: datetime | None = None) -> list[Task]:
    now = now or timezone.now()
    actor = Actor.service("retention")
    purged = []
    for task in due_tasks(now):
        task_purge(task=task, actor=actor, now=now)
        purged.append(task)
    return purged
