"""One chain, event by event (the walk), and what its seal, its purge and the checkpoints say of its end."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db.models import Q
from django.db.models.fields.json import KT

from .. import chain
from ..actions import Action
from ..checkpoints import purge_problem
from ..models import GLOBAL_CHAIN, AuditEvent, ChainPurge
from .report import Problem, hash_short

BATCH = 2000  # events per database round trip; a few MB at most


HEAD_BATCH = 1000  # signed heads looked up per query


class _Walk:
    """Follows one chain in seq order; reports the first event that does not hold, once."""

    def __init__(self, name: str):
        self.name = name
        self.expected_seq = 1
        self.prev_hash = chain.GENESIS
        self.prev_id: int | None = None
        self.broken = False
        self.tail: tuple[int, str, int] | None = None  # (seq, hash, id) of the last event

    def feed(self, event: AuditEvent) -> Problem | None:
        problem = None if self.broken else self._check(event)
        if problem is not None:
            self.broken = True  # past here the chain cannot be trusted; report it once
        self.expected_seq, self.prev_hash, self.prev_id = event.seq + 1, event.hash, event.pk
        self.tail = (event.seq, event.hash, event.pk)
        return problem

    def _check(self, event: AuditEvent) -> Problem | None:
        before = f"event #{self.prev_id} (seq {self.expected_seq - 1})" if self.prev_id else "its start"
        if event.seq > self.expected_seq:
            gone = (
                f"seq {self.expected_seq} is"
                if event.seq == self.expected_seq + 1
                else f"seq {self.expected_seq}..{event.seq - 1} are"
            )
            return Problem(
                "missing",
                None,
                self.name,
                self.expected_seq,
                f"{gone} gone: the chain jumps from {before} to event #{event.pk} (seq {event.seq})",
                expected=f"seq {self.expected_seq} linking to hash {hash_short(self.prev_hash)}",
                near_id=self.prev_id or event.pk,
            )
        if event.seq < self.expected_seq:
            return Problem(
                "reordered",
                event.pk,
                self.name,
                event.seq,
                f"its seq {event.seq} comes after {before}",
                expected=f"seq {self.expected_seq}",
            )
        recomputed = chain.digest(event.prev_hash, chain.event_content(event))
        if event.prev_hash != self.prev_hash:
            if recomputed == event.hash and self.prev_id is not None:
                # This event is whole and links to what the one before it was: that one was rewritten
                # and its hash recomputed.
                return Problem(
                    "altered",
                    self.prev_id,
                    self.name,
                    self.expected_seq - 1,
                    f"its hash was recomputed after a change: the next event #{event.pk} links to another hash",
                    expected=f"hash {hash_short(event.prev_hash)}, found {hash_short(self.prev_hash)}",
                )
            return Problem(
                "reordered",
                event.pk,
                self.name,
                event.seq,
                f"it does not link to {before}",
                expected=f"prev_hash {hash_short(self.prev_hash)}, found {hash_short(event.prev_hash)}",
            )
        if recomputed != event.hash:
            return Problem(
                "altered",
                event.pk,
                self.name,
                event.seq,
                "its content does not match its hash",
                expected=f"hash {hash_short(recomputed)} for its content, stored {hash_short(event.hash)}",
            )
        return None


@dataclass(frozen=True)
class _Seal:
    seq: int
    hash: str
    event_id: int
    at: datetime


def _seal_problems(
    name: str,
    seal: _Seal,
    tail: tuple[int, str, int] | None,
    purge: ChainPurge | None,
    key: Ed25519PublicKey,
    first_added: int | None,
) -> Iterator[Problem]:
    if purge is not None:
        why = purge_problem(purge, key=key)
        if why is not None:
            yield Problem("purge", None, name, purge.last_seq, why, near_id=seal.event_id)
        elif (purge.last_seq, purge.last_hash) != (seal.seq, seal.hash):
            yield Problem(
                "purge",
                None,
                name,
                purge.last_seq,
                f"the purge names head seq {purge.last_seq}, its seal #{seal.event_id} says {seal.seq}",
                expected=f"seq {seal.seq} with hash {hash_short(seal.hash)}",
                near_id=seal.event_id,
            )
        return
    if tail is None:
        yield Problem(
            "missing",
            None,
            name,
            1,
            f"all events of this sealed chain are gone (seal #{seal.event_id})",
            expected=f"seq 1..{seal.seq} ending in hash {hash_short(seal.hash)}",
            near_id=seal.event_id,
        )
    elif tail[0] < seal.seq:
        gone = f"seq {seal.seq} is" if tail[0] + 1 == seal.seq else f"seq {tail[0] + 1}..{seal.seq} are"
        yield Problem(
            "missing",
            None,
            name,
            tail[0] + 1,
            f"{gone} gone after event #{tail[2]} (seq {tail[0]}); its seal #{seal.event_id} says the chain ends at seq {seal.seq}",
            expected=f"seq {seal.seq} with hash {hash_short(seal.hash)}",
            near_id=tail[2],
        )
    elif tail[0] > seal.seq:
        yield Problem(
            "added",
            first_added,
            name,
            seal.seq + 1,
            f"events were added after its seal #{seal.event_id}, which closed the chain at seq {seal.seq}",
            expected=f"the chain to end at seq {seal.seq}",
            near_id=tail[2],
        )
    elif tail[1] != seal.hash:
        yield Problem(
            "altered",
            tail[2],
            name,
            tail[0],
            f"the chain was rewritten after it was sealed: its last event's hash differs from its seal #{seal.event_id}",
            expected=f"hash {hash_short(seal.hash)}, found {hash_short(tail[1])}",
        )


def _seal_of(name: str) -> _Seal | None:
    event = (
        AuditEvent.objects.annotate(sealed_chain=KT("payload__chain"))
        .filter(chain=GLOBAL_CHAIN, action=Action.RUN_SEALED, sealed_chain=name)
        .order_by("seq")
        .first()
    )
    return _seal(event) if event is not None else None


def _seal(event: AuditEvent) -> _Seal:
    return _Seal(event.payload.get("seq", 0), event.payload.get("hash", ""), event.pk, event.occurred_at)


def _unsigned(name: str, seal: _Seal, signed_seq: int, latest_checkpoint_at: datetime) -> Iterator[Problem]:
    """A sealed chain whose last head no checkpoint signed, though checkpoints were made well after the
    seal (beat signs a sealed head within seconds; deleting its signature leaves this trace)."""
    grace = timedelta(seconds=2 * settings.AUDIT_CHECKPOINT_EVERY_S + 60)
    if signed_seq < seal.seq and latest_checkpoint_at > seal.at + grace:
        yield Problem(
            "unsigned",
            None,
            name,
            seal.seq,
            f"sealed at {seal.at.isoformat()}, but no checkpoint since has signed its last head",
            expected=f"a checkpoint signing seq {seal.seq}",
            near_id=seal.event_id,
        )


def _recorded_purges(chains: list[str] | None) -> set[str]:
    """Run chains whose deletion a task.purged event of the global chain records."""
    qs = AuditEvent.objects.filter(chain=GLOBAL_CHAIN, action=Action.TASK_PURGED)
    if chains is not None:
        wanted = Q()
        for name in chains:
            wanted |= Q(payload__chains__contains=[{"chain": name}])
        qs = qs.filter(wanted) if chains else qs.none()
    names: set[str] = set()
    for payload in qs.values_list("payload", flat=True).iterator(chunk_size=BATCH):
        names.update(str(c.get("chain")) for c in payload.get("chains", []) if isinstance(c, dict))
    return names


def _unrecorded_purges(
    purges: dict[str, ChainPurge], sealed: set[str], chains: list[str] | None
) -> Iterator[Problem]:
    # A ChainPurge row lets the trigger delete a chain's events: it counts only when a seal and a
    # task.purged event of the global chain vouch for it (and its signature holds: _seal_problems).
    if not purges:
        return
    recorded = _recorded_purges(chains)
    for name, purge in purges.items():
        if chains is not None and name not in chains:
            continue
        if name not in sealed or name not in recorded:
            yield Problem(
                "purge",
                None,
                name,
                purge.last_seq,
                "its events were deleted under a purge that the global chain does not record",
            )


def _event_id(name: str, seq: int) -> int | None:
    return AuditEvent.objects.filter(chain=name, seq=seq).values_list("pk", flat=True).first()
