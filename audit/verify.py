"""Verification: recompute every chain, check it against the signed checkpoints read from files (the
trust anchor outside the database), check purges and seals, and compare the operational rows with the
events that describe them. Names the first event that does not hold, with what was expected.

Two ways in:
- `verify()`: everything. Reads events in (chain, seq) order in batches, one chain at a time, and
  checkpoint files one at a time; what must be compared across chains goes to temporary tables that
  the database compares. Its memory is bounded by a batch, not by events, chains or checkpoints.
- `verify(chains=[...])`: one run's proof (its chain, its seal, the checkpoint that covers it, its
  rows), read through indexes: milliseconds, whatever the size of the record. What a dossier shows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.transaction import TransactionManagementError

from . import chain, signing
from .actions import Action
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
    """Everything, in memory bounded by a batch whatever the number of chains: chains are walked one at
    a time in (chain, seq) order; what must be compared across chains (seals with the ends of their
    chains, signed heads with seals, purges with the global chain) goes to temporary tables, and the
    database compares them."""
    report = Report(anchor=str(directory) if use_checkpoint else "")
    with connection.cursor() as cursor, _scratch(cursor):
        tails = _Rows(cursor, "verify_tail", 4)
        walk: _Walk | None = None
        for event in AuditEvent.objects.order_by("chain", "seq").iterator(chunk_size=BATCH):
            if walk is None or event.chain != walk.name:
                if walk is not None and walk.tail is not None:
                    tails.add(walk.name, *walk.tail)
                walk = _Walk(event.chain)
                report.chains += 1
            report.events += 1
            report.last_event_id = max(report.last_event_id, event.pk)
            problem = walk.feed(event)
            if problem is not None:
                report.problems.append(problem)
        if walk is not None and walk.tail is not None:
            tails.add(walk.name, *walk.tail)
        tails.flush()
        report.problems.extend(_seals_against_tails(key))
        report.problems.extend(_unrecorded_purges_all())
        if use_checkpoint:
            report.problems.extend(_anchor_problems(report, cursor, directory, key))
    return report


@contextmanager
def _scratch(cursor: Any) -> Iterator[None]:
    """The temporary tables of one full verification (this session only, dropped after)."""
    drop = "DROP TABLE IF EXISTS pg_temp.verify_tail, pg_temp.verify_signed, pg_temp.verify_seen"
    cursor.execute(drop)
    cursor.execute("CREATE TEMP TABLE verify_tail (chain text PRIMARY KEY, seq bigint, hash text, id bigint)")
    cursor.execute("CREATE TEMP TABLE verify_signed (chain text, seq bigint)")
    cursor.execute("CREATE INDEX ON verify_signed (chain, seq)")
    cursor.execute("CREATE TEMP TABLE verify_seen (number bigint)")
    try:
        yield
    finally:
        with suppress(DatabaseError, TransactionManagementError):  # an aborted transaction drops them
            cursor.execute(drop)


class _Rows:
    """Rows for a temporary table, inserted a batch at a time."""

    def __init__(self, cursor: Any, table: str, width: int):
        self.cursor, self.rows = cursor, []
        self.sql = f"INSERT INTO {table} VALUES ({', '.join(['%s'] * width)})"  # noqa: S608 (our own temporary tables)

    def add(self, *row: Any) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.cursor.executemany(self.sql, self.rows)
            self.rows = []


def _stream(sql: str, params: list[Any]) -> Iterator[tuple[Any, ...]]:
    """The rows of a query, a batch at a time through a server-side cursor."""
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(BATCH):
            yield from rows


def _json(value: Any) -> dict[str, Any]:
    """A jsonb column read through a plain cursor (Django leaves it as text)."""
    value = json.loads(value) if isinstance(value, str | bytes) else value
    return value if isinstance(value, dict) else {}


_EVENTS, _PURGES = AuditEvent._meta.db_table, ChainPurge._meta.db_table
_SEALS = f"{_EVENTS} s WHERE s.chain = %s AND s.action = 'run.sealed'"  # noqa: S608 (table names only)


def _seals_against_tails(key: Ed25519PublicKey) -> Iterator[Problem]:
    """Each seal against the end of its chain (and its purge): only the rows that differ come back."""
    rows = _stream(
        f"SELECT s.payload, s.id, s.occurred_at, t.seq, t.hash, t.id,"  # noqa: S608 (table names only)
        f" p.chain, p.last_seq, p.last_hash, p.purged_at, p.reason, p.signature"
        f" FROM {_SEALS.split(' WHERE ')[0]}"
        f" LEFT JOIN verify_tail t ON t.chain = s.payload->>'chain'"
        f" LEFT JOIN {_PURGES} p ON p.chain = s.payload->>'chain'"
        f" WHERE s.chain = %s AND s.action = 'run.sealed' AND (p.chain IS NOT NULL OR t.chain IS NULL"
        f" OR t.seq::text IS DISTINCT FROM s.payload->>'seq' OR t.hash IS DISTINCT FROM s.payload->>'hash')",
        [GLOBAL_CHAIN],
    )
    for raw, seal_id, sealed_at, tail_seq, tail_hash, tail_id, purged, *purge in rows:
        payload = _json(raw)
        name = payload.get("chain", "")
        seal = _Seal(payload.get("seq", 0), payload.get("hash", ""), seal_id, sealed_at)
        tail = (tail_seq, tail_hash, tail_id) if tail_seq is not None else None
        found = None
        if purged is not None:
            last_seq, last_hash, purged_at, reason, signature = purge
            found = ChainPurge(
                chain=purged,
                last_seq=last_seq,
                last_hash=last_hash,
                purged_at=purged_at,
                reason=reason,
                signature=signature,
            )
        added = _event_id(name, seal.seq + 1) if tail and tail[0] > seal.seq else None
        yield from _seal_problems(name, seal, tail, found, key, added)


def _unrecorded_purges_all() -> Iterator[Problem]:
    """Purges that no seal or no task.purged event of the global chain vouches for."""
    rows = _stream(
        f"WITH recorded AS (SELECT DISTINCT c->>'chain' AS chain FROM {_EVENTS} t,"  # noqa: S608
        " jsonb_array_elements(CASE jsonb_typeof(t.payload->'chains') WHEN 'array'"
        " THEN t.payload->'chains' ELSE '[]'::jsonb END) AS c"
        " WHERE t.chain = %s AND t.action = 'task.purged')"
        f" SELECT p.chain, p.last_seq FROM {_PURGES} p"
        f" WHERE NOT EXISTS (SELECT 1 FROM {_SEALS} AND s.payload->>'chain' = p.chain)"
        " OR NOT EXISTS (SELECT 1 FROM recorded r WHERE r.chain = p.chain) ORDER BY p.chain",
        [GLOBAL_CHAIN, GLOBAL_CHAIN],
    )
    for name, last_seq in rows:
        yield Problem(
            "purge",
            None,
            name,
            last_seq,
            "its events were deleted under a purge that the global chain does not record",
        )


def _event_id(name: str, seq: int) -> int | None:
    return AuditEvent.objects.filter(chain=name, seq=seq).values_list("pk", flat=True).first()


def _anchor_problems(
    report: Report, cursor: Any, directory: Path, key: Ed25519PublicKey
) -> Iterator[Problem]:
    """Every signed checkpoint file, one at a time: signature, numbering and links, each head against
    the events; then the database's checkpoint rows and events against the files."""
    signed, seen = _Rows(cursor, "verify_signed", 2), _Rows(cursor, "verify_seen", 1)
    files: list[tuple[int, str, str]] = []  # (number, signature, label) waiting for their rows
    pending: list[tuple[str, int, str, str]] = []
    reported: set[str] = set()
    previous: Any = None
    latest_at: datetime | None = None
    for item in checkpoint_files(directory, key=key):
        if isinstance(item, str):
            yield Problem("checkpoint", None, GLOBAL_CHAIN, None, item)
            continue
        label = f"checkpoint {item.number} ({item.source})"
        number = item.number or 0
        seen.add(number)
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
        files.append((number, item.signature, label))
        report.checkpoint_number = number
        report.checkpoint_at = item.body.get("created_at")
        latest_at = datetime.fromisoformat(report.checkpoint_at) if report.checkpoint_at else latest_at
        for name, (seq, head_hash) in item.heads.items():
            signed.add(name, seq)
            if seq:
                pending.append((name, seq, head_hash, label))
        if len(pending) >= HEAD_BATCH:
            yield from _head_problems(pending, reported)
            pending = []
        if len(files) >= HEAD_BATCH:
            yield from _file_rows(report, files)
            files = []
    yield from _head_problems(pending, reported)
    yield from _file_rows(report, files)
    signed.flush()
    seen.flush()
    table = Checkpoint._meta.db_table
    for number, pk, file_name in _stream(
        f"SELECT COALESCE(c.number, c.id), c.id, c.file_name FROM {table} c"  # noqa: S608
        " WHERE NOT EXISTS (SELECT 1 FROM verify_seen v WHERE v.number = COALESCE(c.number, c.id)) ORDER BY 1",
        [],
    ):
        yield Problem(
            "checkpoint",
            None,
            GLOBAL_CHAIN,
            None,
            f"checkpoint {number} (row {pk}) has no file {file_name} in {directory}",
        )
    for event_id, row_id, raw in _stream(
        f"SELECT e.id, e.object_id, e.payload FROM {_EVENTS} e"  # noqa: S608
        " WHERE e.chain = %s AND e.action = 'audit.checkpoint'"
        f" AND NOT EXISTS (SELECT 1 FROM {table} c WHERE c.id::text = e.object_id) ORDER BY e.id",
        [GLOBAL_CHAIN],
    ):
        yield Problem(
            "checkpoint",
            event_id,
            GLOBAL_CHAIN,
            None,
            f"this audit.checkpoint event names checkpoint row {row_id} ({_json(raw).get('file', '')}), which is gone",
        )
    if latest_at is not None:
        for raw, seal_id, sealed_at, signed_seq in _stream(
            f"SELECT s.payload, s.id, s.occurred_at,"  # noqa: S608
            " (SELECT max(v.seq) FROM verify_signed v WHERE v.chain = s.payload->>'chain')"
            f" FROM {_SEALS} AND NOT EXISTS (SELECT 1 FROM {_PURGES} p WHERE p.chain = s.payload->>'chain')",
            [GLOBAL_CHAIN],
        ):
            payload = _json(raw)
            seal = _Seal(payload.get("seq", 0), payload.get("hash", ""), seal_id, sealed_at)
            yield from _unsigned(payload.get("chain", ""), seal, signed_seq or 0, latest_at)


def _file_rows(report: Report, files: list[tuple[int, str, str]]) -> Iterator[Problem]:
    """Checkpoint files against their rows, a batch at a time."""
    rows = dict(
        (number, (pk, signature))
        for number, pk, signature in Checkpoint.objects.filter(
            number__in=[n for n, _, _ in files]
        ).values_list("number", "pk", "signature")
    )
    for number, signature, label in files:
        row = rows.get(number)
        if row is None:
            yield Problem(
                "checkpoint", None, GLOBAL_CHAIN, None, f"{label}: its row is gone from the database"
            )
        elif row[1] != signature:
            yield Problem("checkpoint", None, GLOBAL_CHAIN, None, f"{label}: its row differs from its file")
        if number == report.checkpoint_number:
            report.checkpoint_id = row[0] if row else None


def _head_problems(heads: list[tuple[str, int, str, str]], reported: set[str]) -> Iterator[Problem]:
    """Signed heads against the events, one query per batch; one problem per chain at most. A head at
    or below a chain's purge is gone by design (the purge itself is checked against its seal)."""
    if not heads:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT w.chain, w.seq, e.id, e.hash, p.last_seq FROM unnest(%s::text[], %s::bigint[]) AS w(chain, seq)"  # noqa: S608
            f" LEFT JOIN {_EVENTS} e ON e.chain = w.chain AND e.seq = w.seq"
            f" LEFT JOIN {_PURGES} p ON p.chain = w.chain",
            [[n for n, *_ in heads], [s for _, s, *_ in heads]],
        )
        found = {}
        purged = set()
        for name, seq, pk, event_hash, purged_seq in cursor.fetchall():
            if purged_seq is not None and purged_seq >= seq:
                purged.add((name, seq))
            elif pk is not None:
                found[(name, seq)] = (pk, event_hash)
    wanted = [h for h in heads if (h[0], h[1]) not in purged]
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
