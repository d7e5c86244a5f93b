"""Taking a run: the advisory lock on its own connection, the keeper that proves the lock alive, the
claim (a new epoch that fences off any earlier process), and the entry point that executes a run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from decimal import Decimal
from typing import Any

import litellm
import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit import chain as audit_chain
from audit import policies, rows
from audit.actions import Action
from audit.models import GLOBAL_CHAIN, ChainHead
from audit.rows import prepared_cursor

from .. import log_context
from ..models import (
    Attempt,
    ConductorVersion,
    Decision,
    Run,
    RunStatus,
    Step,
    StepStatus,
    StopReason,
    Task,
)
from ..secrets import redact
from .finish import EndWithLastStep, fail_run, finish_run
from .planning import ensure_plan
from .record import (
    INFRASTRUCTURE_ERRORS,
    Fence,
    Fenced,
    Guard,
    InfrastructureError,
    RunStopped,
    Writes,
    add_cost,
    fenced,
    ids_drawn_sql,
    record_event,
)
from .schedule import execute_plan
from .workers import WORKERS_STAMP_SQL

log = logging.getLogger(__name__)


ADVISORY_LOCK_NAMESPACE = 0x436F6E64  # "Cond": keeps run locks apart from other advisory locks


class _Keeper:
    """Keeps the lock's connection busy and watched: every CONDUCTOR_HEARTBEAT_S it writes the run's
    heartbeat through it, fenced by the claim epoch. If the connection dies (an idle-session timeout, a
    reaper, a restart) the lock is gone with it: `lost` is set and the engine stops before its next
    write or call. The beats are sent by the process's one heartbeat thread (HEARTBEATS): a thread
    started for each run cost more than the run's own writes."""

    def __init__(self, lock_conn: psycopg.Connection, run: Run):
        self.lock_conn, self.run = lock_conn, run
        self.lost = threading.Event()
        self.using = threading.Lock()  # a beat and the lock's release never share the connection
        self.done = False
        self.due = 0.0

    def __enter__(self) -> _Keeper:
        self.run._claim_lost = self.lost  # type: ignore[attr-defined]
        HEARTBEATS.add(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        HEARTBEATS.remove(self)
        with self.using:  # a beat being sent ends first: the connection is the lock's again
            self.done = True

    def beat(self) -> None:
        with self.using:
            if self.done or self.lost.is_set():
                return
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


class Heartbeats:
    """The process's heartbeat thread: beats each run this process holds every CONDUCTOR_HEARTBEAT_S
    (its first beat that long after its claim). Started with the first run, and again if it ever
    stopped, or in a forked child (a thread does not survive a fork)."""

    def __init__(self) -> None:
        self._forked()

    def _forked(self) -> None:
        """Afresh (in a forked child, its parent's thread, runs and lock are not its own)."""
        self._keepers: set[_Keeper] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, keeper: _Keeper) -> None:
        with self._changed:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._beat, name="run-heartbeats", daemon=True)
                self._thread.start()
            keeper.due = time.monotonic() + settings.CONDUCTOR_HEARTBEAT_S
            self._keepers.add(keeper)
            self._changed.notify()

    def remove(self, keeper: _Keeper) -> None:
        with self._changed:
            self._keepers.discard(keeper)

    def _beat(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [k for k in self._keepers if k.due <= now]
                for keeper in due:
                    keeper.due = now + settings.CONDUCTOR_HEARTBEAT_S
                wake = min((k.due for k in self._keepers), default=now + settings.CONDUCTOR_HEARTBEAT_S)
                if not due:
                    self._changed.wait(max(0.0, wake - now))
                    continue
            for keeper in due:  # outside the mutex: a slow beat does not hold up claims and releases
                try:
                    keeper.beat()
                except Exception:  # a bug in one beat must not stop the others' (nor later runs')
                    log.exception("run %s: its heartbeat failed", keeper.run.pk)


HEARTBEATS = Heartbeats()
os.register_at_fork(after_in_child=HEARTBEATS._forked)


class LockConnections:
    """Connections for advisory locks, kept between locks: a connection is a PostgreSQL backend, and
    opening one for each run cost more than a step. A connection goes back only when its lock was
    released cleanly; one that died (the run's keeper saw it, or its server ended it) is dropped."""

    KEEP = 4

    def __init__(self) -> None:
        self._idle: dict[str, list[psycopg.Connection]] = {}
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._inherited: list[dict[str, list[psycopg.Connection]]] = []

    def take(self, params: dict[str, Any], *, fresh: bool = False) -> psycopg.Connection:
        """A kept connection to the database `params` name, or (none kept, or `fresh`) a new one."""
        key = repr(sorted(params.items()))
        conn = None
        with self._mutex:
            if self._pid != os.getpid():  # a forked child: the parent's connections are not its own
                # Kept, never closed here: closing would end the parent's sessions on the server.
                self._inherited.append(self._idle)
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get(key) or []
            if idle and not fresh:
                conn = idle.pop()
        if conn is not None:
            if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                return conn
            with contextlib.suppress(psycopg.Error):
                conn.close()  # not usable: not handed out, not left to the garbage collector
        conn = psycopg.connect(**params, autocommit=True)
        conn._lock_key = key  # type: ignore[attr-defined]
        return conn

    def give(self, conn: psycopg.Connection) -> None:
        with self._mutex:
            idle = self._idle.setdefault(conn._lock_key, [])  # type: ignore[attr-defined]
            if len(idle) < self.KEEP and self._pid == os.getpid():
                idle.append(conn)
                return
        conn.close()

    def close_all(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                with contextlib.suppress(psycopg.Error):
                    conn.close()


LOCK_CONNECTIONS = LockConnections()


@contextmanager
def advisory_lock_connection(namespace: int, key: int) -> Iterator[psycopg.Connection | None]:
    """Hold an advisory lock on a connection of its own (the lock dies with the process); yields that
    connection, or None if another process holds the lock."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    lock_conn = LOCK_CONNECTIONS.take(params)
    try:
        acquired = _try_lock(lock_conn, namespace, key)
    except psycopg.OperationalError:  # a kept connection the server ended meanwhile: a new one
        with contextlib.suppress(psycopg.Error):
            lock_conn.close()  # whatever it held goes with it
        lock_conn = LOCK_CONNECTIONS.take(params, fresh=True)
        acquired = _try_lock(lock_conn, namespace, key)
    released = not acquired
    try:
        yield lock_conn if acquired else None
    finally:
        if acquired and not lock_conn.closed and getattr(lock_conn, "_release_later", False):
            # What it guarded is over for good (release_later): let go with the next lock the
            # connection takes, or with the connection; no round trip of its own.
            lock_conn._release_later = False  # type: ignore[attr-defined]
            lock_conn._pending_unlock = (namespace, key)  # type: ignore[attr-defined]
            released = True
        elif acquired and not lock_conn.closed:
            with contextlib.suppress(psycopg.Error):  # a dead connection took the lock with it
                released = _call(lock_conn, "pg_advisory_unlock", namespace, key)
        if released and not lock_conn.closed:
            LOCK_CONNECTIONS.give(lock_conn)
        else:
            with contextlib.suppress(psycopg.Error):
                lock_conn.close()


def release_later(lock_conn: psycopg.Connection) -> None:
    """The lock held on `lock_conn` (advisory_lock_connection's) is let go with the next lock taken
    on the connection, in that statement, or with the connection, rather than in a round trip of
    its own: for a lock whose object nobody needs again (a run that ended: another delivery of it
    finds it ended, and no process looks for ended runs' locks)."""
    lock_conn._release_later = True  # type: ignore[attr-defined]


def _try_lock(conn: psycopg.Connection, namespace: int, key: int) -> bool:
    pending = getattr(conn, "_pending_unlock", None)
    if pending is None:
        return _call(conn, "pg_try_advisory_lock", namespace, key)
    conn._pending_unlock = None  # type: ignore[attr-defined]  # let go in this statement, or with the connection
    row = conn.execute(
        "SELECT pg_advisory_unlock(%s, %s), pg_try_advisory_lock(%s, %s)", (*pending, namespace, key)
    ).fetchone()
    return bool(row and row[1])


def _call(conn: psycopg.Connection, function: str, namespace: int, key: int) -> bool:
    row = conn.execute(f"SELECT {function}(%s, %s)", (namespace, key)).fetchone()  # noqa: S608 - a name
    return bool(row and row[0])


@contextmanager
def advisory_lock(namespace: int, key: int) -> Iterator[bool]:
    """Hold an advisory lock on a connection of its own; yields False if another process holds it."""
    with advisory_lock_connection(namespace, key) as lock_conn:
        yield lock_conn is not None


def run_lock(run_id: int) -> AbstractContextManager[psycopg.Connection | None]:
    """The run's lock: one process executes a run at a time. Yields the lock's connection, or None."""
    return advisory_lock_connection(ADVISORY_LOCK_NAMESPACE, run_id)


def advisory_locked(namespace: int, key: int) -> bool:
    """Whether another process holds the lock (probed by taking it for a moment)."""
    with advisory_lock(namespace, key) as acquired:
        return not acquired


def run_is_locked(run_id: int) -> bool:
    """Whether another process holds the run's lock. For a run not ended: a run that ended may keep
    its lock a while on the connection of the process that ended it (release_later)."""
    return advisory_locked(ADVISORY_LOCK_NAMESPACE, run_id)


def execute_run(run_id: int) -> None:
    """Claim a run and execute it. Raises InfrastructureError when the database failed under it."""
    try:
        with run_lock(run_id) as lock_conn:
            if lock_conn is None:
                log.info("run %s is being executed by another process; leaving it", run_id)
                return
            run = claim_run(run_id)
            if run is None:
                return
            with log_context.bound(run), _Keeper(lock_conn, run):
                _execute(run)
            release_later(lock_conn)  # the run ended
    except Fenced as fenced:
        log.warning("%s", fenced)
    except INFRASTRUCTURE_ERRORS as exc:
        raise InfrastructureError(f"run {run_id}: {type(exc).__name__}: {exc}") from exc


def _execute(run: Run) -> None:
    try:
        root = ensure_plan(run, parent_step=None, depth=0)
        ending = EndWithLastStep(run)  # the last step's success and the run's end, one statement
        last = execute_plan(run, root, ending=ending)
        if not ending.ended:
            finish_run(run, last=last)
    except RunStopped as stop:
        fail_run(run, str(stop), stop.stop_reason)
    except (Fenced, *INFRASTRUCTURE_ERRORS):
        raise  # not the run's failure: nothing may (or can) be written; the next delivery resumes it
    except Exception as exc:
        # A bug: leave a clear failed state rather than a run stuck in "running".
        log.exception("run %s failed unexpectedly", run.pk)
        fail_run(run, redact(f"internal error: {type(exc).__name__}: {exc}"), StopReason.INTERNAL)
        raise


def claim_run(run_id: int) -> Run | None:
    """Claim a run for this process (which holds its lock): a new claim epoch, which fences off any
    process that held it before, with its event. A first delivery is claimed in one statement, on the
    run as read just before (with the policy rules' stamp and its chain's head); anything else (a
    resumed run, with attempts a dead process left in flight; a run that moved meanwhile) under the
    run row's lock."""
    first = _first_delivery(run_id)
    if first is not None and _claim_first(first):
        return first
    return _claim_locked(run_id)


def _first_delivery(run_id: int) -> Run | None:
    """The run if this is its first delivery, with its task and conductor version, the rules' and
    workers' stamps and its chain's head: one prepared statement (as a queryset, compiling it cost
    more than running it)."""
    with prepared_cursor() as cursor:
        cursor.execute(_first_delivery_sql(), [run_id, RunStatus.SUCCEEDED, RunStatus.FAILED])
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
    (
        run.rules_stamp,  # type: ignore[attr-defined]
        run.workers_stamp,  # type: ignore[attr-defined]
        run.head_seq,  # type: ignore[attr-defined]
        run.head_hash,  # type: ignore[attr-defined]
        decision_ids,
        step_ids,
        run.global_head,  # type: ignore[attr-defined]  # finish.EndWithLastStep's: the seal has a head to go to
    ) = row[at:]
    run.ids_ahead = (int(decision_ids[0]), [int(i) for i in step_ids])  # type: ignore[attr-defined]
    return run


# The ids a first plan's rows take, drawn with the claim's read (record.next_ids says why they are
# drawn first): its decision's, and its steps', as many as the task allows up to this many (a plan of
# more steps, a plan asked again, a nested plan draw theirs when they are recorded).
IDS_AHEAD = 8


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
        "WHERE run_.id = %s AND run_.deliveries = 0 AND run_.status NOT IN (%s, %s)"
    )


def _claim_first(run: Run) -> bool:
    known = Fence(
        spent=run.cost_usd,
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
        rules_stamp=run.rules_stamp,  # type: ignore[attr-defined]
        workers_stamp=run.workers_stamp,  # type: ignore[attr-defined]
    )
    if run.head_seq is not None:  # type: ignore[attr-defined]
        audit_chain.guess(audit_chain.run_chain(run.correlation_id), run.head_seq, run.head_hash)  # type: ignore[attr-defined]
    # The claim's commit does not wait for the WAL's flush (Guard.flush): lost in a crash of the server,
    # the run is as it was, and is delivered again. What the run does next is recorded by the plan's
    # statement, whose commit flushes the claim's with it.
    guard = Guard(known, epoch=run.claim_epoch, status=run.status, flush=False)
    _claimed(run, timezone.now())
    writes = Writes(run)
    writes.update(run, **{name: getattr(run, name) for name in CLAIMED_FIELDS})
    if run.kind in (Run.Kind.LIVE, Run.Kind.RETRY):
        writes.update(run.task, only_if={"status": RunStatus.QUEUED}, status=RunStatus.RUNNING)
    writes.event(Action.RUN_STARTED, run, _claim_payload(run, lost=[]))
    if not writes.execute(guard=guard):
        return False
    run._known = known  # type: ignore[attr-defined]  # what the run's next writes assume
    return True


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


def _claimed(run: Run, now: Any) -> None:
    resumed = run.deliveries > 0
    run.resumed = resumed  # type: ignore[attr-defined]  # a first delivery has nothing to look up
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


def _claim_locked(run_id: int) -> Run | None:
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
        now = timezone.now()
        _claimed(run, now)
        resumed = run.resumed  # type: ignore[attr-defined]
        run.save(update_fields=list(CLAIMED_FIELDS))
        # We hold the run's lock, so anything still marked in flight belongs to a process that died
        # (a first delivery has nothing yet).
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
        # The claim's fence, with the policy rules' stamp: what the plan is checked against, and what
        # the run's next writes assume (record.write_once).
        with fenced(run, rules=True):
            record_event(
                run,
                Action.RUN_RESUMED if resumed else Action.RUN_STARTED,
                run,
                _claim_payload(run, lost=lost),
            )
    return run


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
