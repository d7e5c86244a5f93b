"""Verification: recompute every chain, check it against the signed checkpoints read from files (the
trust anchor outside the database), check purges and seals, and compare the operational rows with the
events that describe them. Names the first event that does not hold, with what was expected.

Two ways in:
- `verify()`: everything. Reads events in (chain, seq) order in batches; memory grows with the number
  of sealed chains (a few dozen bytes each), not with events.
- `verify(chains=[...])`: one run's proof (its chain, its seal, the checkpoint that covers it, its
  rows), read through indexes: milliseconds, whatever the size of the record. What a dossier shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KT

from . import chain, signing
from .checkpoints import body_digest, checkpoint_files, checkpoint_row, file_matches_row, purge_problem
from .models import GLOBAL_CHAIN, AuditEvent, ChainPurge, Checkpoint, CheckpointHead

BATCH = 2000  # events per database round trip; a few MB at most
HEAD_BATCH = 1000  # signed heads looked up per query


@dataclass(frozen=True)
class Problem:
    # altered | missing | reordered | added | checkpoint | purge | row | unsealed
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
                f"; checkpoint {self.checkpoint_number or self.checkpoint_id} ({self.checkpoint_at}) verifies"
                if self.checkpoint_id or self.checkpoint_number
                else ""
            )
            return f"intact up to event {self.last_event_id} ({self.events} events in {self.chains} chains){proof}"
        first = self.first_problem
        assert first is not None
        return f"NOT INTACT: {first.sentence()} ({len(self.problems)} problem(s) in all)"


# --- rows described by events: checks registered by the apps that own the rows -----------------

RowCheck = Callable[[list[str] | None], Iterable[Problem]]
_ROW_CHECKS: list[RowCheck] = []


def row_check_register(check: RowCheck) -> RowCheck:
    """Register a comparison of an app's rows with the events that describe them. It gets the run
    chains to check (None: all) and yields a Problem per difference. The audit app knows no rows."""
    if check not in _ROW_CHECKS:
        _ROW_CHECKS.append(check)
    return check


def hash_short(value: str) -> str:
    return f"{value[:16]}…" if value else "(none)"


# --- one chain, event by event ------------------------------------------------------------------


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
        .filter(chain=GLOBAL_CHAIN, action="run.sealed", sealed_chain=name)
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
    qs = AuditEvent.objects.filter(chain=GLOBAL_CHAIN, action="task.purged")
    if chains is not None:
        wanted = Q()
        for name in chains:
            wanted |= Q(payload__chains__contains=[{"chain": name}])
        qs = qs.filter(wanted) if chains else qs.none()
    names: set[str] = set()
    for payload in qs.values_list("payload", flat=True).iterator(chunk_size=BATCH):
        names.update(c.get("chain") for c in payload.get("chains", []) if isinstance(c, dict))
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


# --- entry points -------------------------------------------------------------------------------


def verify(
    *,
    chains: list[str] | None = None,
    use_checkpoint: bool = True,
    checkpoint_dir: Path | str | None = None,
    public_key: Path | str | None = None,
    rows: bool = True,
) -> Report:
    """checkpoint_dir and public_key: the trust anchor (default AUDIT_CHECKPOINT_DIR and the key of
    AUDIT_PUBLIC_KEY_FILE, else the signing key's own)."""
    key = signing.trusted_public_key(public_key)
    if chains is not None:
        report = _verify_runs(chains, key=key, use_checkpoint=use_checkpoint)
    else:
        directory = Path(checkpoint_dir) if checkpoint_dir else settings.AUDIT_CHECKPOINT_DIR
        report = _verify_all(key=key, use_checkpoint=use_checkpoint, directory=directory)
    if rows:
        for check in _ROW_CHECKS:
            report.problems.extend(check(chains))
    return report


def _verify_runs(chains: list[str], *, key: Ed25519PublicKey, use_checkpoint: bool) -> Report:
    """One run's proof (or a few): its chain, its seal, the checkpoint that covers it."""
    report = Report(anchor="checkpoint rows, each checked against its file")
    purges = {p.chain: p for p in ChainPurge.objects.filter(chain__in=chains)}
    sealed: set[str] = set()
    latest = Checkpoint.objects.only("pk", "created_at").order_by("-id").first() if use_checkpoint else None
    for name in chains:
        events = list(AuditEvent.objects.filter(chain=name).order_by("seq"))
        walk = _Walk(name)
        for event in events:
            problem = walk.feed(event)
            if problem is not None:
                report.problems.append(problem)
        if events:
            report.chains += 1
            report.events += len(events)
            report.last_event_id = max(report.last_event_id, max(e.pk for e in events))
        seal = _seal_of(name)
        if seal is not None:
            sealed.add(name)
            added = next((e.pk for e in events if e.seq == seal.seq + 1), None)
            report.problems.extend(_seal_problems(name, seal, walk.tail, purges.get(name), key, added))
        if use_checkpoint and name not in purges:
            report.problems.extend(_covering_problems(report, name, events, seal, latest, key))
    report.problems.extend(_unrecorded_purges(purges, sealed, chains))
    return report


def _covering_problems(
    report: Report,
    name: str,
    events: list[AuditEvent],
    seal: _Seal | None,
    latest: Checkpoint | None,
    key: Ed25519PublicKey,
) -> Iterator[Problem]:
    row = CheckpointHead.objects.filter(chain=name).select_related("checkpoint").order_by("-seq").first()
    signed_seq = 0
    if row is not None:
        checkpoint = row.checkpoint
        label = f"checkpoint {checkpoint.number or checkpoint.pk}"
        report.checkpoint_id, report.checkpoint_number = checkpoint.pk, checkpoint.number
        report.checkpoint_at = checkpoint.created_at.isoformat()
        report.checkpoints_checked += 1
        if not checkpoint_row(checkpoint, key=key).signature_ok:
            yield Problem("checkpoint", None, name, row.seq, f"{label}: its signature does not hold")
            return
        why = file_matches_row(checkpoint)
        if why is not None:
            yield Problem("checkpoint", None, name, row.seq, why)
        signed = checkpoint.body.get("heads", {}).get(name)
        if signed is None:
            yield Problem(
                "checkpoint", None, name, row.seq, f"{label} does not sign this chain (index row forged)"
            )
            return
        signed_seq, signed_hash = signed
        event = next((e for e in events if e.seq == signed_seq), None)
        if event is None:
            yield Problem(
                "missing",
                None,
                name,
                signed_seq,
                f"{label} signed seq {signed_seq} of this chain; that event is gone",
                expected=f"seq {signed_seq} with hash {hash_short(signed_hash)}",
                near_id=events[-1].pk if events else None,
            )
        elif event.hash != signed_hash:
            yield Problem(
                "checkpoint",
                event.pk,
                name,
                signed_seq,
                f"{label}: event #{event.pk} ({name} seq {signed_seq}) differs from the signed head",
                expected=f"hash {hash_short(signed_hash)}, found {hash_short(event.hash)}",
            )
    if seal is not None and latest is not None:
        yield from _unsigned(name, seal, signed_seq, latest.created_at)


def _verify_all(*, key: Ed25519PublicKey, use_checkpoint: bool, directory: Path) -> Report:
    report = Report(anchor=str(directory) if use_checkpoint else "")
    purges = {p.chain: p for p in ChainPurge.objects.all()}
    seals: dict[str, _Seal] = {}
    tails: dict[str, tuple[int, str, int]] = {}
    checkpoint_events: list[tuple[int, int, str]] = []  # (event id, checkpoint row id, file)
    walk: _Walk | None = None
    for event in AuditEvent.objects.order_by("chain", "seq").iterator(chunk_size=BATCH):
        if walk is None or event.chain != walk.name:
            if walk is not None and walk.tail is not None:
                tails[walk.name] = walk.tail
            walk = _Walk(event.chain)
            report.chains += 1
        report.events += 1
        report.last_event_id = max(report.last_event_id, event.pk)
        if event.chain == GLOBAL_CHAIN and event.action == "run.sealed":
            seals[event.payload.get("chain", "")] = _seal(event)
        elif event.chain == GLOBAL_CHAIN and event.action == "audit.checkpoint":
            checkpoint_events.append((event.pk, int(event.object_id), event.payload.get("file", "")))
        problem = walk.feed(event)
        if problem is not None:
            report.problems.append(problem)
    if walk is not None and walk.tail is not None:
        tails[walk.name] = walk.tail
    for name, seal in seals.items():
        tail = tails.get(name)
        added = _event_id(name, seal.seq + 1) if tail and tail[0] > seal.seq else None
        report.problems.extend(_seal_problems(name, seal, tail, purges.get(name), key, added))
    report.problems.extend(_unrecorded_purges(purges, set(seals), None))
    if use_checkpoint:
        report.problems.extend(_anchor_problems(report, directory, key, seals, purges, checkpoint_events))
    return report


def _event_id(name: str, seq: int) -> int | None:
    return AuditEvent.objects.filter(chain=name, seq=seq).values_list("pk", flat=True).first()


def _anchor_problems(
    report: Report,
    directory: Path,
    key: Ed25519PublicKey,
    seals: dict[str, _Seal],
    purges: dict[str, ChainPurge],
    checkpoint_events: list[tuple[int, int, str]],
) -> Iterator[Problem]:
    """Every signed checkpoint file: signature, numbering and links, each head against the events;
    and the database's checkpoint rows and events against the files."""
    rows = {
        number or pk: (pk, signature, file_name)
        for pk, number, signature, file_name in Checkpoint.objects.values_list(
            "pk", "number", "signature", "file_name"
        )
    }
    row_ids = {pk for pk, _, _ in rows.values()}
    seen: set[int] = set()
    covered: dict[str, int] = {}  # chain -> highest seq a checkpoint signed
    pending: list[tuple[str, int, str, str]] = []
    reported: set[str] = set()
    previous: Any = None
    latest_at: datetime | None = None
    for item in checkpoint_files(directory, key=key):
        if isinstance(item, str):
            yield Problem("checkpoint", None, GLOBAL_CHAIN, None, item)
            continue
        label = f"checkpoint {item.number} ({item.source})"
        seen.add(item.number or 0)
        if not item.signature_ok:
            yield Problem(
                "checkpoint",
                None,
                GLOBAL_CHAIN,
                None,
                f"{label}: the signature does not hold with the trusted key {signing.key_id(key)}",
            )
            continue
        report.checkpoints_checked += 1
        number = item.number or 0
        if previous is not None and number:
            if number == previous.number and item.signature == previous.signature:
                continue  # the same checkpoint copied twice
            if number <= previous.number:
                yield Problem(
                    "checkpoint", None, GLOBAL_CHAIN, None, f"{label}: number {number} appears twice"
                )
                continue
            if number != previous.number + 1:
                yield Problem(
                    "checkpoint",
                    None,
                    GLOBAL_CHAIN,
                    None,
                    f"checkpoint files {previous.number + 1}..{number - 1} are missing from {directory}",
                )
            elif item.body.get("previous") != body_digest(previous.body):
                yield Problem(
                    "checkpoint",
                    None,
                    GLOBAL_CHAIN,
                    None,
                    f"{label} does not link to checkpoint {previous.number}",
                )
        previous = item
        row = rows.get(number)
        if row is None:
            yield Problem(
                "checkpoint", None, GLOBAL_CHAIN, None, f"{label}: its row is gone from the database"
            )
        elif row[1] != item.signature:
            yield Problem("checkpoint", None, GLOBAL_CHAIN, None, f"{label}: its row differs from its file")
        report.checkpoint_number, report.checkpoint_id = number, row[0] if row else None
        report.checkpoint_at = item.body.get("created_at")
        latest_at = datetime.fromisoformat(report.checkpoint_at) if report.checkpoint_at else latest_at
        for name, (seq, head_hash) in item.heads.items():
            covered[name] = max(covered.get(name, 0), seq)
            if seq:
                pending.append((name, seq, head_hash, label))
        if len(pending) >= HEAD_BATCH:
            yield from _head_problems(pending, purges, reported)
            pending = []
    yield from _head_problems(pending, purges, reported)
    for number, (pk, _, file_name) in sorted(rows.items()):
        if number not in seen:
            yield Problem(
                "checkpoint",
                None,
                GLOBAL_CHAIN,
                None,
                f"checkpoint {number} (row {pk}) has no file {file_name} in {directory}",
            )
    for event_id, row_id, file_name in checkpoint_events:
        if row_id not in row_ids:
            yield Problem(
                "checkpoint",
                event_id,
                GLOBAL_CHAIN,
                None,
                f"this audit.checkpoint event names checkpoint row {row_id} ({file_name}), which is gone",
            )
    if latest_at is not None:
        for name, seal in seals.items():
            if name not in purges:
                yield from _unsigned(name, seal, covered.get(name, 0), latest_at)


def _head_problems(
    heads: list[tuple[str, int, str, str]], purges: dict[str, ChainPurge], reported: set[str]
) -> Iterator[Problem]:
    """Signed heads against the events, one query per batch; one problem per chain at most."""
    wanted = [(n, s, h, label) for n, s, h, label in heads if not (n in purges and purges[n].last_seq >= s)]
    if not wanted:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.chain, e.seq, e.id, e.hash FROM audit_auditevent e "
            "JOIN unnest(%s::text[], %s::bigint[]) AS w(chain, seq) ON e.chain = w.chain AND e.seq = w.seq",
            [[n for n, *_ in wanted], [s for _, s, *_ in wanted]],
        )
        found = {(name, seq): (pk, event_hash) for name, seq, pk, event_hash in cursor.fetchall()}
    for name, seq, head_hash, label in wanted:
        if name in reported:
            continue
        event = found.get((name, seq))
        if event is None:
            reported.add(name)
            yield Problem(
                "checkpoint",
                None,
                name,
                seq,
                f"{label}: event {seq} of chain {name} is missing",
                expected=f"seq {seq} with hash {hash_short(head_hash)}",
            )
        elif event[1] != head_hash:
            reported.add(name)
            yield Problem(
                "checkpoint",
                event[0],
                name,
                seq,
                f"{label}: event #{event[0]} ({name} seq {seq}) differs from the signed head",
                expected=f"hash {hash_short(head_hash)}, found {hash_short(event[1])}",
            )
