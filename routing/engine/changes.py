"""A state change of a run, as data: what it writes, built by one function per change, applied by the
executor (`executor.apply`), which alone writes the engine's rows and events.

A change says, in plain values: the rows it updates (`RowUpdate`: the row, its new values, and the
columns it checks still hold), the rows it inserts, the events it appends to the run's chain (each
payload made by the one builder of its event type), what it adds to the run's totals and sets on the
run's row, what it assumes of the run (`Expect`), and, for a run's end, what it sets on the task and
that it seals the run's chain (`RunEnd`). Every status it moves is checked against the transition
table as it is built (routing.models.transitions). Two changes that commit together are one
change (`+`), applied once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Model

from ..models import Run
from ..models.transitions import Change as By
from ..models.transitions import check_move
from .execution import Assumed, RunStopped


@dataclass(frozen=True)
class RowUpdate:
    """A row's new values (`values`), written only while its columns `only_if` still hold (else the
    row is left as it is, and the rest of the change written). `obj`: the instance that stands for the
    row; it gets the values once the change is applied (never before: a change may be built twice)."""

    obj: Model
    values: Mapping[str, Any]
    only_if: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """An event on the run's chain: its action, the object it is about, and its payload."""

    action: str
    obj: Model
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Cost:
    """What a change adds to the run's totals."""

    usd: Decimal = Decimal(0)
    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.usd + other.usd,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
        )

    def __bool__(self) -> bool:
        return bool(self.usd or self.input_tokens or self.output_tokens)


@dataclass(frozen=True)
class Expect:
    """What a change assumes of the run beyond this process's claim: its `status` as read (a claim,
    which raises the claim's epoch itself), and that every step is settled but the one the
    change settles (`settled_but`: a run's end, with its last step's success or without). `durable`
    False: the commit need not wait for the WAL's flush (a claim: lost in a crash of the server, the
    run is as it was, and delivered again)."""

    status: str | None = None
    settled: bool = False
    settled_but: int | None = None
    durable: bool = True

    def __add__(self, other: Expect) -> Expect:
        return Expect(
            status=self.status if self.status is not None else other.status,
            settled=self.settled or other.settled,
            settled_but=self.settled_but if self.settled_but is not None else other.settled_but,
            durable=self.durable or other.durable,
        )


@dataclass(frozen=True)
class RunEnd:
    """A run's end: what it sets on its task (`task`, for the task's own run; its totals are always
    summed again), and the run's chain sealed by the change's last event, its seal left pending for
    the sealer (audit.seals)."""

    task: Mapping[str, Any]
    now: Any


@dataclass(frozen=True)
class Change:
    """What one change of the run writes (see the module's docstring). `stops`: the run stops once the
    change is applied (a check said no: the change records why). `result`: what the function that
    built it hands back to its caller once applied (a call started, a plan recorded)."""

    by: tuple[By, ...]
    updates: tuple[RowUpdate, ...] = ()
    inserts: tuple[Model, ...] = ()
    events: tuple[Event, ...] = ()
    cost: Cost = Cost()
    run: Mapping[str, Any] = field(default_factory=dict)
    expect: Expect = Expect()
    ends: RunEnd | None = None
    stops: RunStopped | None = None
    result: Any = None

    def __add__(self, other: Change) -> Change:
        """Both changes, applied as one (their rows, events and costs in order)."""
        assert self.ends is None, "a run's end is the last change of a composition"
        return Change(
            by=self.by + other.by,
            updates=self.updates + other.updates,
            inserts=self.inserts + other.inserts,
            events=self.events + other.events,
            cost=self.cost + other.cost,
            run={**self.run, **other.run},
            expect=self.expect + other.expect,
            ends=other.ends,
            stops=self.stops or other.stops,
            result=(self.result, other.result),
        )


# A change built on the run as a write finds it (its totals before the change, its stamps).
Build = Callable[[Assumed], Change]


def then(first: Build, second: Callable[[Assumed, Change], Change]) -> Build:
    """Two changes applied as one: `second` built on the run as `first` leaves it (its cost added),
    knowing `first` (a follower's messages quote the answer that `first` records)."""

    def build(assumed: Assumed) -> Change:
        done = first(assumed)
        return done + second(
            assumed.plus(done.cost.usd, done.cost.input_tokens, done.cost.output_tokens), done
        )

    return build


def moved(obj: Model, by: By, only_if: Mapping[str, Any] | None = None, **values: Any) -> RowUpdate:
    """A row update; a status among the values is checked against the transition table (from the
    status `only_if` names, else the instance's own)."""
    if "status" in values:
        before = (only_if or {}).get("status", getattr(obj, "status", None))
        if before != values["status"] or type(obj) is Run or by != By.STEP_STARTED:
            check_move(type(obj), before, values["status"], by)
    return RowUpdate(obj, values, only_if or {})


def inserted(obj: Model, by: By) -> Model:
    """A row inserted; its status (if it has one) checked against the transition table as a move from
    nothing."""
    status = getattr(obj, "status", None)
    if status is not None:
        check_move(type(obj), None, status, by)
    return obj
