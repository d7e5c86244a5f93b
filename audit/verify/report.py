"""What verification reports: each problem, named by its event (or the last sound one before it),
with what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..templatetags.display import time_text


@dataclass(frozen=True)
class Problem:
    # altered | missing | reordered | added | checkpoint | purge | row | unsealed | grant
    kind: str
    event_id: int | None  # the bad event, when it still exists
    chain: str
    seq: int | None
    detail: str
    expected: str = ""
    near_id: int | None = None  # for an event that is gone: the last sound event before it

    def sentence(self) -> str:
        where = f"event #{self.event_id}" if self.event_id else f"chain {self.chain}"
        place = f"{self.chain}, seq {self.seq}" if self.seq is not None else self.chain
        text = f"{self.kind}: {where} ({place}): {self.detail}"
        return f"{text}; expected {self.expected}" if self.expected else text


@dataclass
class Report:
    events: int = 0
    chains: int = 0
    last_event_id: int = 0
    problems: list[Problem] = field(default_factory=list)
    checkpoint_id: int | None = None
    checkpoint_number: int | None = None
    checkpoint_at: str | None = None
    checkpoints_checked: int = 0
    anchor: str = ""  # where the signed checkpoints were read from
    # One run's proof: each logged chain's inclusion in the latest signed tree head (audit.inclusion).
    inclusions: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def intact(self) -> bool:
        return not self.problems

    @property
    def first_problem(self) -> Problem | None:
        located = [p for p in self.problems if (p.event_id or p.near_id) is not None]
        if located:
            return min(located, key=lambda p: p.event_id or p.near_id or 0)
        return self.problems[0] if self.problems else None

    def summary(self) -> str:
        if self.intact:
            proof = (
                f"; checkpoint {self.checkpoint_number or self.checkpoint_id} ({time_text(self.checkpoint_at)}) verifies"
                if self.checkpoint_id or self.checkpoint_number
                else ""
            )
            events = f"{self.events} event{'' if self.events == 1 else 's'}"
            chains = f"{self.chains} chain{'' if self.chains == 1 else 's'}"
            return f"intact up to event {self.last_event_id} ({events} in {chains}){proof}"
        first = self.first_problem
        assert first is not None
        return f"NOT INTACT: {first.sentence()} ({len(self.problems)} problem(s) in all)"


def hash_short(value: str) -> str:
    return f"{value[:16]}…" if value else "(none)"
