"""Finishing a run: the final answer, its score (a scorer or the LLM judge), the totals, the seal of
its audit chain; or its failure, with every step left settled.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
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
from .record import (
    Fence,
    Guard,
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
)

log = logging.getLogger(__name__)


def finish_run(run: Run, *, last: Step) -> None:
    """The run succeeded: its answer is its plan's last step's response. Its end is one statement when
    the run is as this process last read it (`_end_at_once`), else a fenced transaction of several."""
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
    ended: dict[str, object] = {}
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
        ended = {
            "status": RunStatus.SUCCEEDED,
            "final_answer": final,
            "score": score,
            "finished_at": now,
            "error": "",
        }

    def events(totals: dict[str, Any]) -> list[tuple[str, Any, dict[str, Any]]]:
        """The events of the run's end, given its final totals: the last seals the run's chain."""
        staged: list[tuple[str, Any, dict[str, Any]]] = []
        if judged is not None:
            staged.append((Action.SCORE_JUDGED, run, judged.audit_payload()))
        scorer = scorers.scorer_name(task.scorer, task.domain) if score is not None else None
        payload = {
            "final_step_id": last.pk,
            "final_answer_sha256": content_hash(final),
            "score": score,
            "extracted_answer": extracted,
            "scorer": scorer,
            **totals,
        }
        staged.append((Action.RUN_SUCCEEDED, run, payload))
        return staged

    # Nothing written for this kind of run at its end but the end itself: one statement, its own
    # transaction, and run_finished's receivers after its commit (the run has ended: a receiver that
    # fails now is logged, not taken for the run's failure).
    alone = not written_at_end(run.kind)
    if alone and _end_at_once(run, cost, sets=sets, ended=ended, events=events):
        for receiver, outcome in run_finished.send_robust(sender=Run, run=run, now=now):
            if isinstance(outcome, Exception):
                log.error(
                    "run %s ended; a receiver of run_finished failed after it: %r",
                    run.pk,
                    receiver,
                    exc_info=outcome,
                )
        return
    with transaction.atomic():  # the receivers of run_finished write in it too
        if alone or not _end_at_once(run, cost, sets=sets, ended=ended, events=events):
            with fenced(
                run,
                cost=cost.usd,
                input_tokens=cost.input_tokens,
                output_tokens=cost.output_tokens,
                sets=sets,
            ) as fence_read:
                *before, (action, obj, payload) = events(fence_read.totals())
                for each in before:
                    record_event(run, *each)
                task_ended(task.pk, ended)
                _settle_steps(run, now, reason="the run finished without it")
                last_event = record_event(run, action, obj, payload, seal=True)
                run_chain_seal(run=run, task_id=task.pk, last=last_event)
                rollups.run_waits(run.pk)
        run_finished.send(sender=Run, run=run, now=now)


@dataclass(frozen=True)
class Cost:
    """What the run's end adds to its totals (the judge's call)."""

    usd: Decimal
    input_tokens: int
    output_tokens: int


def _end_at_once(
    run: Run,
    cost: Cost,
    *,
    sets: dict[str, Any],
    ended: dict[str, Any],
    events: Callable[[dict[str, Any]], list[tuple[str, Any, dict[str, Any]]]],
) -> bool:
    """The run's end in one statement, on the run as this process last read it under its lock (its
    claim, totals and stamps, its chain's head: `Guard`, as `write_once`), with every step settled: the
    run's columns and totals (`sets`, this cost added), the task's (`ended` and its totals), the events
    (the last sealing the run's chain), the seal in the global chain (on its head as the server finds
    it: audit.chain.on_server_text) and the row that leaves the run waiting for a fold. False, with
    nothing written, when any of it does not hold, or when the task's row it locked is not the version
    it began with (the caller then ends the run in a fenced transaction)."""
    claim_current(run)
    known: Fence | None = getattr(run, "_known", None)
    if known is None:
        return False
    guess = guessed(known, cost.usd, cost.input_tokens, cost.output_tokens)
    totals = guess.totals()
    chain = audit_chain.run_chain(run.correlation_id)
    fields = engine_event_fields(run, events(totals))
    planned = audit_chain.plan(chain, fields)
    if planned is None:
        return False
    sealed, global_params = audit_chain.on_server_params(
        GLOBAL_CHAIN, run_chain_seal_fields(run=run, task_id=run.task_id, last=planned.events[-1])
    )
    values = {**sets, **totals}
    run_fields = [Run._meta.get_field(name) for name in values]
    params = [
        *Guard(known).params(run),
        run.task_id,
        *audit_chain.append_params(planned),
        *global_params,
        rows.document(zip(run_fields, values.values(), strict=True)),  # type: ignore[arg-type]
        run.pk,
        guess.spent,
        guess.input_tokens,
        guess.output_tokens,
        run.pk,
        task_ended_document(ended),
        run.task_id,
        run.pk,
    ]
    with rows.prepared_cursor() as cursor:
        cursor.execute(_end_sql(len(planned.events), tuple(values), tuple(ended)), params)
        row = cursor.fetchone()
    if not row[0]:
        # The run was as assumed: its chain's head had moved, or the task's row had (another run's end:
        # the head was right, and the fenced end reads it under its lock once more).
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
def _end_sql(events: int, run_columns: tuple[str, ...], ended: tuple[str, ...]) -> str:
    """The text of `_end_at_once`'s statement for this many events, these columns of the run set and
    these of the task (names only: made once per shape). Everything is written only if `h` moved the
    run chain's head, which it does only if `f` (the guard, with every step settled) holds, `ft`
    locked the task's row, and the global chain has a head (so `g` moves it too)."""
    has_global = (
        f" AND EXISTS (SELECT 1 FROM {ChainHead._meta.db_table} gh "  # noqa: S608 - names and a constant
        f"WHERE gh.chain = '{GLOBAL_CHAIN}' AND NOT gh.sealed)"
    )
    ctes = [guard_sql(False, settled=True)]
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
    answers.append("(SELECT count(*) FROM f)")
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
