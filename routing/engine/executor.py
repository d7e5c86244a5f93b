"""The executor: the one thing that writes a change of a run (routing.engine.changes).

`apply` builds a change on the run as this process assumes it and writes it, in one of two forms
made from the same description:
- plain (`apply_plainly`): a durable transaction; the run's row locked and this process's claim
  checked in its first statement (which reads the run's totals and the rules' and workers' stamps),
  the change built on what it read, its rows written through the ORM, its events appended on the
  run chain's head read under its lock;
- compiled (`_compiled`): the same change as one statement of common table expressions, written only
  if the run is still as this process last read it (`run_as_assumed`: its claim, totals and stamps,
  and what the change expects), and its chain's head still the one this process assumes. Taken when
  settings.CONDUCTOR_ONE_STATEMENT_WRITES is on and this process has read the run; when something
  moved, nothing is written and the change is built again and applied plainly.
Both leave the same rows and events (tests/routing/test_fast_paths.py compares them). A statement's
text depends only on the change's shape (which tables, which columns, how many events), so each shape
is made once and prepared once per connection (audit.rows.prepared_cursor); its values are named
parameters, a row's values one JSON document each (audit.rows).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Field, Model

from audit import chain as audit_chain
from audit import policies, rows
from audit.seals import pending_seal

from .. import folds
from ..models import Run, StepStatus
from .changes import Build, Change
from .events import announce, engine_event_fields
from .execution import Assumed, ClaimLost, RunExecution
from .task_totals import task_ended, task_ended_params, task_ended_sql
from .workers import WORKERS_STAMP_SQL

# The names of the compiled statement's expressions.
RUN_AS_ASSUMED = "run_as_assumed"
TASK_LOCKED = "task_locked"

# No wait for the WAL's flush at this statement's commit (Expect.durable False), for it alone.
_NO_FLUSH = " AND set_config('synchronous_commit', 'off', true) = 'off'"
_STAMPS = f"{policies.RULES_STAMP_SQL}, {WORKERS_STAMP_SQL}"


def compiled_writes() -> bool:
    """Whether the executor writes a change in one statement where it can
    (settings.CONDUCTOR_ONE_STATEMENT_WRITES)."""
    return bool(settings.CONDUCTOR_ONE_STATEMENT_WRITES)


def apply(execution: RunExecution, build: Build) -> Change:
    """Build a change of the run and write it: compiled where it can be, else plainly. Returns the
    change as written (built on what the write found). Raises ClaimLost, with nothing written, when
    this process's claim is no longer current."""
    change = try_compiled(execution, build)
    return change if change is not None else apply_plainly(execution, build)


def _folded(change: Change) -> Change:
    """The change with each update of a row it inserts made part of the insert (a plan's first steps
    start in the change that records them): the row is inserted with its values, as one statement
    could not update a row it inserts."""
    inserted = {id(obj) for obj in change.inserts}
    if not any(id(update.obj) in inserted for update in change.updates):
        return change
    for update in change.updates:
        if id(update.obj) in inserted:
            for name, value in update.values.items():
                setattr(update.obj, name, value)  # a row the change itself made, not yet written
    return replace(change, updates=tuple(u for u in change.updates if id(u.obj) not in inserted))


def try_compiled(execution: RunExecution, build: Build) -> Change | None:
    """The change built on the run as this process assumes it, written in one statement: None, with
    nothing written, when it cannot be (nothing read yet, the chain's head unknown, compiled writes
    off) or something moved (the run, its chain's head, its task's row at its end)."""
    execution.claim_current()
    assumed = execution.assumed
    if assumed is None or execution.head is None or not compiled_writes():
        return None
    change = _folded(build(assumed))
    written = _compiled(execution, change, assumed)
    if written is None:
        return None
    _applied(execution, change, assumed, *written)
    return change


def next_ids(model: type[Model], *more: tuple[type[Model], int]) -> list[list[int]]:
    """Primary keys drawn from their sequences, in one statement: one of `model`, and `n` of each
    (model, n) in `more`. For rows whose ids a change needs before they are inserted (an event names
    them; a plan's steps point to its decision, their attempts to them)."""
    wanted = [(model, 1), *more]
    drawn = ", ".join(ids_drawn_sql(each, f"%(n_{i})s") for i, (each, _) in enumerate(wanted))
    with rows.prepared_cursor() as cursor:
        cursor.execute(f"SELECT {drawn}", {f"n_{i}": n for i, (_, n) in enumerate(wanted)})  # noqa: S608
        return [list(map(int, ids)) for ids in cursor.fetchone()]


@functools.cache
def ids_drawn_sql(model: type[Model], how_many: str) -> str:
    """SQL of an array of `how_many` (an SQL expression) primary keys of `model` drawn from its
    sequence (next_ids; a first delivery's claim draws its first plan's with its read)."""
    sequence = f"pg_get_serial_sequence('{model._meta.db_table}', '{model._meta.pk.column}')"  # type: ignore[union-attr]
    return f"ARRAY(SELECT nextval({sequence}) FROM generate_series(1, {how_many}))"  # noqa: S608 - names and SQL of the callers


def apply_plainly(execution: RunExecution, build: Build) -> Change:
    """The change built on the run as read under its row's lock, written in a durable transaction
    (the caller's, if it is in one)."""
    execution.claim_current()
    run = execution.run
    with transaction.atomic(savepoint=False):
        read = lock_run(execution)
        change = _folded(build(read))
        if change.cost or change.run:
            Run.objects.filter(pk=run.pk).update(
                cost_usd=F("cost_usd") + change.cost.usd,
                input_tokens=F("input_tokens") + change.cost.input_tokens,
                output_tokens=F("output_tokens") + change.cost.output_tokens,
                **change.run,
            )
        for update in change.updates:
            type(update.obj)._default_manager.filter(pk=update.obj.pk, **update.only_if).update(
                **update.values
            )
        for obj in change.inserts:
            obj.save(force_insert=True)
        if change.ends is not None:
            task_ended(run.task_id, dict(change.ends.task))
        planned = None
        if change.events:
            chain = audit_chain.run_chain(run.correlation_id)
            planned = audit_chain.plan(chain, engine_event_fields(run, change.events))
            written = _append(planned, seal=change.ends is not None)
            audit_chain.appended(planned, written)
        if change.ends is not None:
            assert planned is not None, "a run's end is recorded by its last event"
            pending_seal(run=run, task_id=run.task_id, last=planned.events[-1]).save(force_insert=True)
            folds.run_waits(run.pk)
        _applied(execution, change, read, planned, None)
    return change


def lock_run(execution: RunExecution) -> Assumed:
    """In a write transaction: lock the run's row, check that this process's claim is current, and
    read the run's totals and the rules' and workers' stamps. One statement."""
    run = execution.run
    with rows.prepared_cursor() as cursor:
        cursor.execute(
            "SELECT claim_epoch, cost_usd, input_tokens, output_tokens, "  # noqa: S608 - no data in it
            f"{_STAMPS} FROM routing_run WHERE id = %(run_id)s FOR UPDATE",
            {"run_id": run.pk},
        )
        row = cursor.fetchone()
    epoch = row[0] if row else None
    if epoch != run.claim_epoch:
        raise ClaimLost(
            f"run {run.pk} was claimed again (epoch {epoch}, this process holds {run.claim_epoch})"
        )
    return Assumed(
        spent=row[1],
        input_tokens=row[2],
        output_tokens=row[3],
        rules_stamp=row[4],
        workers_stamp=row[5],
        locked=True,
    )


def _append(planned: audit_chain.Planned, *, seal: bool) -> list[int]:
    """The planned events inserted, on the head read under its lock (audit_chain.plan)."""
    answers = ", ".join(
        f"(SELECT id FROM {audit_chain.event_inserted(i)})"  # noqa: S608 - names, not data
        for i in range(len(planned.events))
    )
    with rows.prepared_cursor() as cursor:
        cursor.execute(
            f"WITH {', '.join(audit_chain.append_text(len(planned.events), seal=seal))} SELECT {answers}",  # noqa: S608
            audit_chain.append_params(planned),
        )
        return list(cursor.fetchone())


def _applied(
    execution: RunExecution,
    change: Change,
    before: Assumed,
    planned: audit_chain.Planned | None,
    inserted_ids: list[int] | None,
) -> None:
    """What this process knows once a change is written: the rows' instances take their new values and
    ids, the run's chain has a new head (none, once sealed), the run's totals and stamps are as the
    write found them plus the change's cost; the events are announced after the commit."""
    run = execution.run
    for update in change.updates:
        if not update.only_if:  # else it may not have been written: the instance is left as it is
            for name, value in update.values.items():
                setattr(update.obj, name, value)
    for obj, pk in zip(change.inserts, inserted_ids or [], strict=False):
        obj.pk = pk
        obj._state.adding = False
    after = before.plus(change.cost.usd, change.cost.input_tokens, change.cost.output_tokens)
    for name, value in {**change.run, **after.totals()}.items():
        setattr(run, name, value)
    execution.assumed = after
    if planned is not None:
        last = planned.events[-1]
        execution.head = None if change.ends is not None else (last.seq, last.hash)
        announce(execution, *planned.events)


# The compiled form.


def _compiled(
    execution: RunExecution, change: Change, assumed: Assumed
) -> tuple[audit_chain.Planned | None, list[int]] | None:
    """The change in one statement, on the run as assumed and the chain's head as this process assumes
    it: the drafted events and the inserted rows' ids, or None when nothing was written (something
    moved: the caller applies the change plainly, on what it reads)."""
    run = execution.run
    after = assumed.plus(change.cost.usd, change.cost.input_tokens, change.cost.output_tokens)
    planned = None
    inserts = list(change.inserts)
    params = _guard_params(run, change, assumed)
    if change.events:
        assert execution.head is not None
        chain = audit_chain.run_chain(run.correlation_id)
        planned = audit_chain.plan(chain, engine_event_fields(run, change.events), head=execution.head)
        params |= audit_chain.append_params(planned)
        if change.ends is not None:
            inserts.append(pending_seal(run=run, task_id=run.task_id, last=planned.events[-1]))
    run_values = {**change.run, **(after.totals() if change.cost else {})}
    updates: list[tuple[Model, Any, Any]] = [(run, run_values, {})] if run_values else []
    updates += [(u.obj, u.values, u.only_if) for u in change.updates]
    shapes = _updated(updates, params)
    for i, obj in enumerate(inserts):
        params[f"inserted_{i}"] = rows.document(
            (f, f.pre_save(obj, True)) for f in _inserted_columns(type(obj), obj.pk is not None)
        )
    if change.ends is not None:
        params |= task_ended_params(run.task_id, dict(change.ends.task))
        params |= {
            "run_cost_usd": after.spent,
            "run_input_tokens": after.input_tokens,
            "run_output_tokens": after.output_tokens,
        }
    shape = _Shape(
        expect=replace(change.expect, settled=change.expect.settled or change.ends is not None),
        events=len(planned.events) if planned else 0,
        seal=change.ends is not None,
        updates=shapes,
        inserts=tuple((type(obj), obj.pk is not None) for obj in inserts),
        task=tuple(change.ends.task) if change.ends is not None else None,
    )
    with rows.prepared_cursor() as cursor:
        cursor.execute(statement(shape), params)
        row = cursor.fetchone()
    written, held, *ids = row
    if not written:
        if held and planned is not None:  # the run was as assumed: its chain's head had moved
            execution.head = None
        return None
    event_ids, inserted_ids = ids[: shape.events], ids[shape.events :]
    if planned is not None:
        audit_chain.appended(planned, event_ids)
    if change.ends is not None:
        folds.fold_after_commit()
    return planned, inserted_ids


def _guard_params(run: Run, change: Change, assumed: Assumed) -> dict[str, Any]:
    params: dict[str, Any] = {
        "run_id": run.pk,
        "assumed_epoch": run.claim_epoch,
        "assumed_spent": assumed.spent,
        "assumed_input_tokens": assumed.input_tokens,
        "assumed_output_tokens": assumed.output_tokens,
        "assumed_rules_stamp": assumed.rules_stamp,
        "assumed_workers_stamp": assumed.workers_stamp,
    }
    if change.expect.status is not None:
        params["assumed_status"] = change.expect.status
    if change.expect.settled_but is not None:
        params["settling_step_id"] = change.expect.settled_but
    return params


# An update of a compiled statement: (model, columns set, columns checked).
Updated = tuple[type[Model], tuple[str, ...], tuple[str, ...]]


def _updated(updates: list[tuple[Model, Any, Any]], params: dict[str, Any]) -> tuple[Updated, ...]:
    """The updates' shapes, their values added to `params` (`updated_0`: the row's document,
    `updated_0_id`, `updated_0_<column>`: a column it checks)."""
    shapes = []
    for i, (obj, values, only_if) in enumerate(updates):
        model = type(obj)
        fields = [model._meta.get_field(column) for column in values]
        params[f"updated_{i}"] = rows.document(zip(fields, values.values(), strict=True))  # type: ignore[arg-type]
        params[f"updated_{i}_id"] = obj.pk
        for column, value in only_if.items():
            checked = model._meta.get_field(column)
            assert isinstance(checked, Field)
            params[f"updated_{i}_{column}"] = checked.get_db_prep_save(value, connection)
        shapes.append((model, tuple(values), tuple(only_if)))
    return tuple(shapes)


@dataclass(frozen=True)
class _Shape:
    """What a compiled statement's text depends on."""

    expect: Any
    events: int
    seal: bool
    updates: tuple[Updated, ...]
    inserts: tuple[tuple[type[Model], bool], ...]
    task: tuple[str, ...] | None  # a run's end: the task's columns it sets


@functools.cache
def _inserted_columns(model: type[Model], with_pk: bool) -> tuple[Field[Any, Any], ...]:
    """The columns an insert writes: every column; the primary key too when it was drawn before."""
    return tuple(f for f in model._meta.concrete_fields if with_pk or not f.primary_key)


def _exists(name: str) -> str:
    return f" AND EXISTS (SELECT 1 FROM {name})"  # noqa: S608 - a name, not data


# The task's row as locked is the version the statement began with (a run's end sums its task's runs
# as the statement found them: if another run of the task ended meanwhile, nothing is written and the
# end is applied plainly, where task_totals.task_ended locks the row in a statement of its own).
_TASK_UNMOVED = (
    f" AND EXISTS (SELECT 1 FROM {TASK_LOCKED} JOIN routing_task s ON s.id = {TASK_LOCKED}.id "  # noqa: S608
    f"AND s.xmin = {TASK_LOCKED}.xmin)"
)


@functools.lru_cache(maxsize=256)
def statement(shape: _Shape) -> str:
    """The text of a compiled change of this shape (names only, never data).

    `run_as_assumed` locks the run's row and has a row only while the run is as assumed; for a run's
    end, `task_locked` locks its task's row next (every end locks its run, then its task: two runs of
    a task ending at once wait for each other, never deadlock); `head_moved` moves the run chain's head
    (audit.chain.append_text), only if the rest holds; the events, updates and inserts are written
    only if it moved; a run's end also sums its task's totals and leaves the run waiting for a fold.
    Its answer: whether it wrote, whether the run was as assumed, the events' ids, the inserted ids."""
    expect = shape.expect
    ctes = [
        _run_as_assumed(
            expect.status is not None, expect.settled, expect.settled_but is not None, expect.durable
        )
    ]
    gate = RUN_AS_ASSUMED
    further = ""
    if shape.task is not None:
        ctes.append(
            f"{TASK_LOCKED} AS (SELECT id, xmin FROM routing_task WHERE id = %(task_id)s"  # noqa: S608 - names
            f"{_exists(RUN_AS_ASSUMED)} FOR UPDATE)"
        )
        further = _TASK_UNMOVED
    if shape.events:
        ctes += audit_chain.append_text(
            shape.events, guard=f"{_exists(RUN_AS_ASSUMED)}{further}", seal=shape.seal
        )
        gate = audit_chain.HEAD_MOVED
    condition = _exists(gate)
    for i, (model, names, checked) in enumerate(shape.updates):
        cte = f"updated_{i}"
        table = rows.quoted(model._meta.db_table)
        columns = [rows.quoted(model._meta.get_field(name).column) for name in names]  # type: ignore[union-attr]
        sets = ", ".join(f"{column} = r.{column}" for column in columns)
        where = f"{table}.{rows.quoted(model._meta.pk.column)} = %({cte}_id)s"  # type: ignore[union-attr]
        for name in checked:
            where += f" AND {table}.{rows.quoted(model._meta.get_field(name).column)} = %({cte}_{name})s"  # type: ignore[union-attr]
        ctes.append(
            f"{cte} AS (UPDATE {table} SET {sets} FROM {rows.populated(model, cte)} AS r "  # noqa: S608 - names, not data
            f"WHERE {where}{condition})"
        )
    for i, (model, with_pk) in enumerate(shape.inserts):
        listed = ", ".join(rows.quoted(f.column) for f in _inserted_columns(model, with_pk))
        ctes.append(
            f"inserted_{i} AS (INSERT INTO {rows.quoted(model._meta.db_table)} ({listed}) "  # noqa: S608 - names, not data
            f"SELECT {listed} FROM {rows.populated(model, f'inserted_{i}')} WHERE true{condition} "
            f"RETURNING {rows.quoted(model._meta.pk.column)})"  # type: ignore[union-attr]
        )
    if shape.task is not None:
        ctes.append(f"task_ended AS ({task_ended_sql(shape.task, with_run_totals=True, gate=condition)})")
        ctes.append(f"run_waits AS ({folds.WAITS.format(gate=condition)})")
    answers = [
        f"(SELECT count(*) FROM {gate})",  # noqa: S608 - names, not data
        f"(SELECT count(*) FROM {RUN_AS_ASSUMED} WHERE true{further})",  # noqa: S608
    ]  # noqa: S608
    answers += [f"(SELECT id FROM {audit_chain.event_inserted(i)})" for i in range(shape.events)]  # noqa: S608
    answers += [f"(SELECT * FROM inserted_{i})" for i in range(len(shape.inserts))]  # noqa: S608
    return f"WITH {', '.join(ctes)} SELECT {', '.join(answers)}"  # noqa: S608 - names, not data


@functools.lru_cache(maxsize=16)
def _run_as_assumed(status: bool, settled: bool, but_one: bool, durable: bool) -> str:
    """`run_as_assumed`: the run's row, locked, while its claim, totals and stamps are as assumed (and
    its status, and every step settled but the one the change settles, where the change expects it)."""
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
        f"{'' if durable else _NO_FLUSH} FOR UPDATE)"
    )
