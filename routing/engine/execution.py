"""This process's execution of one run: the run, and what the process knows of it while it holds the
run's lock. Every part of the engine takes a `RunExecution`; nothing is kept on the model instances.

Also the errors that stop a run or the process executing it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import psycopg
from django import db as django_db

from ..models import Run


class ClaimLost(Exception):
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
class Assumed:
    """The run as this process last read it under the run row's lock: its totals and the stamps of the
    policy rules and the workers. A compiled write checks all of it still holds (executor)."""

    spent: Decimal  # the run's cost so far
    input_tokens: int
    output_tokens: int
    rules_stamp: str  # the policy rules' stamp (audit.policies.rules_as_of)
    workers_stamp: str = ""  # the workers' stamp (engine.workers.workers_as_of)
    # Read under the run row's lock in the transaction the change is built in (its plain form): a
    # change may then read more of the run (its unsettled steps) than this process remembers.
    locked: bool = field(default=False, compare=False)

    def totals(self) -> dict[str, Any]:
        """The run's totals as its columns name them (cost_usd, input_tokens, output_tokens)."""
        return {
            "cost_usd": self.spent,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }

    def plus(self, cost: Decimal, input_tokens: int, output_tokens: int) -> Assumed:
        """These totals with a cost added, the amount rounded as the run's cost column keeps it (or the
        next guard, comparing with the column, misses)."""
        return replace(
            self,
            spent=stored_usd(self.spent + cost),
            input_tokens=self.input_tokens + input_tokens,
            output_tokens=self.output_tokens + output_tokens,
        )


def stored_usd(amount: Decimal) -> Decimal:
    """An amount as the run's cost column stores it (PostgreSQL rounds half away from zero)."""
    places = Run._meta.get_field("cost_usd").decimal_places  # type: ignore[union-attr]
    return amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class FirstIds:
    """Primary keys drawn with a first delivery's claim for its first plan's rows: its decision's and up
    to IDS_AHEAD steps' (claim.IDS_AHEAD). Used once, by the first plan's record."""

    decision: int
    steps: list[int]


@dataclass
class RunExecution:
    """One run as this process executes it.

    `assumed`: the run as last read under its row's lock (None until the claim). `head`: the head
    (seq, hash) of the run's chain as this process last wrote or read it (None when it does not know
    it: the next write reads it under its lock). `claim_lost`: set by the lock's keeper when the lock's
    connection died. `resumed`: not the run's first delivery (a first has nothing to look up).
    `first_ids`: drawn with a first delivery's claim.
    """

    run: Run
    assumed: Assumed | None = None
    head: tuple[int, str] | None = None
    claim_lost: threading.Event = field(default_factory=threading.Event)
    resumed: bool = True
    first_ids: FirstIds | None = None
    log_ids: dict[str, str] | None = None

    def claim_current(self) -> None:
        """Before a provider call or a write: stop if the lock's connection was lost (no round trip)."""
        if self.claim_lost.is_set():
            raise ClaimLost(f"run {self.run.pk}: the lock's connection was lost; this process stops")

    def take_first_ids(self) -> FirstIds | None:
        """The ids drawn with the claim, once: a later plan draws its own."""
        ids, self.first_ids = self.first_ids, None
        return ids
