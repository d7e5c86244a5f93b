"""A run succeeds: its final answer, its score (a scorer or the LLM judge), its totals, the task's
row, its chain sealed (its seal pending for the sealer, audit.seals). One change (`run_succeeded`),
applied with its last step's success where that was held for it (one write for both), else after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.actions import Action

from ..hashing import content_hash
from ..models import Run, RunStatus
from ..models.transitions import Change as By
from ..models.transitions import check_move
from ..scoring import scorers
from ..scoring.judge import judge
from ..signals import written_at_end
from .changes import Build, Change, Cost, Event, Expect, RunEnd, then
from .events import announce_end
from .execution import Assumed, RunExecution
from .executor import apply
from .run_failure import settled_with_run
from .schedule import Scheduled

log = logging.getLogger(__name__)


def holds_last_step(run: Run) -> bool:
    """Whether the run's end is recorded with its last step's success, in one change: unless the judge
    scores it (its call goes out after the last step's success is recorded)."""
    return not _judged(run.task)


def finish_run(execution: RunExecution, scheduled: Scheduled) -> None:
    """The run succeeded: its answer is its plan's last step's response (with its success, when the
    schedule held it for this change)."""
    run = execution.run
    held = scheduled.held
    final = held.completion.text if held is not None else scheduled.step.response
    end = _End.of(run, final)
    last = scheduled.step
    build: Build
    if held is None:
        build = partial(run_succeeded, execution, end, last.pk, None)
    else:
        build = then(
            held.change, lambda assumed, done: run_succeeded(execution, end, last.pk, last.pk, assumed)
        )
    if written_at_end(run.kind):  # the receivers of run_finished write in the same transaction
        with transaction.atomic():
            apply(execution, build)
            announce_end(run, end.now)
        return
    apply(execution, build)
    announce_end(run, end.now)  # heard after the commit: a receiver that fails now is logged


def _scored(task: Any) -> bool:
    """Whether the task's answer is scored: it has a reference."""
    return task.reference is not None and task.reference != ""


def _judged(task: Any) -> bool:
    """Whether the task's answer is scored by the LLM judge (a call of its own)."""
    return _scored(task) and task.scorer == scorers.JUDGE


@dataclass(frozen=True)
class _End:
    """A run's successful end: its answer, score, what the judge cost (`cost`), the run's columns
    (`sets`) and, for the task's own run, the task's (`ended`)."""

    run: Run
    final: str
    score: float | None
    extracted: str
    judged: Any
    now: Any
    cost: Cost
    sets: dict[str, Any]
    ended: dict[str, Any]

    @classmethod
    def of(cls, run: Run, final: str) -> _End:
        """The end of a run whose answer is `final`, scored (by the judge: a call)."""
        task = run.task
        score: float | None = None
        extracted = ""
        judged = None
        if _judged(task):
            judged = judge(
                task_text=task.text,
                reference=task.reference or "",  # _judged: there is one
                response=final,
                classification=task.classification,
            )
            score, extracted = judged.score, judged.answer
        elif _scored(task):
            score, extracted = scorers.score(
                response=final, reference=task.reference or "", scorer=task.scorer, domain=task.domain
            )
        now = timezone.now()
        cost = Cost(
            judged.cost_usd if judged else Decimal(0),
            judged.input_tokens if judged else 0,
            judged.output_tokens if judged else 0,
        )
        sets = {  # the run's end
            "status": RunStatus.SUCCEEDED,
            "final_answer": final,
            "score": score,
            "finished_at": now,
            "heartbeat_at": now,
            "stop_reason": "",
        }
        ended: dict[str, Any] = {}
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            ended = {
                "status": RunStatus.SUCCEEDED,
                "final_answer": final,
                "score": score,
                "finished_at": now,
                "error": "",
            }
        return cls(run, final, score, extracted, judged, now, cost, sets, ended)


def run_succeeded(
    execution: RunExecution, end: _End, last_step_id: int, settling: int | None, assumed: Assumed
) -> Change:
    """The run's end: its row (answer, score, status) and totals (the judge's cost added), its task's
    row, any step still unsettled settled with it (under the run's lock; a compiled end expects none
    but `settling`, the last step whose success it is applied with), the judge's event, and its last
    event, which seals its chain."""
    run = execution.run
    check_move(Run, run.status, RunStatus.SUCCEEDED, By.RUN_SUCCEEDED)
    if end.ended:
        check_move(type(run.task), run.task.status, RunStatus.SUCCEEDED, By.RUN_SUCCEEDED)
    cost = end.cost
    totals = assumed.plus(cost.usd, cost.input_tokens, cost.output_tokens).totals()
    events = []
    if end.judged is not None:
        events.append(Event(Action.SCORE_JUDGED, run, end.judged.audit_payload()))
    events.append(Event(Action.RUN_SUCCEEDED, run, succeeded_payload(run, end, last_step_id, totals)))
    settled = settled_with_run(
        execution, assumed, end.now, reason="the run finished without it", by=By.RUN_SUCCEEDED, but=settling
    )
    return settled + Change(
        by=(By.RUN_SUCCEEDED,),
        events=tuple(events),
        cost=cost,
        run=end.sets,
        expect=Expect(settled=True, settled_but=settling),
        ends=RunEnd(task=end.ended, now=end.now),
    )


def succeeded_payload(run: Run, end: _End, last_step_id: int, totals: dict[str, Any]) -> dict[str, Any]:
    """The payload of run.succeeded."""
    task = run.task
    return {
        "final_step_id": last_step_id,
        "final_answer_sha256": content_hash(end.final),
        "score": end.score,
        "extracted_answer": end.extracted,
        "scorer": scorers.scorer_name(task.scorer, task.domain) if end.score is not None else None,
        **totals,
    }
