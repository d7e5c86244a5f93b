"""The fence: every write transaction of the engine first makes sure this process's claim on the run
is still current, and reads the run as it is (its totals, the rules' and workers' stamps).

Two ways to write, one interface (`write_once`): on the run as this process last read it, in one
statement that writes only if all of it still holds (the fast path); else in a transaction whose
first statement fences (the plain path). Both leave the same rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from decimal import Decimal
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import F, Model
from django.utils import timezone

from audit import policies, rows
from audit.models import AuditEvent
from audit.services import ENGINE, event_record

from ..models import Run, Worker
from .events import announce
from .execution import Assumed, Fenced, RunExecution
from .statement import Guard, Writes
from .workers import WORKERS_STAMP_SQL, workers_as_of

T = TypeVar("T")


@contextmanager
def fenced_write(execution: RunExecution, **change: Any) -> Iterator[Assumed]:
    """A write transaction of the engine, fenced in its first statement (`fence`, which takes
    `change`). Yields the run as the fence read it. The events recorded inside it do not fence again;
    if the claim is not this process's, the whole transaction rolls back."""
    with transaction.atomic(), fenced(execution, **change) as read:
        yield read


@contextmanager
def fenced(execution: RunExecution, **change: Any) -> Iterator[Assumed]:
    """`fenced_write` inside the caller's transaction (which it must be in)."""
    read = fence(execution, **change)
    execution.in_fence = True
    try:
        yield read
    finally:
        execution.in_fence = False


def fence(
    execution: RunExecution,
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
    rules: bool = False,
    sets: dict[str, Any] | None = None,
) -> Assumed:
    """Inside a write transaction: lock the run row and check that this process's claim is current.
    One statement, which also adds a cost to the run's totals (`sets`: and sets these columns of the
    run) and (`rules`) reads the policy rules' and workers' stamps. Returns the run as read, which
    becomes the execution's `assumed`.

    It does not beat the run's heartbeat (the keeper does, on the lock's connection): heartbeat_at is
    indexed, so an UPDATE of it writes a new version of the row into each of the run's indexes. A
    fence with no cost only locks the row; one with a cost changes columns no index holds (PostgreSQL
    can update it in place: HOT)."""
    run = execution.run
    execution.claim_current()
    stamps = f"{policies.RULES_STAMP_SQL}, {WORKERS_STAMP_SQL}" if rules else "NULL, NULL"
    returning = f"claim_epoch, cost_usd, input_tokens, output_tokens, {stamps}"
    params: dict[str, Any] = {"run_id": run.pk}
    if cost or input_tokens or output_tokens or sets:
        column = Run._meta.get_field
        sets = sets or {}
        params |= {"cost": cost, "input_tokens": input_tokens, "output_tokens": output_tokens}
        params |= {f"set_{name}": value for name, value in sets.items()}
        columns = "".join(f", {rows.quoted(column(name).column)} = %(set_{name})s" for name in sets)  # type: ignore[union-attr]
        statement = (
            "UPDATE routing_run SET cost_usd = cost_usd + %(cost)s, "  # noqa: S608 - no data in it
            "input_tokens = input_tokens + %(input_tokens)s, output_tokens = output_tokens + %(output_tokens)s"
            f"{columns} WHERE id = %(run_id)s RETURNING {returning}"
        )
    else:
        statement = f"SELECT {returning} FROM routing_run WHERE id = %(run_id)s FOR UPDATE"  # noqa: S608
    with rows.prepared_cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    epoch = row[0] if row else None
    if epoch != run.claim_epoch:
        raise Fenced(f"run {run.pk} was claimed again (epoch {epoch}, this process holds {run.claim_epoch})")
    read = Assumed(
        spent=row[1],
        input_tokens=row[2],
        output_tokens=row[3],
        rules_stamp=row[4] or "",
        workers_stamp=row[5] or "",
    )
    if not rules and execution.assumed is not None:  # the stamps this process last read stay its assumption
        read = replace(
            read,
            rules_stamp=execution.assumed.rules_stamp,
            workers_stamp=execution.assumed.workers_stamp,
        )
    execution.assumed = read
    return read


def record_event(
    execution: RunExecution, action: str, obj: Any, payload: dict[str, Any], *, seal: bool = False
) -> AuditEvent:
    """An engine event on the run's chain; call inside the transaction of the change it records. The
    claim is fenced here unless the transaction was fenced first (`fenced`): if the claim is not this
    process's, the whole transaction (the change with its event) rolls back. `seal`: the run's last
    event, which seals its chain in the same statement."""
    if not execution.in_fence:
        fence(execution)
    run = execution.run
    event = event_record(
        actor=ENGINE,
        action=action,
        obj=obj,
        task_id=run.task_id,
        correlation_id=run.correlation_id,
        payload=payload,
        seal=seal,
    )
    announce(execution, event)
    return event


def known_rules(execution: RunExecution) -> list[policies.PolicyRule]:
    """The policy rules as of the stamp this process last read under the run's lock: read from the
    database only when they changed since this process last read them."""
    assumed = execution.assumed
    return policies.rules_as_of(assumed.rules_stamp) if assumed is not None else policies.active_rules()


def known_workers(execution: RunExecution) -> dict[str, Worker]:
    """The enabled workers by slug, as of the stamp this process last read under the run's lock."""
    assumed = execution.assumed
    return workers_as_of(assumed.workers_stamp if assumed is not None else None)


def one_statement_writes() -> bool:
    """Whether the engine takes its fast paths (settings.CONDUCTOR_ONE_STATEMENT_WRITES)."""
    return bool(settings.CONDUCTOR_ONE_STATEMENT_WRITES)


def write_once(
    execution: RunExecution,
    stage: Callable[[Assumed, Writes], T],
    *,
    cost: Decimal = Decimal(0),
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> T:
    """A write transaction of the engine. `stage` decides what to write from the run's totals (this
    cost added) and the rules' and workers' stamps, and stages it in `Writes`.

    The fast path: on the run as this process last read it (`execution.assumed`, with the cost added),
    one statement that writes only if all of it still holds (the claim, the totals, the stamps, the
    chain's head), its own transaction. The plain path, taken when nothing was read yet or something
    moved (another process claimed the run, the rules changed) and nothing was written: a fenced
    transaction, staged again on what the fence reads. So `stage` may be called twice; it must only
    stage, and read nothing it writes. Both paths leave the same rows."""
    execution.claim_current()
    assumed = execution.assumed
    if assumed is not None and one_statement_writes():
        after = assumed.plus(cost, input_tokens, output_tokens)
        writes = Writes(execution)
        result = stage(after, writes)
        if after != assumed:  # the cost, written with the rest only if the rest is
            writes.update(execution.run, **after.totals())
        if writes.execute(guard=Guard(assumed)):
            execution.assumed = after
            return result
    with fenced_write(
        execution, cost=cost, input_tokens=input_tokens, output_tokens=output_tokens, rules=True
    ) as read:
        writes = Writes(execution)
        result = stage(read, writes)
        writes.execute()
    return result


def next_ids(model: type[Model], *more: tuple[type[Model], int]) -> list[list[int]]:
    """Primary keys drawn from their sequences, in one statement: one of `model`, and `n` of each
    (model, n) in `more`. For rows whose ids their own statement needs before they are inserted (an
    audit event names them; a plan's steps point to its decision, their attempts to them)."""
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


def add_cost(run: Run, *, cost: Decimal, input_tokens: int, output_tokens: int) -> None:
    """Add a cost to the run's totals, in the caller's transaction (a lost call's, at a resumed claim)."""
    if not (cost or input_tokens or output_tokens):
        return
    Run.objects.filter(pk=run.pk).update(
        cost_usd=F("cost_usd") + cost,
        input_tokens=F("input_tokens") + input_tokens,
        output_tokens=F("output_tokens") + output_tokens,
        heartbeat_at=timezone.now(),
    )
