"""The operational rows against the audit events that describe them.

Registered with the audit verifier (routing.apps), which knows no rows: verification and each dossier
name every difference between what a row says now and what the run's chain recorded when it happened
(a step's worker, vendor, messages and response; an attempt's status and cost; a run's answer and
totals; a playground run's forced plan), and a finished run whose chain was never sealed.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models.fields.json import KT

from audit.actions import Action
from audit.chain import run_chain
from audit.models import GLOBAL_CHAIN, AuditEvent, PendingSeal
from audit.proof import money
from audit.verify import Problem
from routing.hashing import content_hash
from routing.models import CONDUCTOR_SLUG, Attempt, Decision, Run, RunStatus, Step

BATCH = 200  # runs per round trip in a full verification
FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED)


class _Events:
    """A run's events by what they describe: the last one of each kind per object."""

    def __init__(self, events: list[AuditEvent]):
        self.last: dict[tuple[str, str], AuditEvent] = {}
        self.by_action: dict[str, list[AuditEvent]] = defaultdict(list)
        for event in events:
            self.last[(event.action, event.object_id)] = event
            self.by_action[event.action].append(event)

    def get(self, action: str, obj: Any) -> AuditEvent | None:
        return self.last.get((action, str(obj.pk)))


def differs(event: AuditEvent, what: str, recorded: Any, now: Any) -> Problem:
    """What a row holds now against what `event` recorded when it was written."""
    return Problem(
        "row",
        event.pk,
        event.chain,
        event.seq,
        f"{what} is {now!r} in its row; this {event.action} event recorded {recorded!r}",
    )


PLANNED = (Action.PLAN_EMITTED, Action.PLAN_REJECTED, Action.PLAN_BLOCKED)
# A decision's columns that its plan event carries as they were written (the dossier shows them as fact).
DECISION_RECORDED = ("raw_output", "plan", "alternatives")


def _decision_problems(
    decisions: list[Decision], steps: list[Step], events: _Events, name: str
) -> Iterator[Problem]:
    """Each decision against its plan event, each planned step's instruction against the plan the event
    recorded, and every decision, step and attempt an event names against the rows that remain."""
    by_id = {d.pk: d for d in decisions}
    planned: dict[int, AuditEvent] = {}
    for action in PLANNED:
        for event in events.by_action[action]:
            planned[int(event.object_id)] = event
            if int(event.object_id) not in by_id:
                yield Problem("row", event.pk, name, event.seq, f"decision {event.object_id} is gone")
    for decision in decisions:
        event = planned.get(decision.pk)
        if event is None:
            yield Problem(
                "row", None, name, None, f"decision {decision.pk} is in its run, but no event records it"
            )
            continue
        for column in DECISION_RECORDED:
            if event.payload.get(column) != getattr(decision, column):
                yield differs(
                    event,
                    f"decision {decision.pk}'s {column} (sha256)",
                    content_hash(event.payload.get(column)),
                    content_hash(getattr(decision, column)),
                )
    rows = {s.pk for s in steps}
    for action in (Action.STEP_STARTED, Action.STEP_SUCCEEDED, Action.STEP_FAILED, Action.STEP_SKIPPED):
        for event in events.by_action[action]:
            if int(event.object_id) not in rows:
                yield Problem("row", event.pk, name, event.seq, f"step {event.object_id} is gone")
                rows.add(int(event.object_id))  # named once
    for step in steps:
        event = planned.get(step.decision_id)
        plan = (event.payload.get("plan") or {}) if event is not None else {}
        written = plan.get("steps") or []
        if event is None or step.index >= len(written):
            continue
        if written[step.index].get("instruction") != step.instruction:
            yield differs(
                event,
                f"step {step.pk}'s instruction (sha256)",
                content_hash(written[step.index].get("instruction")),
                content_hash(step.instruction),
            )
        if written[step.index].get("worker") != step.worker_slug:
            yield differs(
                event, f"step {step.pk}'s worker", written[step.index].get("worker"), step.worker_slug
            )


def _override_problems(run: Run, events: _Events, name: str) -> Iterator[Problem]:
    """A playground run's forced plan (`plan_override`) against its task.playground_run event: by the
    hash the event records, or (an event written before it did) the worker and instruction it names."""
    if run.kind != Run.Kind.PLAYGROUND:
        return
    event = next(
        (e for e in events.by_action[Action.TASK_PLAYGROUND_RUN] if e.payload.get("run_id") == run.pk), None
    )
    if event is None:
        yield Problem(
            "row",
            None,
            name,
            None,
            f"run {run.pk} is a playground run, but no task.playground_run event records it",
        )
        return
    p = event.payload
    if "plan_override_sha256" in p:
        if p["plan_override_sha256"] != content_hash(run.plan_override):
            yield differs(
                event,
                f"run {run.pk}'s plan_override (sha256)",
                p["plan_override_sha256"],
                content_hash(run.plan_override),
            )
        return
    forced = _forced_step(run.plan_override)
    if (forced.get("worker") or "") != (p.get("worker") or ""):
        yield differs(
            event, f"run {run.pk}'s plan_override worker", p.get("worker") or "", forced.get("worker") or ""
        )
    instruction = forced.get("instruction") or ""
    if (
        p.get("instruction_sha256")
        and p["instruction_sha256"] != hashlib.sha256(instruction.encode()).hexdigest()
    ):
        yield differs(
            event,
            f"run {run.pk}'s plan_override instruction (sha256)",
            p["instruction_sha256"],
            hashlib.sha256(instruction.encode()).hexdigest(),
        )


def _forced_step(plan_override: str) -> dict[str, Any]:
    """The one step a playground's plan forces ({}: none, or not a plan)."""
    try:
        steps = json.loads(plan_override).get("steps") if plan_override else None
    except (ValueError, AttributeError):
        return {"worker": "(not a plan)"}
    first = steps[0] if isinstance(steps, list) and steps else {}
    return first if isinstance(first, dict) else {}


def _run_problems(
    run: Run,
    events: _Events,
    decisions: list[Decision],
    steps: list[Step],
    attempts: list[Attempt],
    sealed: bool,
) -> Iterator[Problem]:
    name = run_chain(run.correlation_id)
    yield from _decision_problems(decisions, steps, events, name)
    yield from _step_problems(steps, events, name)
    yield from _attempt_problems(attempts, events, name)
    yield from _override_problems(run, events, name)
    decided = sum((d.cost_usd for d in decisions), Decimal(0))
    yield from _run_totals(run, events, name, decided + sum((a.cost_usd for a in attempts), Decimal(0)))
    if run.status in FINISHED and not sealed:
        yield Problem(
            "unsealed",
            None,
            name,
            None,
            f"run {run.pk} is {run.status}, but its chain has no seal in the global chain, nor one pending",
            expected="a run.sealed event",
        )


def _step_problems(steps: list[Step], events: _Events, name: str) -> Iterator[Problem]:
    """Each step's row against the events of its start and its success."""
    for step in steps:
        started = events.get(Action.STEP_STARTED, step)
        if started is not None:
            p = started.payload
            if p.get("worker") != step.worker_slug:
                yield differs(started, f"step {step.pk}'s worker", p.get("worker"), step.worker_slug)
            if p.get("vendor") != step.vendor:
                yield differs(started, f"step {step.pk}'s vendor", p.get("vendor"), step.vendor)
            if p.get("messages_sha256") not in (None, content_hash(step.messages_sent)):
                yield differs(
                    started,
                    f"step {step.pk}'s messages (sha256)",
                    p.get("messages_sha256"),
                    content_hash(step.messages_sent),
                )
        succeeded = events.get(Action.STEP_SUCCEEDED, step)
        if step.status == "succeeded" and succeeded is None:
            yield Problem(
                "row", None, name, None, f"step {step.pk} is succeeded in its row, but no event records it"
            )
        if succeeded is None:
            continue
        p = succeeded.payload
        if step.status != "succeeded":
            yield differs(succeeded, f"step {step.pk}'s status", "succeeded", step.status)
        if p.get("response_sha256") != content_hash(step.response):
            yield differs(
                succeeded,
                f"step {step.pk}'s response (sha256)",
                p.get("response_sha256"),
                content_hash(step.response),
            )
        worker = p.get("worker")
        if worker != CONDUCTOR_SLUG and worker != step.worker_slug:
            yield differs(succeeded, f"step {step.pk}'s worker", worker, step.worker_slug)
        if "vendor" in p and p["vendor"] != step.vendor:
            yield differs(succeeded, f"step {step.pk}'s vendor", p["vendor"], step.vendor)


def _attempt_problems(attempts: list[Attempt], events: _Events, name: str) -> Iterator[Problem]:
    """Each attempt's row against the event of its success or failure, and a lost attempt's estimated
    cost against the event that resumed its run."""
    by_key = {(a.step_id, a.number): a for a in attempts}
    for event in events.by_action[Action.STEP_SUCCEEDED]:
        p = event.payload
        if "attempt" not in p:
            continue  # a conductor step: answered without a call of its own
        attempt = by_key.get((int(event.object_id), p["attempt"]))
        if attempt is None:
            yield Problem(
                "row", event.pk, name, event.seq, f"attempt {p['attempt']} of step {event.object_id} is gone"
            )
            continue
        if attempt.status != Attempt.Status.SUCCEEDED:
            yield differs(event, f"attempt {attempt.pk}'s status", "succeeded", attempt.status)
        if money(p.get("cost_usd")) != attempt.cost_usd:
            yield differs(event, f"attempt {attempt.pk}'s cost_usd", p.get("cost_usd"), str(attempt.cost_usd))
        for tokens in ("input_tokens", "output_tokens"):
            if p.get(tokens) != getattr(attempt, tokens):
                yield differs(
                    event, f"attempt {attempt.pk}'s {tokens}", p.get(tokens), getattr(attempt, tokens)
                )
    for attempt in attempts:
        failed = events.get(Action.ATTEMPT_FAILED, attempt)
        if failed is None:
            continue
        p = failed.payload
        if p.get("status") != attempt.status:
            yield differs(failed, f"attempt {attempt.pk}'s status", p.get("status"), attempt.status)
        if p.get("http_status") != attempt.http_status:
            yield differs(
                failed, f"attempt {attempt.pk}'s http_status", p.get("http_status"), attempt.http_status
            )
    for event in events.by_action[Action.RUN_RESUMED]:
        for lost in event.payload.get("lost_attempts", []):
            attempt = by_key.get((lost.get("step_id"), lost.get("attempt")))
            if attempt is None or "cost_usd" not in lost:
                continue
            if money(lost["cost_usd"]) != attempt.cost_usd:
                yield differs(
                    event,
                    f"lost attempt {attempt.pk}'s estimated cost_usd",
                    lost["cost_usd"],
                    str(attempt.cost_usd),
                )


def _run_totals(run: Run, events: _Events, name: str, called: Decimal) -> Iterator[Problem]:
    ended = events.get(f"run.{run.status}", run) if run.status in FINISHED else None
    if run.status in FINISHED and ended is None:
        yield Problem(
            "row", None, name, None, f"run {run.pk} is {run.status} in its row, but no event records it"
        )
    if ended is not None and run.status == RunStatus.SUCCEEDED:
        p = ended.payload
        if p.get("final_answer_sha256") != content_hash(run.final_answer):
            yield differs(
                ended,
                f"run {run.pk}'s final answer (sha256)",
                p.get("final_answer_sha256"),
                content_hash(run.final_answer),
            )
        if "cost_usd" in p and money(p["cost_usd"]) != run.cost_usd:
            yield differs(ended, f"run {run.pk}'s cost_usd", p["cost_usd"], str(run.cost_usd))
        for tokens in ("input_tokens", "output_tokens"):
            if tokens in p and p[tokens] != getattr(run, tokens):
                yield differs(ended, f"run {run.pk}'s {tokens}", p[tokens], getattr(run, tokens))
        if p.get("score") != run.score:
            yield differs(ended, f"run {run.pk}'s score", p.get("score"), run.score)
    if (
        ended is not None
        and run.status == RunStatus.FAILED
        and ended.payload.get("stop_reason") != run.stop_reason
    ):
        yield differs(ended, f"run {run.pk}'s stop_reason", ended.payload.get("stop_reason"), run.stop_reason)
    # The total is the sum of its parts: decisions, attempts (estimates of lost calls included), judging.
    judged = sum(
        (money(e.payload.get("cost_usd")) or Decimal(0) for e in events.by_action[Action.SCORE_JUDGED]),
        Decimal(0),
    )
    parts = called + judged
    if parts != run.cost_usd:
        yield Problem(
            "row",
            None,
            name,
            None,
            f"run {run.pk}'s cost_usd is {run.cost_usd} in its row, but its decisions, attempts and judging add up to {parts}",
        )


_GONE_RUNS = """
    WITH recorded AS (
        SELECT s.payload->>'chain' AS chain FROM audit_auditevent s
        WHERE s.chain = %(global_chain)s AND s.action = %(sealed)s
        UNION
        SELECT h.chain FROM audit_chainhead h WHERE h.chain LIKE 'run:%%'
    ),
    named AS (
        SELECT chain, CASE WHEN chain ~ '^run:[0-9a-f-]{36}$' THEN substr(chain, 5)::uuid END AS correlation_id
        FROM recorded WHERE chain = ANY(COALESCE(%(chains)s::text[], ARRAY[chain]))
    )
    SELECT chain FROM named
    WHERE NOT EXISTS (SELECT 1 FROM routing_run r WHERE r.correlation_id = named.correlation_id)
      AND NOT EXISTS (SELECT 1 FROM audit_chainpurge p WHERE p.chain = named.chain)
    ORDER BY chain
"""


def gone_runs_problems(chains: list[str] | None) -> Iterator[Problem]:
    """Run chains that the record holds (a seal in the global chain, or a chain head) with no run row:
    the run's rows were deleted while its events remain (a purge keeps the rows)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _GONE_RUNS, {"global_chain": GLOBAL_CHAIN, "sealed": str(Action.RUN_SEALED), "chains": chains}
        )
        gone = [name for (name,) in cursor.fetchall()]
    for name in gone:
        yield Problem(
            "row", None, name, None, f"the run of chain {name} is gone from the database; its events remain"
        )


def run_rows_problems(chains: list[str] | None) -> Iterator[Problem]:
    """The registered row check: the runs of these chains (None: every run), in batches."""
    runs = Run.objects.select_related("task").order_by("pk")
    if chains is not None:
        ids = []
        for name in chains:
            if name.startswith("run:"):
                try:
                    ids.append(uuid.UUID(name.removeprefix("run:")))
                except ValueError:
                    continue
        runs = runs.filter(correlation_id__in=ids)
    yield from gone_runs_problems(chains)
    last = 0
    while True:
        batch = list(runs.filter(pk__gt=last)[:BATCH])
        if not batch:
            return
        last = batch[-1].pk
        batch = [r for r in batch if r.task.purged_at is None]  # content deleted under retention
        names = {run_chain(r.correlation_id): r for r in batch}
        events: dict[str, list[AuditEvent]] = defaultdict(list)
        for event in AuditEvent.objects.filter(chain__in=list(names)).order_by("chain", "seq"):
            events[event.chain].append(event)
        sealed = set(
            AuditEvent.objects.annotate(sealed_chain=KT("payload__chain"))
            .filter(chain=GLOBAL_CHAIN, action=Action.RUN_SEALED, sealed_chain__in=list(names))
            .values_list("sealed_chain", flat=True)
        )
        # A seal still pending counts here; audit.verify holds it to its grace (and to its chain's tail).
        sealed |= set(
            PendingSeal.objects.filter(chain__in=list(names), seal_event_id__isnull=True).values_list(
                "chain", flat=True
            )
        )
        steps: dict[int, list[Step]] = defaultdict(list)
        for step in Step.objects.filter(run__in=batch).order_by("pk"):
            steps[step.run_id].append(step)
        attempts: dict[int, list[Attempt]] = defaultdict(list)
        for attempt in Attempt.objects.filter(step__run__in=batch).select_related("step").order_by("pk"):
            attempts[attempt.step.run_id].append(attempt)
        decisions: dict[int, list[Decision]] = defaultdict(list)
        for decision in Decision.objects.filter(run__in=batch).only(
            "pk", "run_id", "cost_usd", *DECISION_RECORDED
        ):
            decisions[decision.run_id].append(decision)
        for name, run in names.items():
            yield from _run_problems(
                run, _Events(events[name]), decisions[run.pk], steps[run.pk], attempts[run.pk], name in sealed
            )
