"""The claim: this process takes a run it holds the lock of. A new claim epoch fences off any process
that held it before; calls a dead process left in flight are recorded as lost; the claim's event is
written with it. One change (`claimed`), applied compiled at a first delivery (on the run as read
just before, in one statement) and plainly otherwise (a resumed run, or one that moved meanwhile:
under its row's lock).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import litellm
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit import policies, rows
from audit.actions import Action
from audit.models import ChainHead

from ..models import Attempt, ConductorVersion, Decision, Run, RunStatus, Step, StepStatus, Task
from ..models.transitions import Change as By
from ..models.transitions import check_move
from .changes import Change, Cost, Event, Expect, RowUpdate, moved
from .execution import Assumed, FirstIds, RunExecution
from .executor import apply, compiled_writes, ids_drawn_sql, try_compiled
from .workers import WORKERS_STAMP_SQL

log = logging.getLogger(__name__)

# The ids a first plan's rows take, drawn with the claim's read (executor.next_ids says why they are
# drawn first): its decision's, and its steps', as many as the task allows up to this many (a plan of
# more steps, a plan asked again, a nested plan draw theirs when they are recorded).
IDS_AHEAD = 8


def claim_run(run_id: int) -> RunExecution | None:
    """Claim a run for this process (which holds its lock): a new claim epoch, with its event. None
    when there is nothing to execute (the run is gone, or has ended)."""
    first = _first_delivery(run_id) if compiled_writes() else None
    if first is not None:
        execution = RunExecution(
            run=first.run,
            assumed=first.assumed,
            head=first.head,
            resumed=False,
            first_ids=first.first_ids,
        )
        if try_compiled(execution, functools.partial(claimed, execution.run, [], [], timezone.now())):
            return execution
    return _claim_locked(run_id)


@dataclass(frozen=True)
class FirstDelivery:
    """A run at its first delivery, read in one statement with what its claim and first plan need: its
    totals and the policy rules' and workers' stamps, its chain's head (if it has one yet), and the ids
    its first plan's rows take."""

    run: Run
    assumed: Assumed
    head: tuple[int, str] | None
    first_ids: FirstIds


def _first_delivery(run_id: int) -> FirstDelivery | None:
    """The run if this is its first delivery, with its task and conductor version (one prepared
    statement: as a queryset, compiling it cost more than running it)."""
    with rows.prepared_cursor() as cursor:
        cursor.execute(
            _first_delivery_sql(),
            {"run_id": run_id, "succeeded": RunStatus.SUCCEEDED, "failed": RunStatus.FAILED},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    read: list[Any] = []
    at = 0
    for model in (Run, Task, ConductorVersion):  # the columns in _first_delivery_sql's order
        width = len(model._meta.concrete_fields)
        read.append(rows.instance(model, row[at : at + width]))
        at += width
    run: Run = read[0]
    run.task, run.conductor_version = read[1:]
    rules_stamp, workers_stamp, head_seq, head_hash, decision_ids, step_ids = row[at:]
    return FirstDelivery(
        run=run,
        assumed=Assumed(
            spent=run.cost_usd,
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            rules_stamp=rules_stamp,
            workers_stamp=workers_stamp,
        ),
        head=(head_seq, head_hash) if head_seq is not None else None,
        first_ids=FirstIds(decision=int(decision_ids[0]), steps=[int(i) for i in step_ids]),
    )


@functools.cache
def _first_delivery_sql() -> str:
    return (
        f"SELECT {rows.columns(Run, 'run_')}, {rows.columns(Task, 'task_')}, "  # noqa: S608 - names, not data
        f"{rows.columns(ConductorVersion, 'version_')}, {policies.RULES_STAMP_SQL}, {WORKERS_STAMP_SQL}, "
        f"head.seq, head.hash, {ids_drawn_sql(Decision, '1')}, "
        f"{ids_drawn_sql(Step, f'LEAST(task_.max_steps, {IDS_AHEAD})')} "
        "FROM routing_run run_ "
        "JOIN routing_task task_ ON task_.id = run_.task_id "
        "JOIN routing_conductorversion version_ ON version_.id = run_.conductor_version_id "
        f"LEFT JOIN {ChainHead._meta.db_table} head ON head.chain = 'run:' || run_.correlation_id::text "
        "WHERE run_.id = %(run_id)s AND run_.deliveries = 0 AND run_.status NOT IN (%(succeeded)s, %(failed)s)"
    )


def claimed(run: Run, lost: list[Attempt], running: list[Step], now: Any, assumed: Assumed) -> Change:
    """The claim: the run running under a new epoch (which fences off whatever process held it
    before), its delivery counted; the calls a dead process left in flight (`lost`) recorded as lost,
    their estimated cost in the run's totals; its steps left running (`running`) pending again; the
    task of a live run running; and the claim's event. `run` as read just before."""
    epoch, deliveries = run.claim_epoch + 1, run.deliveries + 1
    values = {
        "status": RunStatus.RUNNING,
        "deliveries": deliveries,
        "claim_epoch": epoch,
        "worker_host": socket.gethostname(),
        "worker_pid": os.getpid(),
        "worker_ppid": os.getppid(),
        "heartbeat_at": now,
        "started_at": run.started_at or now,
    }
    check_move(Run, run.status, RunStatus.RUNNING, By.CLAIM)
    settled = [attempt_lost(attempt, now) for attempt in lost]
    updates = [update for update, _ in settled]
    updates += [moved(step, By.CLAIM, status=StepStatus.PENDING) for step in running]
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
        updates.append(
            moved(run.task, By.CLAIM, only_if={"status": RunStatus.QUEUED}, status=RunStatus.RUNNING)
        )
    action = Action.RUN_RESUMED if deliveries > 1 else Action.RUN_STARTED
    payload = claim_payload(run, deliveries=deliveries, epoch=epoch, worker=values, lost=settled)
    return Change(
        by=(By.CLAIM,),
        updates=tuple(updates),
        events=(Event(action, run, payload),),
        cost=sum((cost for _, cost in settled), Cost()),
        run=values,
        expect=Expect(status=run.status, durable=False),
    )


def claim_payload(
    run: Run, *, deliveries: int, epoch: int, worker: dict[str, Any], lost: list[tuple[RowUpdate, Cost]]
) -> dict[str, Any]:
    """The payload of run.started and run.resumed."""
    return {
        "delivery": deliveries,
        "worker_host": worker["worker_host"],
        "worker_pid": worker["worker_pid"],
        "epoch": epoch,
        "lost_attempts": [
            {
                "step_id": update.obj.step_id,  # type: ignore[attr-defined]
                "attempt": update.obj.number,  # type: ignore[attr-defined]
                "cost_usd": cost.usd,
                "input_tokens": cost.input_tokens,
                "output_tokens": cost.output_tokens,
                "estimated": True,
            }
            for update, cost in lost
        ],
        "conductor": run.conductor_version.name,
    }


def _claim_locked(run_id: int) -> RunExecution | None:
    """The claim under the run row's lock: anything still marked in flight belongs to a process that
    died (this one holds the run's lock), and is recorded as lost."""
    with transaction.atomic():
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("task", "conductor_version")
            .filter(pk=run_id)
            .first()
        )
        if run is None:
            log.warning("run %s does not exist; dropping its message", run_id)
            return None
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            log.info("run %s has already ended; dropping its message", run_id)
            return None
        execution = RunExecution(run=run, resumed=run.deliveries > 0)
        lost: list[Attempt] = []
        running: list[Step] = []
        if execution.resumed:
            lost = list(
                Attempt.objects.filter(step__run=run, status=Attempt.Status.STARTED).select_related(
                    "step__worker"
                )
            )
            running = list(Step.objects.filter(run=run, status=StepStatus.RUNNING))
        apply(execution, functools.partial(claimed, run, lost, running, timezone.now()))
    return execution


def attempt_lost(attempt: Attempt, now: Any) -> tuple[RowUpdate, Cost]:
    """A call in flight when its process died: the provider may have answered and charged for it.
    Its cost is estimated (the prompt as sent, the output at its bound), marked as an estimate, and
    counted in the totals, so that lost calls do not vanish from spend."""
    step = attempt.step
    input_tokens = (
        litellm.token_counter(model="gpt-4o", messages=step.messages_sent) if step.messages_sent else 0
    )
    output_tokens = settings.CONDUCTOR_LOST_CALL_MAX_OUTPUT_TOKENS
    cost = (
        step.worker.cost_of(input_tokens=input_tokens, output_tokens=output_tokens)
        if step.worker
        else Decimal(0)
    )
    update = moved(
        attempt,
        By.CLAIM,
        status=Attempt.Status.LOST,
        error=(
            "the worker process was lost during this call; its outcome is unknown "
            f"(cost estimated: {input_tokens} prompt tokens, at most {output_tokens} output tokens)"
        ),
        finished_at=now,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost_usd=cost,
        cost_estimated=True,
    )
    return update, Cost(cost, input_tokens, output_tokens)
