"""One statement for one write transaction of the engine: its changes staged (`Writes`), then made
in one statement of common table expressions, each with its named parameters.

The expressions and what they hold:
- `run_as_assumed` (`Guard`): locks the run's row, and has a row only while the run is as this
  process last read it (its claim, totals, and the rules' and workers' stamps);
- `head_moved`, `event_0`, ... (audit.chain.append_text): the events on the run's chain, written only
  if its head is still the one they were built on (and, with a guard, the run as assumed);
- `updated_0`, ... and `inserted_0`, ...: the rows changed and added, only if the head moved.

A statement's text depends only on its shape (which guard, how many events, which columns), so it is
made once per shape and prepared once per connection (audit.rows.prepared_cursor); its values are a
dict of named parameters, a row's values as one JSON document parameter each (audit.rows).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

from audit import chain as audit_chain
from audit import policies, rows

from ..models import Run, StepStatus
from .events import announce, engine_event_fields
from .execution import Assumed, RunExecution
from .workers import WORKERS_STAMP_SQL

M = TypeVar("M", bound=Model)

RUN_AS_ASSUMED = "run_as_assumed"

# No wait for the WAL's flush at this statement's commit (Guard.flush), for this transaction alone.
_NO_FLUSH = " AND set_config('synchronous_commit', 'off', true) = 'off'"


@dataclass(frozen=True)
class Guard:
    """What a one-statement write assumes of the run (`run_as_assumed`): its claim epoch, its totals
    and stamps as `assumed`; `status`: its status too (a claim); `settled`: with every step of the run
    settled (a run's end) but `settling`, the one the statement itself settles (its last step's success).

    `flush` False: the commit does not wait for the WAL's flush, for a write whose loss in a crash of
    the server loses nothing (the next flushed commit, before anything leaves this process, flushes it
    too: the WAL is written in order)."""

    assumed: Assumed
    epoch: int | None = None  # the claim's own statement raises the epoch it checks
    status: str | None = None
    settled: bool = False
    settling: int | None = None
    flush: bool = True

    def params(self, run: Run) -> dict[str, Any]:
        """The values of `guard_sql`'s parameters, by name."""
        params: dict[str, Any] = {
            "run_id": run.pk,
            "assumed_epoch": run.claim_epoch if self.epoch is None else self.epoch,
            "assumed_spent": self.assumed.spent,
            "assumed_input_tokens": self.assumed.input_tokens,
            "assumed_output_tokens": self.assumed.output_tokens,
            "assumed_rules_stamp": self.assumed.rules_stamp,
            "assumed_workers_stamp": self.assumed.workers_stamp,
        }
        if self.status is not None:
            params["assumed_status"] = self.status
        if self.settling is not None:
            params["settling_step_id"] = self.settling
        return params

    def sql(self) -> str:
        return guard_sql(
            status=self.status is not None,
            settled=self.settled,
            but_one=self.settling is not None,
            flush=self.flush,
        )


@functools.lru_cache(maxsize=16)
def guard_sql(*, status: bool, settled: bool, but_one: bool, flush: bool) -> str:
    """The `run_as_assumed` expression of a Guard of this shape."""
    unsettled = ""
    if settled:
        unsettled = (
            " AND NOT EXISTS (SELECT 1 FROM routing_step s WHERE s.run_id = routing_run.id "  # noqa: S608 - constants
            f"AND s.status IN ('{StepStatus.PENDING}', '{StepStatus.RUNNING}')"
            f"{' AND s.id <> %(settling_step_id)s' if but_one else ''})"
        )
    return (
        f"{RUN_AS_ASSUMED} AS (SELECT 1 FROM routing_run WHERE id = %(run_id)s "  # noqa: S608 - no data in it
        "AND claim_epoch = %(assumed_epoch)s AND cost_usd = %(assumed_spent)s "
        "AND input_tokens = %(assumed_input_tokens)s AND output_tokens = %(assumed_output_tokens)s "
        f"AND {policies.RULES_STAMP_SQL} = %(assumed_rules_stamp)s "
        f"AND {WORKERS_STAMP_SQL} = %(assumed_workers_stamp)s"
        f"{' AND status = %(assumed_status)s' if status else ''}{unsettled}"
        f"{'' if flush else _NO_FLUSH} FOR UPDATE)"
    )


def exists(name: str) -> str:
    """A condition on an expression of the statement: it has a row."""
    return f" AND EXISTS (SELECT 1 FROM {name})"  # noqa: S608 - a name, not data


# Updates of a statement: (model, columns set, columns checked), as `update_ctes` writes them.
Updates = tuple[tuple[type[Model], tuple[str, ...], tuple[str, ...]], ...]


@dataclass
class Writes:
    """The changes of one write transaction of the engine, staged, then made in one statement
    (`execute`): rows updated and inserted, and the audit events on the run's chain that record them.
    Every write is conditional on the chain's head moving (so a change and its events land together or
    not at all), and the head on the guard's `run_as_assumed` when there is one."""

    execution: RunExecution
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
        run = self.execution.run
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
        params: dict[str, Any] = {}
        if guard is not None:
            params |= guard.params(self.execution.run)
        if planned is not None:
            params |= audit_chain.append_params(planned)
        updates = self.updated(params)
        for i, obj in enumerate(self.inserts):
            params[inserted(i)] = rows.document(
                (f, f.pre_save(obj, True)) for f in _inserted_columns(type(obj), obj.pk is not None)
            )
        events = planned.events if planned is not None else []
        sql = _statement(
            guard.sql() if guard is not None else None,
            len(events),
            updates,
            tuple((type(obj), obj.pk is not None) for obj in self.inserts),
        )
        with rows.prepared_cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        written, *event_ids = row[: 1 + len(events)]
        inserted_ids = row[1 + len(events) : 1 + len(events) + len(self.inserts)]
        if not written:
            if guard is not None and planned is not None and row[-1]:  # the run as assumed: the head moved
                audit_chain.forget(planned.chain)  # read under its lock next time, not tried again
            return False
        if planned is not None:
            audit_chain.appended(planned, event_ids)
        for obj, pk in zip(self.inserts, inserted_ids, strict=True):
            obj.pk = pk
            obj._state.adding = False
        if events:
            announce(self.execution, *events)
        return True

    def updated(self, params: dict[str, Any], name: str = "updated") -> Updates:
        """The staged updates' shapes (for `update_ctes`, with this `name`), their values added to
        `params` under the names `update_ctes` gives them."""
        updates = []
        for i, ((model, pk), values_by_name) in enumerate(self.updates.items()):
            fields = [model._meta.get_field(column) for column in values_by_name]
            params[f"{name}_{i}"] = rows.document(zip(fields, values_by_name.values(), strict=True))  # type: ignore[arg-type]
            params[f"{name}_{i}_id"] = pk
            only_if = self.only_if.get((model, pk), {})
            for column, value in only_if.items():
                checked = model._meta.get_field(column)
                assert isinstance(checked, Field)
                params[f"{name}_{i}_{column}"] = checked.get_db_prep_save(value, connection)
            updates.append((model, tuple(values_by_name), tuple(only_if)))
        return tuple(updates)


def inserted(i: int) -> str:
    """The name of the expression that inserts a statement's `i`th staged row (it returns its id)."""
    return f"inserted_{i}"


def update_ctes(updates: Updates, condition: str, name: str = "updated") -> list[str]:
    """The expressions `updated_0`, `updated_1`, ... (`name`) of these updates, each of a row from its
    document parameter (`updated_0`), its primary key (`updated_0_id`) and the columns it checks
    (`updated_0_<column>`), written only if `condition` holds."""
    ctes = []
    for i, (model, names, checked) in enumerate(updates):
        cte = f"{name}_{i}"
        table = rows.quoted(model._meta.db_table)
        columns = [rows.quoted(model._meta.get_field(column).column) for column in names]  # type: ignore[union-attr]
        sets = ", ".join(f"{column} = r.{column}" for column in columns)
        where = f"{table}.{rows.quoted(model._meta.pk.column)} = %({cte}_id)s"  # type: ignore[union-attr]
        for column in checked:
            where += f" AND {table}.{rows.quoted(model._meta.get_field(column).column)} = %({cte}_{column})s"  # type: ignore[union-attr]
        ctes.append(
            f"{cte} AS (UPDATE {table} SET {sets} FROM {rows.populated(model, cte)} AS r "  # noqa: S608 - names, not data
            f"WHERE {where}{condition})"
        )
    return ctes


@functools.cache
def _inserted_columns(model: type[Model], with_pk: bool) -> tuple[Field[Any, Any], ...]:
    """The columns a staged insert writes: every column; the primary key too when it was drawn before
    (fence.next_ids)."""
    return tuple(f for f in model._meta.concrete_fields if with_pk or not f.primary_key)


@functools.lru_cache(maxsize=256)
def _statement(
    guard: str | None, events: int, updates: Updates, inserts: tuple[tuple[type[Model], bool], ...]
) -> str:
    """The text of `Writes._made`'s statement for a write of this shape: this guard's expression (or
    none), this many events, these updates (model, columns set, columns checked) and inserts (model,
    primary key drawn). Names only, never data: made once per shape.

    Its answer: whether it wrote (the gate's rows), the events' ids, the inserted rows' ids, and with a
    guard and events, whether the run was as assumed (then, when nothing was written, it was the
    chain's head that had moved)."""
    ctes: list[str] = []
    gate = ""
    if guard is not None:
        ctes.append(guard)
        gate = RUN_AS_ASSUMED
    if events:
        ctes += audit_chain.append_text(events, guard=exists(gate) if gate else "")
        gate = audit_chain.HEAD_MOVED
    condition = exists(gate) if gate else ""
    ctes += update_ctes(updates, condition)
    for i, (model, with_pk) in enumerate(inserts):
        listed = ", ".join(rows.quoted(f.column) for f in _inserted_columns(model, with_pk))
        ctes.append(
            f"{inserted(i)} AS (INSERT INTO {rows.quoted(model._meta.db_table)} ({listed}) "  # noqa: S608 - names, not data
            f"SELECT {listed} FROM {rows.populated(model, inserted(i))} WHERE true{condition} "
            f"RETURNING {rows.quoted(model._meta.pk.column)})"  # type: ignore[union-attr]
        )
    answers = [f"(SELECT count(*) FROM {gate})" if gate else "1"]  # noqa: S608
    answers += [f"(SELECT id FROM {audit_chain.event_inserted(i)})" for i in range(events)]  # noqa: S608
    answers += [f"(SELECT * FROM {inserted(i)})" for i in range(len(inserts))]  # noqa: S608
    if guard is not None and events:
        answers.append(f"(SELECT count(*) FROM {RUN_AS_ASSUMED})")  # noqa: S608
    with_ = f"WITH {', '.join(ctes)} " if ctes else ""
    return f"{with_}SELECT {', '.join(answers)}"  # noqa: S608 - names, not data
