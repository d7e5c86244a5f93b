"""Finishing a run: the final answer, its score (a scorer or the LLM judge), the totals, the seal of
its audit chain; or its failure, with every step left settled.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import chain as audit_chain
from audit import rows
from audit.actions import Action
from audit.models import GLOBAL_CHAIN, ChainHead
from audit.services import run_chain_seal, run_chain_seal_fields

from .. import rollups
from ..hashing import content_hash
from ..models import (
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from ..scoring import scorers
from ..scoring.judge import judge
from ..signals import run_finished, written_at_end
from .calls import Call, Sent, Success
from .record import (
    Fence,
    Guard,
    Updates,
    Writes,
    announce,
    claim_current,
    engine_event_fields,
    fenced,
    guard_sql,
    guessed,
    record_event,
    task_ended,
    task_ended_document,
    task_ended_sql,
    update_ctes,
)

log = logging.getLogger(__name__)


def finish_run(run: Run, *, last: Step) -> None:
    """The run succeeded: its answer is its plan's last step's response. Its end is one statement when
    the run is as this process last read it (`_end_at_once`), else a fenced transaction of several."""
    end = _End.of(run, last.response)
    # Nothing written for this kind of run at its end but the end itself: one statement, its own
    # transaction, and run_finished's receivers after its commit (the run has ended: a receiver that
    # fails now is logged, not taken for the run's failure).
    alone = not written_at_end(run.kind)
    if alone and _end_at_once(run, end, last=last):
        _ended_alone(run, end.now)
        return
    with transaction.atomic():  # the receivers of run_finished write in it too
        if alone or not _end_at_once(run, end, last=last):
            with fenced(
                run,
                cost=end.cost.usd,
                input_tokens=end.cost.input_tokens,
                output_tokens=end.cost.output_tokens,
                sets=end.sets,
            ) as fence_read:
                *before, (action, obj, payload) = end.events(last, fence_read.totals())
                for each in before:
                    record_event(run, *each)
                task_ended(run.task_id, end.ended)
                _settle_steps(run, end.now, reason="the run finished without it")
                last_event = record_event(run, action, obj, payload, seal=True)
                run_chain_seal(run=run, task_id=run.task_id, last=last_event)
                rollups.run_waits(run.pk)
        run_finished.send(sender=Run, run=run, now=end.now)


class EndWithLastStep:
    """`execute_plan`'s `ending` for a run's own plan: its last step's success and the run's end, in
    one statement (`_end_at_once`, the success staged first) where both can be: a run whose end nothing
    else writes (routing.signals.written_at_end), not scored by the judge (its call goes out after the
    last step's success is recorded), on the run as this process last read it, and with the global
    chain's head there for its seal (the claim of a first delivery looked: a database's first end makes
    it, in a fenced transaction). False, with nothing written, otherwise: the step's success is then
    recorded on its own, and the run ended after it (finish_run). `ended`: it did end the run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.ended = False

    def __call__(self, call: Call, sent: Sent) -> bool:
        run = self.run
        if written_at_end(run.kind) or _judged(run.task) or not getattr(run, "global_head", False):
            return False
        success = Success.of(call, sent)
        end = _End.of(run, success.completion.text)
        if not _end_at_once(run, end, last=call.step, success=success):
            return False
        self.ended = True
        _ended_alone(run, end.now)
        return True


def _ended_alone(run: Run, now: Any) -> None:
    """After a run's end that stood alone committed: run_finished's receivers (none of which writes for
    this kind of run); one that fails is logged, not taken for the run's failure (it has ended)."""
    for receiver, outcome in run_finished.send_robust(sender=Run, run=run, now=now):
        if isinstance(outcome, Exception):
            log.error(
                "run %s ended; a receiver of run_finished failed after it: %r",
                run.pk,
                receiver,
                exc_info=outcome,
            )


def _scored(task: Any) -> bool:
    """Whether the task's answer is scored: it has a reference."""
    return task.reference is not None and task.reference != ""


def _judged(task: Any) -> bool:
    """Whether the task's answer is scored by the LLM judge (a call of its own)."""
    return _scored(task) and task.scorer == scorers.JUDGE


@dataclass(frozen=True)
class Cost:
    """What the run's end adds to its totals (the judge's call)."""

    usd: Decimal
    input_tokens: int
    output_tokens: int


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

    def events(self, last: Step, totals: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
        """The events of the run's end, given its final totals: the last seals the run's chain."""
        run, task = self.run, self.run.task
        staged: list[tuple[str, Any, dict[str, Any]]] = []
        if self.judged is not None:
            staged.append((Action.SCORE_JUDGED, run, self.judged.audit_payload()))
        scorer = scorers.scorer_name(task.scorer, task.domain) if self.score is not None else None
        payload = {
            "final_step_id": last.pk,
            "final_answer_sha256": content_hash(self.final),
            "score": self.score,
            "extracted_answer": self.extracted,
            "scorer": scorer,
            **totals,
        }
        staged.append((Action.RUN_SUCCEEDED, run, payload))
        return staged


def _end_at_once(run: Run, end: _End, *, last: Step, success: Success | None = None) -> bool:
    """The run's end in one statement, on the run as this process last read it under its lock (its
    claim, totals and stamps, its chain's head: `Guard`, as `write_once`), with every step settled: the
    run's columns and totals (`end.sets`, its cost added), the task's (`end.ended` and its totals),
    the events (the last sealing the run's chain), the seal in the global chain (on its head as the
    server finds it: audit.chain.on_server_text) and the row that leaves the run waiting for a fold.
    `success`: the last step's success (its attempt, the step and its event, its cost), written first
    in the same statement, the step the one left unsettled. False, with nothing written, when any of it
    does not hold, or when the task's row it locked is not the version it began with (the caller then
    ends the run in a fenced transaction)."""
    claim_current(run)
    known: Fence | None = getattr(run, "_known", None)
    if known is None:
        return False
    cost = end.cost
    before = Writes(run)
    if success is not None:
        success.stage(before)
        cost = Cost(
            cost.usd + success.cost,
            cost.input_tokens + success.completion.input_tokens,
            cost.output_tokens + success.completion.output_tokens,
        )
    guess = guessed(known, cost.usd, cost.input_tokens, cost.output_tokens)
    totals = guess.totals()
    chain = audit_chain.run_chain(run.correlation_id)
    fields = engine_event_fields(run, [*before.events, *end.events(last, totals)])
    planned = audit_chain.plan(chain, fields)
    if planned is None:
        return False
    sealed, global_params = audit_chain.on_server_params(
        GLOBAL_CHAIN, run_chain_seal_fields(run=run, task_id=run.task_id, last=planned.events[-1])
    )
    values = {**end.sets, **totals}
    run_fields = [Run._meta.get_field(name) for name in values]
    params = [
        *Guard(known, settling=None if success is None else success.step.pk).params(run),
        run.task_id,
        *audit_chain.append_params(planned),
        *global_params,
    ]
    updates = before.updated(params)
    params += [
        rows.document(zip(run_fields, values.values(), strict=True)),  # type: ignore[arg-type]
        run.pk,
        guess.spent,
        guess.input_tokens,
        guess.output_tokens,
        run.pk,
        task_ended_document(end.ended),
        run.task_id,
        run.pk,
    ]
    sql = _end_sql(len(planned.events), tuple(values), tuple(end.ended), updates)
    with rows.prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if not row[0]:
        # The run, its task's row and the global chain were as assumed: its chain's head had moved. (Else
        # the head was right: the run's end goes on in a fenced transaction, which reads it under its lock.)
        if row[-1]:
            audit_chain.forget(chain)
        return False
    sealed.pk, sealed.seq, sealed.hash, sealed.prev_hash = row[1 + len(planned.events) : -1]
    if sealed.pk is None:  # pragma: no cover - `h` moves only where the global chain has a head to move
        raise RuntimeError(f"run {run.pk}: its seal was not appended to the global chain")
    audit_chain.appended(planned, list(row[1 : 1 + len(planned.events)]), sealed=True)
    audit_chain.guess(GLOBAL_CHAIN, sealed.seq, sealed.hash)  # for this process's next append to it
    run._known = guess  # type: ignore[attr-defined]
    announce(run, *planned.events)
    rollups.fold_after_commit()
    return True


@functools.lru_cache(maxsize=16)
def _end_sql(events: int, run_columns: tuple[str, ...], ended: tuple[str, ...], before: Updates = ()) -> str:
    """The text of `_end_at_once`'s statement for this many events, these columns of the run set and
    these of the task, and these updates before (the last step's success: names only, made once per
    shape). Everything is written only if `h` moved the run chain's head, which it does only if `f`
    (the guard, with every step settled but the one `before` settles) holds, `ft` locked the task's
    row, and the global chain has a head (so `g` moves it too)."""
    has_global = (
        f" AND EXISTS (SELECT 1 FROM {ChainHead._meta.db_table} gh "  # noqa: S608 - names and a constant
        f"WHERE gh.chain = '{GLOBAL_CHAIN}' AND NOT gh.sealed)"
    )
    ctes = [guard_sql(False, settled=True, settling=bool(before))]
    # The task's row is locked next, before the global chain's head: every end of a run (fail_run's
    # and the fenced one's too) locks its run, then its task, then the global head (a run's own chain
    # is its alone), so two runs of a task ending at once wait for each other, never deadlock.
    # The task's totals are summed over its runs as this statement found them when it began: if the
    # row it locked is not the version it began with (another run of the task ended meanwhile, its
    # cost perhaps added at its end), nothing is written and the fenced end locks the row in a
    # statement of its own (record.task_ended) and sums the runs again in statements that begin after
    # that end.
    ctes.append(
        "ft AS (SELECT id, xmin FROM routing_task WHERE id = %s AND EXISTS (SELECT 1 FROM f) FOR UPDATE)"
    )
    unmoved = " AND EXISTS (SELECT 1 FROM ft JOIN routing_task s ON s.id = ft.id AND s.xmin = ft.xmin)"
    ctes += audit_chain.append_text(events, guard=f"{unmoved}{has_global}", seal=True)
    gate = " AND EXISTS (SELECT 1 FROM h)"
    ctes.append(audit_chain.on_server_text(guard=gate))
    ctes += update_ctes(before, gate, name="s")
    columns = [rows.quoted(Run._meta.get_field(name).column) for name in run_columns]  # type: ignore[union-attr]
    ctes.append(
        f"u AS (UPDATE routing_run SET {', '.join(f'{c} = r.{c}' for c in columns)} "  # noqa: S608 - names, not data
        f"FROM {rows.populated(Run)} AS r WHERE routing_run.id = %s{gate})"
    )
    ctes.append(f"t AS ({task_ended_sql(ended, run_totals=True, gate=gate)})")
    ctes.append(f"p AS ({rollups.WAITS.format(gate=gate)})")
    answers = ["(SELECT count(*) FROM h)"]
    answers += [f"(SELECT id FROM e{i})" for i in range(events)]  # noqa: S608
    answers += [
        "(SELECT id FROM ge)",
        "(SELECT seq FROM g)",
        "(SELECT hash FROM g)",
        "(SELECT prev_hash FROM g)",
    ]
    # Last: whether all but the run chain's head was as assumed (then it had moved, if nothing was written).
    answers.append(f"(SELECT count(*) FROM f WHERE true{unmoved}{has_global})")  # noqa: S608 - names
    return f"WITH {', '.join(ctes)} SELECT {', '.join(answers)}"  # noqa: S608 - names, not data


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
        rollups.run_waits(run.pk)
        run_finished.send(sender=Run, run=run, now=now)


def _settle_steps(run: Run, now: Any, *, reason: str) -> None:
    """Every step of an ending run, nested levels included, ends in a terminal state with the reason.

    Call inside the transaction that ends the run, before its chain is sealed. A step that never
    started is skipped; one left running (an unexpected error stopped the run mid-step) failed. Each
    change is an engine event, like any other change of a step's state.
    """
    with rows.prepared_cursor() as cursor:  # mostly none: a prepared look before the ORM's query
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
