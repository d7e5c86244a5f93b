"""What every part of the engine writes through: the audit event of a change (which also fences
the claim), the cost roll-up, and the errors that stop a run or a process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, TypeVar

import psycopg
from django import db as django_db
from django.db import connection, transaction
from django.db.models import F, Field, Model
from django.utils import timezone

from audit import chain as audit_chain
from audit import policies, rows
from audit.models import AuditEvent
from audit.services import ENGINE, event_fields, event_record

from .. import live, log_context
from ..models import Run, StepStatus, Task, Worker
from .workers import WORKERS_STAMP_SQL, workers_as_of

log = logging.getLogger(__name__)
events_log = logging.getLogger("routing.events")  # a line per engine event: what log platforms join on


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


@dataclass(frozen=True)
class Fence:
    spent: Decimal  # the run's totals, the cost just added included
    input_tokens: int
    output_tokens: int
    rules_stamp: str  # the policy rules' stamp, when asked for (audit.policies.rules_as_of)
    workers_stamp: str = ""  # the workers' stamp, with the rules' (engine.workers.workers_as_of)

    def totals(self) -> dict[str, Any]:
        """The run's totals as its columns name them (cost_usd, input_tokens, output_tokens)."""
        return {
            "cost_usd": self.spent,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


@contextmanager
def fenced_write(
    run: Run,
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
    rules: bool = False,
    sets: dict[str, Any] | None = None,
) -> Iterator[Fence]:
    """A write transaction of the engine, fenced in its first statement: the run row is locked, a cost
    added to its totals (`sets`: and these columns of the run set), and the claim checked (`fence`).
    Yields what the run has spent so far (this cost included), for budget checks, and with `rules` the
    policy rules' stamp. The events recorded inside it do not fence again; if the claim is not this
    process's, the whole transaction rolls back."""
    with (
        transaction.atomic(),
        fenced(
            run,
            cost=cost,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            rules=rules,
            sets=sets,
        ) as fence_read,
    ):
        yield fence_read


@contextmanager
def fenced(
    run: Run,
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
    rules: bool = False,
    sets: dict[str, Any] | None = None,
) -> Iterator[Fence]:
    """`fenced_write` inside the caller's transaction (which it must be in)."""
    fence_read = fence(
        run, cost=cost, input_tokens=input_tokens, output_tokens=output_tokens, rules=rules, sets=sets
    )
    run._fenced = True  # type: ignore[attr-defined]
    try:
        yield fence_read
    finally:
        run._fenced = False  # type: ignore[attr-defined]


def record_event(
    run: Run, action: str, obj: Any, payload: dict[str, Any], *, seal: bool = False
) -> AuditEvent:
    """An engine event on the run's chain; call inside the transaction of the change it records.

    Watchers of the task get a small live event after commit, numbered by the event's place in the
    run's chain (gap-free), so a page can tell when it missed one.

    Every write transaction of the engine records an event, so this is also where the claim is fenced
    (unless the transaction is a `fenced_write`, which did it first): the run row is locked and its
    claim epoch must still be this process's, or the whole transaction (the change with its event)
    rolls back. `seal`: the run's last event, which seals its chain in the same statement.
    """
    if not getattr(run, "_fenced", False):
        fence(run)
    event = event_record(
        actor=ENGINE,
        action=action,
        obj=obj,
        task_id=run.task_id,
        correlation_id=run.correlation_id,
        payload=payload,
        seal=seal,
    )
    announce(run, event)
    return event


def announce(run: Run, *events: AuditEvent) -> None:
    """After the events' transaction commits: a small live event each for the task's watchers, numbered
    by the event's place in the run's chain (gap-free, so a page can tell when it missed one), and one
    JSON-ready log line each with the run's ids and trace id (log_context), what log platforms join
    on. One callback each for all the events of a statement (the log lines only when logged)."""
    shown = [
        {"run": run.pk, "seq": e.seq, "action": e.action, "object": e.object_type, "id": e.object_id}
        for e in events
    ]
    live.publish_on_commit(task_id=run.task_id, events=shown)
    if not events_log.isEnabledFor(logging.INFO):
        return
    ids = _log_ids(run)

    def log_lines() -> None:
        for event in shown:
            events_log.info(
                "%s %s %s",
                event["action"],
                event["object"],
                event["id"],
                extra={
                    "event": event["action"],
                    "object": event["object"],
                    "object_id": event["id"],
                    "seq": event["seq"],
                    **ids,
                },
            )

    transaction.on_commit(log_lines)


def _log_ids(run: Run) -> dict[str, str]:
    """The run's ids for its log lines (log_context), worked out once per run object."""
    ids: dict[str, str] | None = getattr(run, "_log_ids", None)
    if ids is None:
        ids = run._log_ids = log_context.ids_of(run)  # type: ignore[attr-defined]
    return ids


def fence(
    run: Run,
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
    rules: bool = False,
    sets: dict[str, Any] | None = None,
) -> Fence:
    """Inside a write transaction: lock the run row and check that this process's claim is current.
    One statement, which also adds a cost to the run's totals and (`rules`) reads the policy rules'
    stamp. Returns the totals and the stamp.

    It does not beat the run's heartbeat (the keeper does, on the lock's connection): heartbeat_at is
    indexed, so an UPDATE of it writes a new version of the row into each of the run's indexes, and a
    step's fences did that several times over. A fence with no cost only locks the row; one with a
    cost changes columns no index holds (PostgreSQL can update it in place: HOT)."""
    stamps = f"{policies.RULES_STAMP_SQL}, {WORKERS_STAMP_SQL}" if rules else "NULL, NULL"
    lost = getattr(run, "_claim_lost", None)
    if lost is not None and lost.is_set():
        raise Fenced(f"run {run.pk}: the lock's connection was lost; this process stops")
    returning = f"claim_epoch, cost_usd, input_tokens, output_tokens, {stamps}"
    with rows.prepared_cursor() as cursor:
        if cost or input_tokens or output_tokens or sets:
            column = Run._meta.get_field
            columns = "".join(f", {rows.quoted(column(name).column)} = %s" for name in sets or {})  # type: ignore[union-attr]
            cursor.execute(
                "UPDATE routing_run SET cost_usd = cost_usd + %s, input_tokens = input_tokens + %s, "  # noqa: S608 - no data in it
                f"output_tokens = output_tokens + %s{columns} WHERE id = %s RETURNING {returning}",
                [cost, input_tokens, output_tokens, *(sets or {}).values(), run.pk],
            )
        else:
            cursor.execute(f"SELECT {returning} FROM routing_run WHERE id = %s FOR UPDATE", [run.pk])  # noqa: S608
        row = cursor.fetchone()
    epoch = row[0] if row else None
    if epoch != run.claim_epoch:
        raise Fenced(f"run {run.pk} was claimed again (epoch {epoch}, this process holds {run.claim_epoch})")
    fenced = Fence(
        spent=row[1],
        input_tokens=row[2],
        output_tokens=row[3],
        rules_stamp=row[4] or "",
        workers_stamp=row[5] or "",
    )
    known = getattr(run, "_known", None)
    if not rules and known is not None:  # the stamps this process last read stay its assumption
        fenced = replace(fenced, rules_stamp=known.rules_stamp, workers_stamp=known.workers_stamp)
    run._known = fenced  # type: ignore[attr-defined]  # for write_once's guard
    return fenced


def known_rules(run: Run) -> list[policies.PolicyRule]:
    """The policy rules as of the stamp this process last read under the run's lock (its claim's
    fence): read from the database only when they changed since this process last read them."""
    known: Fence | None = getattr(run, "_known", None)
    return policies.rules_as_of(known.rules_stamp) if known is not None else policies.active_rules()


def known_workers(run: Run) -> dict[str, Worker]:
    """The enabled workers by slug, as of the stamp this process last read under the run's lock."""
    known: Fence | None = getattr(run, "_known", None)
    return workers_as_of(known.workers_stamp if known is not None else None)


def claim_current(run: Run) -> None:
    """Before a provider call: stop if the lock's connection was lost (no database round trip)."""
    lost = getattr(run, "_claim_lost", None)
    if lost is not None and lost.is_set():
        raise Fenced(f"run {run.pk}: the lock's connection was lost; this process stops before its next call")


def stored_usd(amount: Decimal) -> Decimal:
    """An amount as the run's cost column stores it (PostgreSQL rounds half away from zero)."""
    places = Run._meta.get_field("cost_usd").decimal_places  # type: ignore[union-attr]
    return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def next_ids(model: type[Model], *more: tuple[type[Model], int]) -> list[list[int]]:
    """Primary keys drawn from their sequences, in one statement: one of `model`, and `n` of each
    (model, n) in `more`. For rows whose ids their own statement needs before they are inserted (an
    audit event names them; a plan's steps point to its decision, their attempts to them)."""
    wanted = [(model, 1), *more]
    drawn = ", ".join(ids_drawn_sql(each, "%s") for each, _ in wanted)
    with rows.prepared_cursor() as cursor:
        cursor.execute(f"SELECT {drawn}", [n for _, n in wanted])  # noqa: S608 - names and placeholders
        return [list(map(int, ids)) for ids in cursor.fetchone()]


def ids_drawn_sql(model: type[Model], how_many: str) -> str:
    """SQL of an array of `how_many` (an SQL expression) primary keys of `model` drawn from its
    sequence (next_ids; a first delivery's claim draws its first plan's with its read)."""
    sequence = f"pg_get_serial_sequence('{model._meta.db_table}', '{model._meta.pk.column}')"  # type: ignore[union-attr]
    return f"ARRAY(SELECT nextval({sequence}) FROM generate_series(1, {how_many}))"  # noqa: S608 - names and SQL of the callers


T = TypeVar("T")
M = TypeVar("M", bound=Model)


def write_once(
    run: Run,
    stage: Callable[[Fence, Writes], T],
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> T:
    """A write transaction of the engine, in one statement when it can be. `stage` decides what to
    write from the run's totals (this cost added) and the rules' and workers' stamps, and stages it.

    First on what this process last read under the run's lock (its last fence): the statement writes
    only if all of it still holds (the claim, the totals, the rules' stamp, the chain's head), and is
    its own transaction. Otherwise (nothing read yet, or something moved: another process claimed the
    run, the rules changed) nothing was written, and it is staged again in a `fenced_write` on what
    the fence reads. So `stage` may run twice: it must only stage, and read nothing it writes."""
    claim_current(run)
    known: Fence | None = getattr(run, "_known", None)
    if known is not None:
        guess = guessed(known, cost, input_tokens, output_tokens)
        writes = Writes(run)
        result = stage(guess, writes)
        if guess != known:  # the cost, written with the rest only if the rest is
            writes.update(run, **guess.totals())
        if writes.execute(guard=Guard(known)):
            run._known = guess  # type: ignore[attr-defined]
            return result
    with fenced_write(
        run, cost=cost, input_tokens=input_tokens, output_tokens=output_tokens, rules=True
    ) as fenced:
        writes = Writes(run)
        result = stage(fenced, writes)
        writes.execute()
    return result


def guessed(known: Fence, cost: Decimal, input_tokens: int, output_tokens: int) -> Fence:
    """The run as this process last read it, with a cost added: the totals a write on it assumes, the
    cost rounded as the column keeps it (or the next guard misses)."""
    return replace(
        known,
        spent=stored_usd(known.spent + cost),
        input_tokens=known.input_tokens + input_tokens,
        output_tokens=known.output_tokens + output_tokens,
    )


def engine_event_fields(run: Run, events: list[tuple[str, Model, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The fields of the engine's events (action, object, payload) on the run's chain."""
    return [
        event_fields(
            actor=ENGINE,
            action=action,
            obj=obj,
            payload=payload,
            task_id=run.task_id,
            correlation_id=run.correlation_id,
        )
        for action, obj, payload in events
    ]


@dataclass(frozen=True)
class Guard:
    """What a statement of `write_once` assumes of the run: its first expression `f` locks the run's
    row and has no row when the claim, the totals, or the rules' or workers' stamp moved (the fence's check;
    the cost is added by a write like the others, only if the whole statement is written). `epoch` and
    `status`: what the claim itself assumes (a claim raises the epoch in the statement it guards)."""

    known: Fence
    epoch: int | None = None
    status: str | None = None
    settling: int | None = None  # with `settled`: the one step the statement itself settles
    # False: its commit does not wait for the WAL's flush (synchronous_commit off for it alone), for a
    # write whose loss in a crash of the server loses nothing: the next flushed commit, before anything
    # leaves this process, flushes it too (the WAL is written in order).
    flush: bool = True

    def params(self, run: Run) -> list[Any]:
        """The values of `guard_sql`'s placeholders."""
        return [
            run.pk,
            run.claim_epoch if self.epoch is None else self.epoch,
            self.known.spent,
            self.known.input_tokens,
            self.known.output_tokens,
            self.known.rules_stamp,
            self.known.workers_stamp,
            *([] if self.status is None else [self.status]),
            *([] if self.settling is None else [self.settling]),
        ]


_NO_FLUSH = " AND set_config('synchronous_commit', 'off', true) = 'off'"  # for this transaction alone


def guard_sql(status: bool, *, settled: bool = False, settling: bool = False, flush: bool = True) -> str:
    """A Guard's expression `f` (`status`: with the run's status checked too; `settled`: and none of
    its steps pending or running, but the one the statement settles with `settling`; not `flush`: the
    statement's commit does not wait for the WAL's flush, Guard.flush)."""
    unsettled = (
        " AND NOT EXISTS (SELECT 1 FROM routing_step s WHERE s.run_id = routing_run.id "  # noqa: S608 - constants
        f"AND s.status IN ('{StepStatus.PENDING}', '{StepStatus.RUNNING}'){' AND s.id <> %s' if settling else ''})"
        if settled
        else ""
    )
    return (
        "f AS (SELECT 1 FROM routing_run WHERE id = %s AND claim_epoch = %s AND cost_usd = %s "  # noqa: S608 - no data in it
        f"AND input_tokens = %s AND output_tokens = %s AND {policies.RULES_STAMP_SQL} = %s "
        f"AND {WORKERS_STAMP_SQL} = %s{' AND status = %s' if status else ''}{unsettled}"
        f"{'' if flush else _NO_FLUSH} FOR UPDATE)"
    )


@dataclass
class Writes:
    """The changes of one write transaction of the engine, staged, then made in one statement
    (`execute`): rows updated and inserted, and the audit events on the run's chain that record them.
    Every write is conditional on the chain's head moving (so a change and its events land together or
    not at all), and the head on the guard's fence when there is one."""

    run: Run
    updates: dict[tuple[type[Model], Any], dict[str, Any]] = field(default_factory=dict)
    only_if: dict[tuple[type[Model], Any], dict[str, Any]] = field(default_factory=dict)
    inserts: list[Model] = field(default_factory=list)
    events: list[tuple[str, Model, dict[str, Any]]] = field(default_factory=list)

    def update(self, obj: Model, only_if: dict[str, Any] | None = None, **values: Any) -> None:
        """Set these values on obj's row, and on obj now: what is staged after reads it (a follower's
        messages read the response of the step that succeeded). `only_if`: only if its columns still
        hold these (else the row is left, and the rest written); obj is then left as it is. A row
        staged for insert here is inserted with them (its values are read when the statement is made)."""
        if only_if:
            self.only_if.setdefault((type(obj), obj.pk), {}).update(only_if)
        else:
            for name, value in values.items():
                setattr(obj, name, value)
            if any(obj is staged for staged in self.inserts):
                return
        self.updates.setdefault((type(obj), obj.pk), {}).update(values)

    def insert(self, obj: M) -> M:
        """Staged: `obj` gets its primary key when the statement is made."""
        self.inserts.append(obj)
        return obj

    def event(self, action: str, obj: Model, payload: dict[str, Any]) -> None:
        self.events.append((action, obj, payload))

    def execute(self, guard: Guard | None = None) -> bool:
        """Make the staged writes in one statement. Without a guard (inside a fenced transaction) they
        are always made: a chain head this process misremembers is read under its lock and the
        statement made again. With one, only if the run and the chain's head are still as this
        process last read them; False when nothing was written."""
        if not (self.updates or self.inserts or self.events):
            return True
        run = self.run
        chain = audit_chain.run_chain(run.correlation_id)
        fields = engine_event_fields(run, self.events)
        planned = audit_chain.plan(chain, fields) if fields else None
        if fields and planned is None and guard is None:
            planned = audit_chain.plan(chain, fields, lock=True)
        if (planned is not None or not fields) and self._made(planned, guard):
            return True
        if guard is not None:
            return False
        audit_chain.forget(chain)  # in the fenced transaction: the head, read under its lock
        if not self._made(audit_chain.plan(chain, fields, lock=True), None):
            raise RuntimeError(f"audit chain {chain} has no head")
        return True

    def _made(self, planned: audit_chain.Planned | None, guard: Guard | None) -> bool:
        params: list[Any] = guard.params(self.run) if guard is not None else []
        if planned is not None:
            params += audit_chain.append_params(planned)
        # Each row's values are one parameter (audit.rows): the statement's text is the same for every
        # write of its shape (made once: _statement), and psycopg parses it once.
        updates = self.updated(params)
        for obj in self.inserts:
            params.append(
                rows.document((f, f.pre_save(obj, True)) for f in _inserted(type(obj), obj.pk is not None))
            )
        events = planned.events if planned is not None else []
        sql = _statement(
            None if guard is None else guard.status is not None,
            len(events),
            tuple(updates),
            tuple((type(obj), obj.pk is not None) for obj in self.inserts),
            flush=guard is None or guard.flush,
        )
        with rows.prepared_cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if not row[0]:
            if guard is not None and planned is not None and row[-1]:
                audit_chain.forget(planned.chain)  # read under its lock next time, not tried again
            return False
        if planned is not None:
            audit_chain.appended(planned, list(row[1 : 1 + len(events)]))
        for obj, pk in zip(
            self.inserts, row[1 + len(events) : 1 + len(events) + len(self.inserts)], strict=True
        ):
            obj.pk = pk
            obj._state.adding = False
        if events:
            announce(self.run, *events)
        return True

    def updated(self, params: list[Any]) -> Updates:
        """The staged updates' shapes (for `update_ctes`), their values added to `params`."""
        updates = []
        for (model, pk), values_by_name in self.updates.items():
            fields = [model._meta.get_field(name) for name in values_by_name]
            params += [rows.document(zip(fields, values_by_name.values(), strict=True)), pk]  # type: ignore[arg-type]
            only_if = self.only_if.get((model, pk), {})
            for name, value in only_if.items():
                params.append(model._meta.get_field(name).get_db_prep_save(value, connection))  # type: ignore[union-attr]
            updates.append((model, tuple(values_by_name), tuple(only_if)))
        return tuple(updates)


# Updates of a statement: (model, columns set, columns checked), as `update_ctes` writes them.
Updates = tuple[tuple[type[Model], tuple[str, ...], tuple[str, ...]], ...]


def update_ctes(updates: Updates, condition: str, name: str = "u") -> list[str]:
    """The expressions `u0`, `u1`, ... (`name`) of these updates, each of a row from a document
    parameter, then its primary key (and the columns checked), written only if `condition` holds."""
    ctes = []
    for i, (model, names, checked) in enumerate(updates):
        table = rows.quoted(model._meta.db_table)
        columns = [rows.quoted(model._meta.get_field(name).column) for name in names]  # type: ignore[union-attr]
        sets = ", ".join(f"{column} = r.{column}" for column in columns)
        where = f"{table}.{rows.quoted(model._meta.pk.column)} = %s"  # type: ignore[union-attr]
        for name in checked:
            where += f" AND {table}.{rows.quoted(model._meta.get_field(name).column)} = %s"  # type: ignore[union-attr]
        ctes.append(
            f"{name}{i} AS (UPDATE {table} SET {sets} FROM {rows.populated(model)} AS r "  # noqa: S608 - names, not data
            f"WHERE {where}{condition})"
        )
    return ctes


@functools.cache
def _inserted(model: type[Model], with_pk: bool) -> tuple[Field[Any, Any], ...]:
    """The columns a staged insert writes: every column; the primary key too when it was drawn before
    (next_ids)."""
    return tuple(f for f in model._meta.concrete_fields if with_pk or not f.primary_key)


@functools.lru_cache(maxsize=256)
def _statement(
    guard: bool | None,
    events: int,
    updates: Updates,
    inserts: tuple[tuple[type[Model], bool], ...],
    *,
    flush: bool = True,
) -> str:
    """The text of `Writes._made`'s statement for a write of this shape: with a guard (None: none;
    True: with the run's status; `flush`: Guard.flush), this many events, these updates (model, columns
    set, columns checked) and inserts (model, primary key drawn). Names only, never data: it depends on
    nothing else, and is made once per shape."""
    ctes: list[str] = []
    gate = ""
    if guard is not None:
        ctes.append(guard_sql(guard, flush=flush))
        gate = "f"
    if events:
        guarded = f" AND EXISTS (SELECT 1 FROM {gate})" if gate else ""  # noqa: S608 - names, not data
        ctes += audit_chain.append_text(events, guard=guarded)
        gate = "h"
    condition = f" AND EXISTS (SELECT 1 FROM {gate})" if gate else ""  # noqa: S608 - names, not data
    ctes += update_ctes(updates, condition)
    for i, (model, with_pk) in enumerate(inserts):
        listed = ", ".join(rows.quoted(f.column) for f in _inserted(model, with_pk))
        ctes.append(
            f"i{i} AS (INSERT INTO {rows.quoted(model._meta.db_table)} ({listed}) "  # noqa: S608 - names, not data
            f"SELECT {listed} FROM {rows.populated(model)} WHERE true{condition} "
            f"RETURNING {rows.quoted(model._meta.pk.column)})"  # type: ignore[union-attr]
        )
    answers = [f"(SELECT count(*) FROM {gate})" if gate else "1"]  # noqa: S608
    answers += [f"(SELECT id FROM e{i})" for i in range(events)]  # noqa: S608
    answers += [f"(SELECT * FROM i{i})" for i in range(len(inserts))]  # noqa: S608
    if guard is not None and events:
        answers.append("(SELECT count(*) FROM f)")  # the run as assumed: then the head had moved
    return f"WITH {', '.join(ctes)} SELECT {', '.join(answers)}"  # noqa: S608 - names, not data


def add_cost(run: Run, *, cost: Decimal, input_tokens: int, output_tokens: int) -> None:
    """Add a cost to the run's totals, in the caller's transaction (its task's: when the run ends)."""
    if not (cost or input_tokens or output_tokens):
        return
    Run.objects.filter(pk=run.pk).update(
        cost_usd=F("cost_usd") + cost,
        input_tokens=F("input_tokens") + input_tokens,
        output_tokens=F("output_tokens") + output_tokens,
        heartbeat_at=timezone.now(),
    )


def task_ended(task_id: Any, ended: dict[str, Any]) -> None:
    """The task's row when one of its runs ends: `ended` (the fields a run that is the task's own sets:
    its status, answer, score) and its totals, the sum of its runs' (so a run still going counts once
    it ends, and totals never drift from the runs they sum). The row is locked first, in a statement
    of its own: the sums are then read after any other run's end that held it has committed. (An UPDATE
    that waits for the row reads the runs as they were when it began, and would write the task's totals
    without that run's end.)"""
    with rows.prepared_cursor() as cursor:
        cursor.execute("SELECT 1 FROM routing_task WHERE id = %s FOR UPDATE", [task_id])
        cursor.execute(task_ended_sql(tuple(ended)), [task_ended_document(ended), task_id])


def task_ended_document(ended: dict[str, Any]) -> str:
    """The values of `ended` (fields of the task) as `task_ended_sql`'s document parameter."""
    fields = [Task._meta.get_field(name) for name in ended]
    assert all(isinstance(f, Field) for f in fields)
    return rows.document(zip(fields, ended.values(), strict=True))  # type: ignore[arg-type]


@functools.lru_cache(maxsize=16)
def task_ended_sql(ended: tuple[str, ...], *, run_totals: bool = False, gate: str = "") -> str:
    """`task_ended`'s UPDATE: the fields named in `ended` from a document parameter, the totals summed
    over the task's runs, then the task's id. `run_totals`: the ending run's totals are parameters
    before the document (its cost, input and output tokens, then its id), added to the other runs'
    sums (a statement that sets them on the run too does not see its own change). `gate`: a further
    condition of the statement it is part of."""
    columns = [rows.quoted(Task._meta.get_field(name).column) for name in ended]  # type: ignore[union-attr]
    sets = "".join(f"{column} = r.{column}, " for column in columns)
    sums = "sum(cost_usd), sum(input_tokens), sum(output_tokens)"
    runs = "routing_run WHERE task_id = t.id"
    if run_totals:
        sums = ", ".join(f"coalesce(sum({c}), 0) + %s" for c in ("cost_usd", "input_tokens", "output_tokens"))
        runs += " AND id <> %s"
    return (
        f"UPDATE routing_task t SET {sets}(cost_usd, input_tokens, output_tokens) = "  # noqa: S608 - names, not data
        f"(SELECT {sums} FROM {runs}) FROM {rows.populated(Task)} AS r WHERE t.id = %s{gate}"
    )
