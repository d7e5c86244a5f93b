"""A run succeeds: its final answer, its score (a scorer or the LLM judge), its totals, the task's
row, and the seal of its audit chain into the global chain.

Two ways to end, one interface (`finish_run`): on the run as this process last read it, in one
statement (`_end_at_once`, the fast path, which may also carry the last step's success); else in a
fenced transaction of several statements (the plain path). Both leave the same rows;
run_finished's receivers hear of either as events.announce_end says.
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
from ..models import Run, RunStatus, Step
from ..scoring import scorers
from ..scoring.judge import judge
from ..signals import written_at_end
from .calls import Call, Sent
from .events import announce, announce_end, engine_event_fields
from .execution import RunExecution
from .fence import fenced, one_statement_writes, record_event
from .run_failure import settle_steps
from .statement import RUN_AS_ASSUMED, Guard, Updates, Writes, exists, update_ctes
from .step_settle import Success
from .task_totals import task_ended, task_ended_params, task_ended_sql

log = logging.getLogger(__name__)


def finish_run(execution: RunExecution, *, last: Step) -> None:
    """The run succeeded: its answer is its plan's last step's response."""
    run = execution.run
    end = _End.of(run, last.response)
    # Nothing written for this kind of run at its end but the end itself: one statement, its own
    # transaction, and run_finished's receivers after its commit (the run has ended: a receiver that
    # fails now is logged, not taken for the run's failure).
    alone = not written_at_end(run.kind)
    if alone and _end_at_once(execution, end, last=last):
        announce_end(run, end.now)
        return
    with transaction.atomic():  # the receivers of run_finished write in it too
        if alone or not _end_at_once(execution, end, last=last):
            _end_fenced(execution, end, last=last)
        announce_end(run, end.now)


def _end_fenced(execution: RunExecution, end: _End, *, last: Step) -> None:
    """The plain path: the run's end in the caller's transaction, fenced in its first statement."""
    run = execution.run
    with fenced(
        execution,
        cost=end.cost.usd,
        input_tokens=end.cost.input_tokens,
        output_tokens=end.cost.output_tokens,
        sets=end.sets,
    ) as read:
        *before, (action, obj, payload) = end.events(last, read.totals())
        for each in before:
            record_event(execution, *each)
        task_ended(run.task_id, end.ended)
        settle_steps(execution, end.now, reason="the run finished without it")
        last_event = record_event(execution, action, obj, payload, seal=True)
        run_chain_seal(run=run, task_id=run.task_id, last=last_event)
        rollups.run_waits(run.pk)


class EndWithLastStep:
    """`execute_plan`'s `ending` for a run's own plan: its last step's success and the run's end, in
    one statement (`_end_at_once`, the success staged first) where both can be: a run whose end nothing
    else writes (routing.signals.written_at_end), not scored by the judge (its call goes out after the
    last step's success is recorded), on the run as this process last read it, and with the global
    chain's head there for its seal (the claim of a first delivery looked: a database's first end makes
    it, in a fenced transaction). False, with nothing written, otherwise: the step's success is then
    recorded on its own, and the run ended after it (finish_run). `ended`: it did end the run."""

    def __init__(self, execution: RunExecution) -> None:
        self.execution = execution
        self.ended = False

    def __call__(self, call: Call, sent: Sent) -> bool:
        execution = self.execution
        run = execution.run
        if written_at_end(run.kind) or _judged(run.task) or not execution.global_chain_open:
            return False
        success = Success.of(call, sent)
        end = _End.of(run, success.completion.text)
        if not _end_at_once(execution, end, last=call.step, success=success):
            return False
        self.ended = True
        announce_end(run, end.now)
        return True


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


def _end_at_once(execution: RunExecution, end: _End, *, last: Step, success: Success | None = None) -> bool:
    """The run's end in one statement, on the run as this process last read it under its lock (its
    claim, totals and stamps, its chain's head: `Guard`, as `write_once`), with every step settled: the
    run's columns and totals (`end.sets`, its cost added), the task's (`end.ended` and its totals),
    the events (the last sealing the run's chain), the seal in the global chain (on its head as the
    database finds it: audit.chain.on_server_text) and the row that leaves the run waiting for a fold.
    `success`: the last step's success (its attempt, the step and its event, its cost), written first
    in the same statement, the step the one left unsettled. False, with nothing written, when any of it
    does not hold, or when the task's row it locked is not the version it began with (the caller then
    ends the run in a fenced transaction)."""
    execution.claim_current()
    run, assumed = execution.run, execution.assumed
    if assumed is None or not one_statement_writes():
        return False
    cost = end.cost
    before = Writes(execution)
    if success is not None:
        success.stage(before)
        cost = Cost(
            cost.usd + success.cost,
            cost.input_tokens + success.completion.input_tokens,
            cost.output_tokens + success.completion.output_tokens,
        )
    after = assumed.plus(cost.usd, cost.input_tokens, cost.output_tokens)
    chain = audit_chain.run_chain(run.correlation_id)
    fields = engine_event_fields(run, [*before.events, *end.events(last, after.totals())])
    planned = audit_chain.plan(chain, fields)
    if planned is None:
        return False
    sealed, seal_params = audit_chain.on_server_params(
        GLOBAL_CHAIN, run_chain_seal_fields(run=run, task_id=run.task_id, last=planned.events[-1])
    )
    run_end = {**end.sets, **after.totals()}
    guard = Guard(assumed, settled=True, settling=None if success is None else success.step.pk)
    params = {
        **guard.params(run),
        **audit_chain.append_params(planned),
        **seal_params,
        **task_ended_params(run.task_id, end.ended),
        "run_end": rows.document((Run._meta.get_field(name), value) for name, value in run_end.items()),  # type: ignore[misc]
        "run_cost_usd": after.spent,
        "run_input_tokens": after.input_tokens,
        "run_output_tokens": after.output_tokens,
    }
    success_updates = before.updated(params, name="success")
    sql = _end_sql(guard.sql(), len(planned.events), tuple(run_end), tuple(end.ended), success_updates)
    with rows.prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    written, *event_ids = row[: 1 + len(planned.events)]
    seal_id, seal_seq, seal_hash, seal_prev_hash, all_but_head_held = row[1 + len(planned.events) :]
    if not written:
        # The run, its task's row and the global chain were as assumed: its chain's head had moved. (Else
        # the head was right: the run's end goes on in a fenced transaction, which reads it under its lock.)
        if all_but_head_held:
            audit_chain.forget(chain)
        return False
    if seal_id is None:  # pragma: no cover - the head moves only where the global chain has a head to move
        raise RuntimeError(f"run {run.pk}: its seal was not appended to the global chain")
    sealed.pk, sealed.seq, sealed.hash, sealed.prev_hash = seal_id, seal_seq, seal_hash, seal_prev_hash
    audit_chain.appended(planned, event_ids, sealed=True)
    audit_chain.guess(GLOBAL_CHAIN, sealed.seq, sealed.hash)  # for this process's next append to it
    execution.assumed = after
    announce(execution, *planned.events)
    rollups.fold_after_commit()
    return True


# The global chain has a head to append the seal to.
_GLOBAL_CHAIN_OPEN = (
    f" AND EXISTS (SELECT 1 FROM {ChainHead._meta.db_table} gh "  # noqa: S608 - names and a constant
    f"WHERE gh.chain = '{GLOBAL_CHAIN}' AND NOT gh.sealed)"
)
# The task's row as locked is the version the statement began with (`task_locked`).
_TASK_UNMOVED = (
    " AND EXISTS (SELECT 1 FROM task_locked JOIN routing_task s ON s.id = task_locked.id "
    "AND s.xmin = task_locked.xmin)"
)


@functools.lru_cache(maxsize=16)
def _end_sql(
    guard: str, events: int, run_columns: tuple[str, ...], ended: tuple[str, ...], success: Updates = ()
) -> str:
    """The text of `_end_at_once`'s statement for this guard, this many events, these columns of the
    run set and these of the task, and the last step's success's updates (names only, made once per
    shape). Everything is written only if the run chain's head moved (`head_moved`), which it does
    only if the run is as assumed (`run_as_assumed`, with every step settled but the one the success
    settles), the task's row is locked unmoved (`task_locked`), and the global chain has a head (so
    the seal moves it too: `server_head_moved`)."""
    # The task's row is locked next, before the global chain's head: every end of a run (fail_run's
    # and the fenced one's too) locks its run, then its task, then the global head (a run's own chain
    # is its alone), so two runs of a task ending at once wait for each other, never deadlock.
    # The task's totals are summed over its runs as this statement found them when it began: if the
    # row it locked is not the version it began with (another run of the task ended meanwhile, its
    # cost perhaps added at its end), nothing is written and the fenced end locks the row in a
    # statement of its own (task_totals.task_ended) and sums the runs again in statements that begin
    # after that end.
    task_locked = (
        "task_locked AS (SELECT id, xmin FROM routing_task WHERE id = %(task_id)s"  # noqa: S608 - names
        f"{exists(RUN_AS_ASSUMED)} FOR UPDATE)"
    )
    ctes = [guard, task_locked]
    ctes += audit_chain.append_text(events, guard=f"{_TASK_UNMOVED}{_GLOBAL_CHAIN_OPEN}", seal=True)
    gate = exists(audit_chain.HEAD_MOVED)
    ctes.append(audit_chain.on_server_text(guard=gate))
    ctes += update_ctes(success, gate, name="success")
    columns = [rows.quoted(Run._meta.get_field(name).column) for name in run_columns]  # type: ignore[union-attr]
    ctes.append(
        f"run_ended AS (UPDATE routing_run SET {', '.join(f'{c} = r.{c}' for c in columns)} "  # noqa: S608 - names, not data
        f"FROM {rows.populated(Run, 'run_end')} AS r WHERE routing_run.id = %(run_id)s{gate})"
    )
    ctes.append(f"task_ended AS ({task_ended_sql(ended, with_run_totals=True, gate=gate)})")
    ctes.append(f"run_waits AS ({rollups.WAITS.format(gate=gate)})")
    seal = audit_chain.SERVER_HEAD_MOVED
    answers = [f"(SELECT count(*) FROM {audit_chain.HEAD_MOVED})"]  # noqa: S608
    answers += [f"(SELECT id FROM {audit_chain.event_inserted(i)})" for i in range(events)]  # noqa: S608
    answers += [
        f"(SELECT id FROM {audit_chain.SERVER_EVENT})",  # noqa: S608
        f"(SELECT seq FROM {seal})",  # noqa: S608
        f"(SELECT hash FROM {seal})",  # noqa: S608
        f"(SELECT prev_hash FROM {seal})",  # noqa: S608
    ]
    # Last: whether all but the run chain's head was as assumed (then it had moved, if nothing was written).
    answers.append(f"(SELECT count(*) FROM {RUN_AS_ASSUMED} WHERE true{_TASK_UNMOVED}{_GLOBAL_CHAIN_OPEN})")  # noqa: S608
    return f"WITH {', '.join(ctes)} SELECT {', '.join(answers)}"  # noqa: S608 - names, not data
