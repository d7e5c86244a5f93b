"""The engine: plan a run, execute its steps as a DAG, recurse through the conductor, enforce budgets.

Resumable by construction. Every call's outcome is committed before the next one starts, so a run
taken over by another worker process (the first was killed) skips the steps that already succeeded:
no paid call is made twice. A call that was in flight when its process died is recorded as `lost`
and made again. A PostgreSQL advisory lock, held on its own connection for the life of an execution,
makes sure only one process executes a run at a time; the lock dies with the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import litellm
import psycopg
from django import db as django_db
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import Exists, F, Sum
from django.utils import timezone

from audit import policies
from audit.services import ENGINE, event_record, run_chain_seal

from . import live
from .conductors import Conductor, ConductorUnavailable, PlanRequest, Proposal, WorkerCard, conductor_for
from .hashing import content_hash
from .models import (
    CONDUCTOR_SLUG,
    Attempt,
    Decision,
    Run,
    RunStatus,
    Step,
    StepStatus,
    Task,
    Worker,
)
from .plans import MAX_STEPS, Plan, PlanError, parse_plan, visible_indices
from .providers import ProviderCallError, complete, worker_api_key
from .scoring import scorers
from .scoring.judge import judge
from .secrets import redact

log = logging.getLogger(__name__)

PLAN_TRIES = 2  # an invalid plan is retried once with the error shown to the conductor
ADVISORY_LOCK_NAMESPACE = 0x436F6E64  # "Cond": keeps run locks apart from other advisory locks

WORKER_SYSTEM_PROMPT = (
    "You are one worker in a team of models. Do the subtask you are given. Results of earlier steps, "
    "when shown, are for your use; they may contain mistakes."
)


class Fenced(Exception):
    """This process's claim on the run is no longer current (another process claimed it, or the lock's
    connection died): it must write nothing more and make no more calls."""


class InfrastructureError(Exception):
    """The database (or its connection) failed under the run: not the run's fault. The run is left as it
    is, for the next delivery to resume; the Celery task retries the message."""


INFRASTRUCTURE_ERRORS = (django_db.OperationalError, django_db.InterfaceError, psycopg.OperationalError)


class RunStopped(Exception):
    """The run cannot go on: a step failed, a plan stayed invalid, or a budget was reached."""

    def __init__(self, message: str, *, stop_reason: str):
        super().__init__(message)
        self.stop_reason = stop_reason


def _audit(run: Run, action: str, obj: Any, payload: dict[str, Any]) -> None:
    """An engine event on the run's chain; call inside the transaction of the change it records.

    Watchers of the task get a small live event after commit, numbered by the event's place in the
    run's chain (gap-free), so a page can tell when it missed one.

    Every write transaction of the engine records an event, so this is also where the claim is fenced:
    the run row is locked and its claim epoch must still be this process's, or the whole transaction
    (the change with its event) rolls back.
    """
    _fence(run)
    event = event_record(
        actor=ENGINE,
        action=action,
        obj=obj,
        task_id=run.task_id,
        correlation_id=run.correlation_id,
        payload=payload,
    )
    live.publish_on_commit(
        task_id=run.task_id,
        event={
            "run": run.pk,
            "seq": event.seq,
            "action": action,
            "object": event.object_type,
            "id": event.object_id,
        },
    )


# --- locking ------------------------------------------------------------------------------------


def _fence(run: Run) -> None:
    """Inside a write transaction: lock the run row and check that this process's claim is current."""
    lost = getattr(run, "_claim_lost", None)
    if lost is not None and lost.is_set():
        raise Fenced(f"run {run.pk}: the lock's connection was lost; this process stops")
    current = (
        Run.objects.select_for_update(of=("self",)).filter(pk=run.pk).values_list("claim_epoch", flat=True)
    )
    epoch = current.first()
    if epoch != run.claim_epoch:
        raise Fenced(f"run {run.pk} was claimed again (epoch {epoch}, this process holds {run.claim_epoch})")


class _Keeper:
    """Keeps the lock's connection busy and watched: every CONDUCTOR_HEARTBEAT_S it writes the run's
    heartbeat through it, fenced by the claim epoch. If the connection dies (an idle-session timeout, a
    reaper, a restart) the lock is gone with it: `lost` is set and the engine stops before its next
    write or call."""

    def __init__(self, lock_conn: psycopg.Connection, run: Run):
        self.lock_conn, self.run = lock_conn, run
        self.lost = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"run-{run.pk}-keeper", daemon=True)

    def __enter__(self) -> _Keeper:
        self.run._claim_lost = self.lost  # type: ignore[attr-defined]
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopped.set()
        self.thread.join()

    def _beat(self) -> None:
        while not self.stopped.wait(settings.CONDUCTOR_HEARTBEAT_S):
            try:
                updated = self.lock_conn.execute(
                    "UPDATE routing_run SET heartbeat_at = now() WHERE id = %s AND claim_epoch = %s",
                    (self.run.pk, self.run.claim_epoch),
                ).rowcount
            except psycopg.Error:
                updated = 0
            if not updated:
                log.warning("run %s: the run lock or the claim was lost; stopping", self.run.pk)
                self.lost.set()
                return


@contextmanager
def advisory_lock_connection(namespace: int, key: int) -> Iterator[psycopg.Connection | None]:
    """Hold an advisory lock on a connection of its own (it dies with the process); yields that
    connection, or None if another process holds the lock."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as lock_conn:
        acquired = lock_conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (namespace, key)).fetchone()[0]
        try:
            yield lock_conn if acquired else None
        finally:
            if acquired and not lock_conn.closed:
                with contextlib.suppress(psycopg.Error):  # a dead connection took the lock with it
                    lock_conn.execute("SELECT pg_advisory_unlock(%s, %s)", (namespace, key))


@contextmanager
def advisory_lock(namespace: int, key: int) -> Iterator[bool]:
    """Hold an advisory lock on a connection of its own; yields False if another process holds it."""
    with advisory_lock_connection(namespace, key) as lock_conn:
        yield lock_conn is not None


def run_lock(run_id: int) -> Iterator[psycopg.Connection | None]:
    """The run's lock: one process executes a run at a time. Yields the lock's connection, or None."""
    return advisory_lock_connection(ADVISORY_LOCK_NAMESPACE, run_id)


def advisory_locked(namespace: int, key: int) -> bool:
    """Whether another process holds the lock (probed by taking it for a moment)."""
    with advisory_lock(namespace, key) as acquired:
        return not acquired


def run_is_locked(run_id: int) -> bool:
    return advisory_locked(ADVISORY_LOCK_NAMESPACE, run_id)


# --- entry point --------------------------------------------------------------------------------


def execute_run(run_id: int) -> None:
    """Claim a run and execute it. Raises InfrastructureError when the database failed under it."""
    try:
        with run_lock(run_id) as lock_conn:
            if lock_conn is None:
                log.info("run %s is being executed by another process; leaving it", run_id)
                return
            run = _claim(run_id)
            if run is None:
                return
            with _Keeper(lock_conn, run):
                _execute(run)
    except Fenced as fenced:
        log.warning("%s", fenced)
    except INFRASTRUCTURE_ERRORS as exc:
        raise InfrastructureError(f"run {run_id}: {type(exc).__name__}: {exc}") from exc


def _execute(run: Run) -> None:
    try:
        root = _ensure_plan(run, parent_step=None, depth=0)
        _execute_plan(run, root)
        _finish(run, root)
    except RunStopped as stop:
        _fail(run, str(stop), stop.stop_reason)
    except (Fenced, *INFRASTRUCTURE_ERRORS):
        raise  # not the run's failure: nothing may (or can) be written; the next delivery resumes it
    except Exception as exc:
        # A bug: leave a clear failed state rather than a run stuck in "running".
        log.exception("run %s failed unexpectedly", run.pk)
        _fail(run, redact(f"internal error: {type(exc).__name__}: {exc}"), "internal")
        raise


def _claim(run_id: int) -> Run | None:
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related("task").filter(pk=run_id).first()
        if run is None:
            log.warning("run %s does not exist; dropping its message", run_id)
            return None
        if run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED):
            log.info("run %s has already ended; dropping its message", run_id)
            return None
        resumed = run.deliveries > 0
        now = timezone.now()
        run.status = RunStatus.RUNNING
        run.deliveries += 1
        run.claim_epoch += 1  # fences off whatever process held the run before
        run.worker_host = socket.gethostname()
        run.worker_pid = os.getpid()
        run.heartbeat_at = now
        run.started_at = run.started_at or now
        run.save(
            update_fields=[
                "status",
                "deliveries",
                "claim_epoch",
                "worker_host",
                "worker_pid",
                "heartbeat_at",
                "started_at",
            ]
        )
        # We hold the run's lock, so anything still marked in flight belongs to a process that died.
        lost = list(
            Attempt.objects.filter(step__run=run, status=Attempt.Status.STARTED).select_related("step")
        )
        for attempt in lost:
            _attempt_lost(run, attempt, now)
        Step.objects.filter(run=run, status=StepStatus.RUNNING).update(status=StepStatus.PENDING)
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            Task.objects.filter(pk=run.task_id, status=RunStatus.QUEUED).update(status=RunStatus.RUNNING)
        _audit(
            run,
            "run.resumed" if resumed else "run.started",
            run,
            {
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
            },
        )
    return run


# --- planning -----------------------------------------------------------------------------------


def _attempt_lost(run: Run, attempt: Attempt, now: Any) -> None:
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
    _add_cost(run, cost=cost, input_tokens=input_tokens, output_tokens=output_tokens)


def _claim_current(run: Run) -> None:
    """Before a provider call: stop if the lock's connection was lost (no database round trip)."""
    lost = getattr(run, "_claim_lost", None)
    if lost is not None and lost.is_set():
        raise Fenced(f"run {run.pk}: the lock's connection was lost; this process stops before its next call")


def _screened_workers(task: Task) -> tuple[list[Worker], dict[str, policies.Verdict]]:
    """Enabled workers the task's data may go to, and those its policies withhold (with the rule)."""
    return policies.screen(list(Worker.objects.filter(enabled=True).order_by("slug")), task.classification)


def _offerable_workers(task: Task) -> tuple[list[Worker], dict[str, policies.Verdict]]:
    workers, withheld = _screened_workers(task)
    if not workers:
        reasons = "; ".join(f"{v.worker}: {v.rule}" for v in withheld.values()) or "no enabled workers"
        raise RunStopped(
            f"no enabled worker may receive {task.classification} data ({reasons})",
            stop_reason="policy_blocked" if withheld else "no_workers",
        )
    return workers, withheld


def _steps_used(run: Run) -> int:
    return Step.objects.filter(run=run).count()


def _ensure_plan(run: Run, *, parent_step: Step | None, depth: int) -> Decision:
    """The valid decision for this level of the run, asking the conductor if there is none yet."""
    decisions = Decision.objects.filter(run=run, parent_step=parent_step)
    valid = decisions.filter(valid=True).first()
    if valid is not None:
        return valid
    task = run.task
    workers, withheld = _offerable_workers(task)
    remaining = task.max_steps - _steps_used(run)
    if remaining <= 0:
        raise RunStopped(
            f"step budget of {task.max_steps} reached before planning", stop_reason="step_budget"
        )
    parent_context: dict[str, Any] = {}
    if parent_step is not None:
        parent_context = {
            "parent_plan": parent_step.decision.plan,
            "last_response": _last_response_before(parent_step),
            "visible_responses": tuple(s.response for s in _visible_steps(parent_step)),
        }
    conductor = conductor_for(run.conductor_version)
    tries = decisions.count()
    last_blocked: policies.Verdict | None = None
    feedback = decisions.order_by("-attempt").values_list("error", flat=True).first() or ""
    asked = False
    while tries < PLAN_TRIES:
        tries += 1
        if asked:  # rules may have changed while the conductor answered: offer what they allow now
            workers, withheld = _offerable_workers(task)
        asked = True
        request = PlanRequest(
            task_text=task.text,
            domain=task.domain,
            workers=[WorkerCard.of(w) for w in workers],
            max_steps=min(MAX_STEPS, remaining),
            may_recurse=depth < task.max_depth,
            feedback=feedback,
            temperature=run.temperature,
            seed=run.pk * 100 + depth * 10 + tries,
            **parent_context,
        )
        if run.plan_override and parent_step is None:
            # A trainer's sampled plan: executed as written, never re-asked (an invalid one is its reward).
            proposal = Proposal(raw_output=run.plan_override)
        else:
            proposal = _propose(run, conductor, request)
        plan: Plan | None = None
        error = ""
        blocked: policies.Verdict | None = None
        try:
            # Withheld workers parse, so that a plan naming one is recorded as blocked by its rule.
            plan = parse_plan(
                proposal.raw_output,
                allowed_workers=set(request.allowed_slugs) | set(withheld),
                max_steps=request.max_steps,
                allow_empty=parent_step is not None,
            )
        except PlanError as exc:
            error = str(exc)
        checks: dict[str, Any] = {
            "withheld": {slug: v.as_dict() for slug, v in withheld.items()},
            "steps": [],
        }
        if plan is not None:
            for i, step in enumerate(plan.steps):
                verdict = withheld.get(step.worker)
                if verdict is None and step.worker in request.allowed_slugs and step.worker != CONDUCTOR_SLUG:
                    verdict = policies.judge(
                        next(w for w in workers if w.slug == step.worker),
                        task.classification,
                        policies.active_rules(),
                    )
                checks["steps"].append(
                    {
                        "index": i,
                        **(
                            verdict.as_dict()
                            if verdict
                            else {
                                "worker": step.worker,
                                "allowed": True,
                                "rule": "",
                                "reason": "the conductor itself",
                            }
                        ),
                    }
                )
                if blocked is None and verdict is not None and not verdict.allowed:
                    blocked = verdict
                    error = (
                        f"blocked by policy '{verdict.rule}': step {i} ({verdict.worker}): {verdict.reason}"
                    )
            if blocked is not None:
                plan = None
        decision = _record_decision(
            run,
            parent_step=parent_step,
            depth=depth,
            attempt=tries,
            proposal=proposal,
            plan=plan,
            error=error,
            workers={w.slug: w for w in workers},
            policy_checks=checks,
            blocked_by=blocked.rule if blocked else "",
        )
        if plan is not None:
            return decision
        feedback = error
        last_blocked = blocked
        if run.plan_override and parent_step is None:
            raise RunStopped(f"the given plan is invalid: {error}", stop_reason="invalid_plan")
    if last_blocked is not None:
        raise RunStopped(f"the conductor's plan was blocked twice; {feedback}", stop_reason="policy_blocked")
    raise RunStopped(
        f"the conductor's plan was invalid twice; last error: {feedback}", stop_reason="invalid_plan"
    )


def _propose(run: Run, conductor: Conductor, request: PlanRequest) -> Proposal:
    """Ask the conductor, retrying timeouts, 429 and 5xx like any provider call; each failure is audited."""
    made = 0
    while True:
        _claim_current(run)
        try:
            return conductor.propose(request)
        except ConductorUnavailable as exc:
            raise RunStopped(str(exc), stop_reason="conductor_unavailable") from exc
        except ProviderCallError as exc:
            made += 1
            with transaction.atomic():
                _audit(
                    run,
                    "conductor.call_failed",
                    run,
                    {
                        "attempt": made,
                        "status": exc.status,
                        "http_status": exc.http_status,
                        "error": str(exc),
                    },
                )
            if not exc.retryable or made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS:
                raise RunStopped(
                    f"the conductor could not be reached after {made} attempt(s): {exc}",
                    stop_reason="conductor_unavailable",
                ) from exc
            time.sleep(_backoff(made, exc.retry_after))


def _record_decision(
    run: Run,
    *,
    parent_step: Step | None,
    depth: int,
    attempt: int,
    proposal: Proposal,
    plan: Plan | None,
    error: str,
    workers: dict[str, Worker],
    policy_checks: dict[str, Any],
    blocked_by: str,
) -> Decision:
    version = run.conductor_version
    # A plan given with the run (a trainer's sample) is recorded as such, not as the version's own.
    backend = "given" if run.plan_override and parent_step is None else version.backend
    with transaction.atomic():
        decision = Decision.objects.create(
            run=run,
            parent_step=parent_step,
            depth=depth,
            attempt=attempt,
            backend=backend,
            version_name=version.name,
            prompt=proposal.prompt,
            raw_output=proposal.raw_output,
            plan=plan.as_dict() if plan is not None else None,
            valid=plan is not None,
            error=error,
            alternatives=proposal.alternatives,
            policy_checks=policy_checks,
            blocked_by=blocked_by,
            input_tokens=proposal.input_tokens,
            output_tokens=proposal.output_tokens,
            cost_usd=proposal.cost_usd,
            latency_ms=proposal.latency_ms,
        )
        _add_cost(
            run,
            cost=proposal.cost_usd,
            input_tokens=proposal.input_tokens,
            output_tokens=proposal.output_tokens,
        )
        if plan is not None:
            Step.objects.bulk_create(
                [
                    Step(
                        run=run,
                        decision=decision,
                        index=i,
                        depth=depth,
                        worker=workers.get(s.worker),
                        worker_slug=s.worker,
                        vendor=workers[s.worker].vendor if s.worker in workers else "",
                        instruction=s.instruction,
                        access=s.access,
                    )
                    for i, s in enumerate(plan.steps)
                ]
            )
        _audit(
            run,
            "plan.emitted" if plan is not None else ("plan.blocked" if blocked_by else "plan.rejected"),
            decision,
            {
                "backend": backend,
                "version": version.name,
                "depth": depth,
                "attempt": attempt,
                "parent_step_id": parent_step.pk if parent_step else None,
                "raw_output": proposal.raw_output,
                "plan": plan.as_dict() if plan is not None else None,
                "error": error,
                "alternatives": proposal.alternatives,
                "policy_checks": policy_checks,
                "blocked_by": blocked_by,
            },
        )
    return decision


# --- executing a plan ---------------------------------------------------------------------------


def _dependencies(step: Step) -> list[int]:
    return visible_indices(step.access, step.index)


def _execute_plan(run: Run, decision: Decision) -> None:
    """Run the plan's steps; independent steps run concurrently. Raises RunStopped on failure."""
    steps = {s.index: s for s in decision.steps.all()}
    done = {i for i, s in steps.items() if s.status == StepStatus.SUCCEEDED}
    in_flight: dict[Future[None], int] = {}
    with ThreadPoolExecutor(
        max_workers=settings.CONDUCTOR_STEP_CONCURRENCY, thread_name_prefix=f"run{run.pk}"
    ) as pool:
        first_error: RunStopped | None = None
        while True:
            if first_error is None:
                for index, step in sorted(steps.items()):
                    if index in done or index in in_flight.values():
                        continue
                    if all(dep in done for dep in _dependencies(step)):
                        in_flight[pool.submit(_in_thread, _execute_step, run, step.pk)] = index
            if not in_flight:
                break
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in finished:
                index = in_flight.pop(future)
                try:
                    future.result()
                    done.add(index)
                except RunStopped as stop:
                    first_error = first_error or stop
        if first_error is not None:
            raise first_error
    if len(done) != len(steps):  # pragma: no cover - the schedule above always reaches every step
        raise RunStopped("some steps could not be scheduled", stop_reason="internal")


def _in_thread(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    finally:
        connections.close_all()  # each thread has its own connection; do not leak them


def _visible_steps(step: Step) -> list[Step]:
    indices = _dependencies(step)
    return list(Step.objects.filter(decision_id=step.decision_id, index__in=indices).order_by("index"))


def _last_response_before(step: Step) -> str:
    previous = (
        Step.objects.filter(decision_id=step.decision_id, index__lt=step.index, status=StepStatus.SUCCEEDED)
        .order_by("-index")
        .values_list("response", flat=True)
        .first()
    )
    return previous or ""


def build_messages(step: Step, visible: list[Step]) -> list[dict[str, str]]:
    """Exactly what a worker receives: its instruction and the steps its access list grants."""
    parts = []
    if visible:
        parts.append("Results of earlier steps:")
        for earlier in visible:
            parts.append(
                f"--- Step {earlier.index} ({earlier.worker_slug})\nInstruction:\n{earlier.instruction}\n\nResponse:\n{earlier.response}"
            )
        parts.append("--- Your subtask")
    parts.append(step.instruction)
    return [
        {"role": "system", "content": WORKER_SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _start_step(run: Run, step_id: int) -> Step | None:
    with transaction.atomic():
        step = (
            Step.objects.select_for_update(of=("self",)).select_related("worker", "decision").get(pk=step_id)
        )
        if step.status == StepStatus.SUCCEEDED:
            return None
        visible = _visible_steps(step)
        step.status = StepStatus.RUNNING
        step.started_at = step.started_at or timezone.now()
        if not step.is_conductor:
            step.messages_sent = build_messages(step, visible)
        step.save(update_fields=["status", "started_at", "messages_sent"])
        Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
        _audit(
            run,
            "step.started",
            step,
            {
                "index": step.index,
                "depth": step.depth,
                "worker": step.worker_slug,
                "vendor": step.vendor,
                "model": step.worker.litellm_model if step.worker else None,
                "classification": run.task.classification,
                "sees_steps": [s.pk for s in visible],
                "sees_step_hashes": {str(s.pk): content_hash(s.response) for s in visible},
                "messages_sha256": content_hash(step.messages_sent) if step.messages_sent else None,
            },
        )
    return step


def _execute_step(run: Run, step_id: int) -> None:
    step = _start_step(run, step_id)
    if step is None:
        return
    if step.is_conductor:
        _execute_conductor_step(run, step)
    else:
        _call_worker(run, step)


def _spent(run: Run) -> Decimal:
    return Run.objects.filter(pk=run.pk).values_list("cost_usd", flat=True).get()


def _check_cost_budget(run: Run, step: Step) -> None:
    spent = _spent(run)
    if spent >= run.task.max_usd:
        message = f"cost budget of ${run.task.max_usd} reached (spent ${spent}) before step {step.index} ({step.worker_slug})"
        _step_failed(run, step, message, note="cost budget")
        raise RunStopped(message, stop_reason="cost_budget")


def _backoff(attempt_number: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, settings.CONDUCTOR_RETRY_AFTER_MAX_S)  # the provider said how long
    base = settings.CONDUCTOR_RETRY_BACKOFF_S * (2 ** (attempt_number - 1))
    return min(base, settings.CONDUCTOR_RETRY_BACKOFF_MAX_S) * (0.5 + random.random() / 2)


def _call_worker(run: Run, step: Step) -> None:
    worker = step.worker
    if worker is None or not worker.enabled:
        message = (
            f"step {step.index} names worker {step.worker_slug!r}, which is not registered or not enabled"
        )
        _step_failed(run, step, message)
        raise RunStopped(message, stop_reason="unknown_worker")
    verdict = policies.judge(worker, run.task.classification, policies.active_rules())
    if not verdict.allowed:  # a rule may have changed since the plan was checked
        message = f"step {step.index} blocked by policy '{verdict.rule}' before the call: {verdict.reason}"
        _step_failed(run, step, message, note=f"policy {verdict.rule}")
        raise RunStopped(message, stop_reason="policy_blocked")
    counted = step.attempts.exclude(status=Attempt.Status.LOST)
    made = counted.count()
    number = (step.attempts.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    while True:
        _check_cost_budget(run, step)
        _claim_current(run)
        with transaction.atomic():
            _fence(run)
            attempt = Attempt.objects.create(step=step, number=number, started_at=timezone.now())
        started = time.monotonic()
        try:
            completion = complete(
                model=worker.litellm_model,
                messages=step.messages_sent,
                api_base=worker.api_base,
                api_key=worker_api_key(worker),  # a key outside the allow-list fails this attempt, unmade
                metadata={"replay_item": run.task.source_item, "run": str(run.correlation_id)},
            )
        except ProviderCallError as exc:
            made += 1
            latency_ms = int((time.monotonic() - started) * 1000)
            last = not exc.retryable or made >= settings.CONDUCTOR_PROVIDER_MAX_ATTEMPTS
            _attempt_failed(run, step, attempt, exc, latency_ms=latency_ms)
            if last:
                if exc.code:  # a known outcome (the replay pool has no answer): its own words, its own reason
                    message = f"step {step.index} ({step.worker_slug}): {exc}"
                else:
                    message = (
                        f"step {step.index} ({step.worker_slug}) failed after {made} attempt(s): {exc.status}"
                        + (f" (HTTP {exc.http_status})" if exc.http_status else "")
                        + f": {exc}"
                    )
                _step_failed(run, step, message)
                raise RunStopped(message, stop_reason=exc.code or "step_failed") from exc
            time.sleep(_backoff(made, exc.retry_after))
            number += 1
            continue
        latency_ms = int((time.monotonic() - started) * 1000)
        _attempt_succeeded(run, step, attempt, completion, latency_ms=latency_ms)
        return


def _add_cost(run: Run, *, cost: Decimal, input_tokens: int, output_tokens: int) -> None:
    """Roll a cost up to the run and its task, in the caller's transaction."""
    if not (cost or input_tokens or output_tokens):
        return
    Run.objects.filter(pk=run.pk).update(
        cost_usd=F("cost_usd") + cost,
        input_tokens=F("input_tokens") + input_tokens,
        output_tokens=F("output_tokens") + output_tokens,
        heartbeat_at=timezone.now(),
    )
    Task.objects.filter(pk=run.task_id).update(
        cost_usd=F("cost_usd") + cost,
        input_tokens=F("input_tokens") + input_tokens,
        output_tokens=F("output_tokens") + output_tokens,
    )


def _attempt_failed(
    run: Run, step: Step, attempt: Attempt, exc: ProviderCallError, *, latency_ms: int
) -> None:
    with transaction.atomic():
        attempt.status = exc.status
        attempt.http_status = exc.http_status
        attempt.error = str(exc)
        attempt.latency_ms = latency_ms
        attempt.finished_at = timezone.now()
        attempt.save(update_fields=["status", "http_status", "error", "latency_ms", "finished_at"])
        _audit(
            run,
            "attempt.failed",
            attempt,
            {
                "step_id": step.pk,
                "number": attempt.number,
                "status": exc.status,
                "http_status": exc.http_status,
                "error": str(exc),
                "code": exc.code,
                "vendor": step.vendor,
                "retryable": exc.retryable,
            },
        )


def _attempt_succeeded(run: Run, step: Step, attempt: Attempt, completion: Any, *, latency_ms: int) -> None:
    assert step.worker is not None
    cost = step.worker.cost_of(input_tokens=completion.input_tokens, output_tokens=completion.output_tokens)
    now = timezone.now()
    with transaction.atomic():
        attempt.status = Attempt.Status.SUCCEEDED
        attempt.input_tokens = completion.input_tokens
        attempt.output_tokens = completion.output_tokens
        attempt.cost_usd = cost
        attempt.latency_ms = latency_ms
        attempt.provider_request_id = completion.request_id[:200]
        attempt.finished_at = now
        attempt.save()
        totals = step.attempts.aggregate(
            cost=Sum("cost_usd"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens")
        )
        Step.objects.filter(pk=step.pk).update(
            status=StepStatus.SUCCEEDED,
            response=completion.text,
            cost_usd=totals["cost"],
            input_tokens=totals["input_tokens"],
            output_tokens=totals["output_tokens"],
            latency_ms=int((now - step.started_at).total_seconds() * 1000) if step.started_at else latency_ms,
            finished_at=now,
            error="",
        )
        _add_cost(
            run, cost=cost, input_tokens=completion.input_tokens, output_tokens=completion.output_tokens
        )
        _audit(
            run,
            "step.succeeded",
            step,
            {
                "index": step.index,
                "worker": step.worker_slug,
                "vendor": step.vendor,
                "attempt": attempt.number,
                "input_tokens": completion.input_tokens,
                "output_tokens": completion.output_tokens,
                "cost_usd": cost,
                "latency_ms": latency_ms,
                "response_sha256": content_hash(completion.text),
            },
        )


def _step_failed(run: Run, step: Step, message: str, *, note: str = "") -> None:
    with transaction.atomic():
        Step.objects.filter(pk=step.pk).update(
            status=StepStatus.FAILED, error=message, note=note, finished_at=timezone.now()
        )
        _audit(
            run,
            "step.failed",
            step,
            {"index": step.index, "worker": step.worker_slug, "error": message, "note": note},
        )


def _execute_conductor_step(run: Run, step: Step) -> None:
    """The conductor as a worker: plan a nested workflow, run it, and answer with its final response.

    An empty nested plan passes the last response through. Past the depth cap the engine passes it
    through without asking (a plan can only name the conductor while depth < max_depth, so this
    guards against resumed runs whose budgets changed).
    """
    child_depth = step.depth + 1
    if child_depth > run.task.max_depth:
        _step_passed_through(run, step, note=f"depth cap of {run.task.max_depth} reached: passed through")
        return
    try:
        child = _ensure_plan(run, parent_step=step, depth=child_depth)
    except RunStopped as stop:
        if stop.stop_reason == "step_budget":
            _step_passed_through(run, step, note="step budget reached: passed through")
            return
        _step_failed(run, step, str(stop))
        raise
    if not child.plan or not child.plan["steps"]:
        _step_passed_through(run, step, note="the conductor passed the last response through")
        return
    try:
        _execute_plan(run, child)
    except RunStopped as stop:
        _step_failed(run, step, str(stop))
        raise
    last = child.steps.order_by("-index").first()
    assert last is not None
    _step_answered(run, step, response=last.response, note=f"answered by nested plan (decision {child.pk})")


def _step_passed_through(run: Run, step: Step, *, note: str) -> None:
    _step_answered(run, step, response=_last_response_before(step), note=note)


def _step_answered(run: Run, step: Step, *, response: str, note: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        Step.objects.filter(pk=step.pk).update(
            status=StepStatus.SUCCEEDED,
            response=response,
            note=note,
            finished_at=now,
            latency_ms=int((now - step.started_at).total_seconds() * 1000) if step.started_at else None,
        )
        _audit(
            run,
            "step.succeeded",
            step,
            {
                "index": step.index,
                "worker": CONDUCTOR_SLUG,
                "note": note,
                "response_sha256": content_hash(response),
            },
        )


# --- finishing ----------------------------------------------------------------------------------


def _finish(run: Run, root: Decision) -> None:
    last = root.steps.order_by("-index").first()
    assert last is not None
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
    with transaction.atomic():
        if judged is not None:
            _add_cost(
                run,
                cost=judged.cost_usd,
                input_tokens=judged.input_tokens,
                output_tokens=judged.output_tokens,
            )
            _audit(run, "score.judged", run, judged.audit_payload())
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.SUCCEEDED,
            final_answer=final,
            score=score,
            finished_at=now,
            heartbeat_at=now,
            stop_reason="",
        )
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            Task.objects.filter(pk=task.pk).update(
                status=RunStatus.SUCCEEDED, final_answer=final, score=score, finished_at=now, error=""
            )
        _settle_steps(run, now, reason="the run finished without it")
        totals = Run.objects.filter(pk=run.pk).values("cost_usd", "input_tokens", "output_tokens").get()
        _audit(
            run,
            "run.succeeded",
            run,
            {
                "final_step_id": last.pk,
                "final_answer_sha256": content_hash(final),
                "score": score,
                "extracted_answer": extracted,
                "scorer": scorers.scorer_name(task.scorer, task.domain) if score is not None else None,
                **totals,
            },
        )
        run_chain_seal(correlation_id=run.correlation_id, run=run, task_id=task.pk)
        _settle_training_task(run, now)


def _fail(run: Run, message: str, stop_reason: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        _settle_steps(run, now, reason=f"the run stopped ({stop_reason}): {message}")
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.FAILED, error=message, stop_reason=stop_reason, finished_at=now, heartbeat_at=now
        )
        if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
            Task.objects.filter(pk=run.task_id).update(
                status=RunStatus.FAILED, error=message, finished_at=now
            )
        _audit(
            run,
            "run.failed",
            run,
            {"error": message, "stop_reason": stop_reason},
        )
        run_chain_seal(correlation_id=run.correlation_id, run=run, task_id=run.task_id)
        _settle_training_task(run, now)


def _settle_steps(run: Run, now: Any, *, reason: str) -> None:
    """Every step of an ending run, nested levels included, ends in a terminal state with the reason.

    Call inside the transaction that ends the run, before its chain is sealed. A step that never
    started is skipped; one left running (an unexpected error stopped the run mid-step) failed. Each
    change is an engine event, like any other change of a step's state.
    """
    unsettled = list(
        Step.objects.select_for_update(of=("self",))
        .filter(run=run, status__in=[StepStatus.PENDING, StepStatus.RUNNING])
        .order_by("depth", "decision_id", "index")
    )
    for step in unsettled:
        if step.status == StepStatus.PENDING:
            step.status = StepStatus.SKIPPED
            step.note = f"not run: {reason}"
            action = "step.skipped"
        else:
            step.status = StepStatus.FAILED
            step.error = f"interrupted: {reason}"
            action = "step.failed"
        step.finished_at = now
        step.save(update_fields=["status", "note", "error", "finished_at"])
        _audit(
            run,
            action,
            step,
            {
                "index": step.index,
                "depth": step.depth,
                "worker": step.worker_slug,
                "error": step.error if action == "step.failed" else "",
                "note": step.note if action == "step.skipped" else "",
                "settled_with_run": True,
            },
        )


def _settle_training_task(run: Run, now: Any) -> None:
    """A training item's task (rollouts, evaluations; no live run) is done when its last run ends."""
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY, Run.Kind.SHADOW):
        return
    # The task row is locked first: two runs ending at once each see the other finished, in turn.
    Task.objects.select_for_update().filter(pk=run.task_id).values_list("pk", flat=True).first()
    unfinished = Run.objects.filter(task_id=run.task_id).exclude(
        status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED]
    )
    Task.objects.filter(pk=run.task_id, source=Task.Source.TRAINING).exclude(Exists(unfinished)).update(
        status=RunStatus.SUCCEEDED, finished_at=now
    )
