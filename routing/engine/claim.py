"""The claim: this process takes a run it holds the lock of. A new claim epoch fences off any process
that held it before, and the claim's event is written with it.

Two ways to claim, one interface (`claim_run`): a first delivery, on the run as read just before, in
one statement (the fast path); anything else (a resumed run, with attempts a dead process left in
flight; a run that moved meanwhile) under the run row's lock (the plain path). Both leave the same rows.
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

from audit import chain as audit_chain
from audit import policies, rows
from audit.actions import Action
from audit.models import GLOBAL_CHAIN, ChainHead

from ..models import Attempt, ConductorVersion, Decision, Run, RunStatus, Step, StepStatus, Task
from .execution import Assumed, FirstIds, RunExecution
from .fence import add_cost, fenced, ids_drawn_sql, one_statement_writes, record_event
from .statement import Guard, Writes
from .workers import WORKERS_STAMP_SQL

log = logging.getLogger(__name__)

# The ids a first plan's rows take, drawn with the claim's read (fence.next_ids says why they are
# drawn first): its decision's, and its steps', as many as the task allows up to this many (a plan of
# more steps, a plan asked again, a nested plan draw theirs when they are recorded).
IDS_AHEAD = 8

CLAIMED_FIELDS = (
    "status",
    "deliveries",
    "claim_epoch",
    "worker_host",
    "worker_pid",
    "worker_ppid",
    "heartbeat_at",
    "started_at",
)


def claim_run(run_id: int) -> RunExecution | None:
    """Claim a run for this process (which holds its lock): a new claim epoch, with its event. None
    when there is nothing to execute (the run is gone, or has ended)."""
    first = _first_delivery(run_id) if one_statement_writes() else None
    if first is not None:
        execution = _claim_first(first)
        if execution is not None:
            return execution
    return _claim_locked(run_id)


@dataclass(frozen=True)
class FirstDelivery:
    """A run at its first delivery, read in one statement with what its claim and first plan need:
    the policy rules' and workers' stamps, its chain's head (if it has one yet), the ids its first
    plan's rows take, and whether the global chain has a head (its end may seal into it at once)."""

    run: Run
    rules_stamp: str
    workers_stamp: str
    head: tuple[int, str] | None
    first_ids: FirstIds
    global_chain_open: bool


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
    rules_stamp, workers_stamp, head_seq, head_hash, decision_ids, step_ids, global_open = row[at:]
    return FirstDelivery(
        run=run,
        rules_stamp=rules_stamp,
        workers_stamp=workers_stamp,
        head=(head_seq, head_hash) if head_seq is not None else None,
        first_ids=FirstIds(decision=int(decision_ids[0]), steps=[int(i) for i in step_ids]),
        global_chain_open=bool(global_open),
    )


@functools.cache
def _first_delivery_sql() -> str:
    return (
        f"SELECT {rows.columns(Run, 'run_')}, {rows.columns(Task, 'task_')}, "  # noqa: S608 - names, not data
        f"{rows.columns(ConductorVersion, 'version_')}, {policies.RULES_STAMP_SQL}, {WORKERS_STAMP_SQL}, "
        f"head.seq, head.hash, {ids_drawn_sql(Decision, '1')}, "
        f"{ids_drawn_sql(Step, f'LEAST(task_.max_steps, {IDS_AHEAD})')}, "
        f"EXISTS (SELECT 1 FROM {ChainHead._meta.db_table} WHERE chain = '{GLOBAL_CHAIN}' AND NOT sealed) "
        "FROM routing_run run_ "
        "JOIN routing_task task_ ON task_.id = run_.task_id "
        "JOIN routing_conductorversion version_ ON version_.id = run_.conductor_version_id "
        f"LEFT JOIN {ChainHead._meta.db_table} head ON head.chain = 'run:' || run_.correlation_id::text "
        "WHERE run_.id = %(run_id)s AND run_.deliveries = 0 AND run_.status NOT IN (%(succeeded)s, %(failed)s)"
    )


def _claim_first(first: FirstDelivery) -> RunExecution | None:
    """The claim of a first delivery in one statement, on the run as read (Guard: its epoch, status,
    totals and stamps). None, with nothing written, when the run moved meanwhile."""
    run = first.run
    assumed = Assumed(
        spent=run.cost_usd,
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
        rules_stamp=first.rules_stamp,
        workers_stamp=first.workers_stamp,
    )
    if first.head is not None:
        audit_chain.guess(audit_chain.run_chain(run.correlation_id), *first.head)
    # The claim's commit does not wait for the WAL's flush (Guard.flush): lost in a crash of the server,
    # the run is as it was, and is delivered again. What the run does next is recorded by the plan's
    # statement, whose commit flushes the claim's with it.
    guard = Guard(assumed, epoch=run.claim_epoch, status=run.status, flush=False)
    execution = RunExecution(
        run=run,
        assumed=assumed,
        resumed=False,
        first_ids=first.first_ids,
        global_chain_open=first.global_chain_open,
    )
    _claimed(run, timezone.now())
    writes = Writes(execution)
    writes.update(run, **{name: getattr(run, name) for name in CLAIMED_FIELDS})
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
        writes.update(run.task, only_if={"status": RunStatus.QUEUED}, status=RunStatus.RUNNING)
    writes.event(Action.RUN_STARTED, run, _claim_payload(run, lost=[]))
    return execution if writes.execute(guard=guard) else None


def _claimed(run: Run, now: Any) -> None:
    """The run's columns as a claim sets them."""
    run.status = RunStatus.RUNNING
    run.deliveries += 1
    run.claim_epoch += 1  # fences off whatever process held the run before
    run.worker_host = socket.gethostname()
    run.worker_pid = os.getpid()
    run.worker_ppid = os.getppid()
    run.heartbeat_at = now
    run.started_at = run.started_at or now


def _claim_payload(run: Run, *, lost: list[Attempt]) -> dict[str, Any]:
    return {
        "delivery": run.deliveries,
        "worker_host": run.worker_host,
        "worker_pid": run.worker_pid,
        "epoch": run.claim_epoch,
        "lost_attempts": [
            {
                "step_id": a.step_id,
                "attempt": a.number,
                "cost_usd": a.cost_usd,
                "input_tokens": a.input_tokens,
                "output_tokens": a.output_tokens,
                "estimated": a.cost_estimated,
            }
            for a in lost
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
        resumed = run.deliveries > 0
        now = timezone.now()
        _claimed(run, now)
        run.save(update_fields=list(CLAIMED_FIELDS))
        execution = RunExecution(run=run, resumed=resumed)
        lost: list[Attempt] = []
        if resumed:
            lost = list(
                Attempt.objects.filter(step__run=run, status=Attempt.Status.STARTED).select_related("step")
            )
            for attempt in lost:
                attempt_lost(run, attempt, now)
            Step.objects.filter(run=run, status=StepStatus.RUNNING).update(status=StepStatus.PENDING)
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            Task.objects.filter(pk=run.task_id, status=RunStatus.QUEUED).update(status=RunStatus.RUNNING)
        # The claim's fence reads the rules' and workers' stamps: what the plan is checked against,
        # and what the run's next writes assume (fence.write_once).
        with fenced(execution, rules=True):
            action = Action.RUN_RESUMED if resumed else Action.RUN_STARTED
            record_event(execution, action, run, _claim_payload(run, lost=lost))
    return execution


def attempt_lost(run: Run, attempt: Attempt, now: Any) -> None:
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
    attempt.status = Attempt.Status.LOST
    attempt.error = (
        "the worker process was lost during this call; its outcome is unknown "
        f"(cost estimated: {input_tokens} prompt tokens, at most {output_tokens} output tokens)"
    )
    attempt.finished_at = now
    attempt.input_tokens, attempt.output_tokens, attempt.cost_usd = input_tokens, output_tokens, cost
    attempt.cost_estimated = True
    attempt.save(
        update_fields=[
            "status",
            "error",
            "finished_at",
            "input_tokens",
            "output_tokens",
            "cost_usd",
            "cost_estimated",
        ]
    )
    add_cost(run, cost=cost, input_tokens=input_tokens, output_tokens=output_tokens)
