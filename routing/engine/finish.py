"""Finishing a run: the final answer, its score (a scorer or the LLM judge), the totals, the seal of
its audit chain; or its failure, with every step left settled.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.actions import Action
from audit.rows import prepared_cursor
from audit.services import run_chain_seal

from ..hashing import content_hash
from ..models import (
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from ..scoring import scorers
from ..scoring.judge import judge
from ..signals import run_finished
from .record import fenced_write, record_event, task_ended

log = logging.getLogger(__name__)


def finish_run(run: Run, *, last: Step) -> None:
    """The run succeeded: its answer is its plan's last step's response."""
    final = last.response
    task = run.task
    score: float | None = None
    extracted = ""
    judged = None
    if task.reference is not None and task.reference != "" and task.scorer == scorers.JUDGE:
        judged = judge(
            task_text=task.text, reference=task.reference, response=final, classification=task.classification
        )
        score, extracted = judged.score, judged.answer
    elif task.reference is not None and task.reference != "":
        score, extracted = scorers.score(
            response=final, reference=task.reference, scorer=task.scorer, domain=task.domain
        )
    now = timezone.now()
    with fenced_write(
        run,
        cost=judged.cost_usd if judged else Decimal(0),
        input_tokens=judged.input_tokens if judged else 0,
        output_tokens=judged.output_tokens if judged else 0,
        sets={  # the run's end, in the fence's own statement
            "status": RunStatus.SUCCEEDED,
            "final_answer": final,
            "score": score,
            "finished_at": now,
            "heartbeat_at": now,
            "stop_reason": "",
        },
    ) as fenced:
        if judged is not None:
            record_event(run, Action.SCORE_JUDGED, run, judged.audit_payload())
        ended: dict[str, object] = {}
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            ended = {
                "status": RunStatus.SUCCEEDED,
                "final_answer": final,
                "score": score,
                "finished_at": now,
                "error": "",
            }
        task_ended(task.pk, ended)
        _settle_steps(run, now, reason="the run finished without it")
        totals = {
            "cost_usd": fenced.spent,
            "input_tokens": fenced.input_tokens,
            "output_tokens": fenced.output_tokens,
        }
        last_event = record_event(
            run,
            Action.RUN_SUCCEEDED,
            run,
            {
                "final_step_id": last.pk,
                "final_answer_sha256": content_hash(final),
                "score": score,
                "extracted_answer": extracted,
                "scorer": scorers.scorer_name(task.scorer, task.domain) if score is not None else None,
                **totals,
            },
            seal=True,
        )
        run_chain_seal(run=run, task_id=task.pk, last=last_event)
        run_finished.send(sender=Run, run=run, now=now)


def fail_run(run: Run, message: str, stop_reason: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        _settle_steps(run, now, reason=f"the run stopped ({stop_reason}): {message}")
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.FAILED, error=message, stop_reason=stop_reason, finished_at=now, heartbeat_at=now
        )
        ended: dict[str, object] = {}
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            ended = {"status": RunStatus.FAILED, "error": message, "finished_at": now}
        task_ended(run.task_id, ended)
        last_event = record_event(
            run,
            Action.RUN_FAILED,
            run,
            {"error": message, "stop_reason": stop_reason},
            seal=True,
        )
        run_chain_seal(run=run, task_id=run.task_id, last=last_event)
        run_finished.send(sender=Run, run=run, now=now)


def _settle_steps(run: Run, now: Any, *, reason: str) -> None:
    """Every step of an ending run, nested levels included, ends in a terminal state with the reason.

    Call inside the transaction that ends the run, before its chain is sealed. A step that never
    started is skipped; one left running (an unexpected error stopped the run mid-step) failed. Each
    change is an engine event, like any other change of a step's state.
    """
    with prepared_cursor() as cursor:  # mostly none: a prepared look before the ORM's query
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM routing_step WHERE run_id = %s AND status IN (%s, %s))",
            [run.pk, StepStatus.PENDING, StepStatus.RUNNING],
        )
        if not cursor.fetchone()[0]:
            return
    unsettled = list(
        Step.objects.select_for_update(of=("self",))
        .filter(run=run, status__in=[StepStatus.PENDING, StepStatus.RUNNING])
        .order_by("depth", "decision_id", "index")
    )
    for step in unsettled:
        if step.status == StepStatus.PENDING:
            step.status = StepStatus.SKIPPED
            step.note = f"not run: {reason}"
            action = Action.STEP_SKIPPED
        else:
            step.status = StepStatus.FAILED
            step.error = f"interrupted: {reason}"
            action = Action.STEP_FAILED
        step.finished_at = now
        step.save(update_fields=["status", "note", "error", "finished_at"])
        record_event(
            run,
            action,
            step,
            {
                "index": step.index,
                "depth": step.depth,
                "worker": step.worker_slug,
                "error": step.error if action == Action.STEP_FAILED else "",
                "note": step.note if action == Action.STEP_SKIPPED else "",
                "settled_with_run": True,
            },
        )
