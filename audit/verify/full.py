"""The whole record, in memory bounded by a batch: chains walked one at a time, checkpoint files read
one at a time, and what must be compared across chains compared by PostgreSQL in temporary tables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from .. import signing
from ..checkpoints import body_digest, checkpoint_files, row_matches_file
from ..models import GLOBAL_CHAIN, AuditEvent, ChainPurge, Checkpoint
from .chains import BATCH, HEAD_BATCH, _event_id, _Seal, _seal_problems, _unsigned, _Walk
from .pending import all_end_problems
from .report import Problem, Report, hash_short
from .tree import tree_problems


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
        report.problems.extend(all_end_problems())  # ended chains without a seal: pending ones
        report.problems.extend(_unrecorded_purges_all())
        trees: list[tuple[str, int, bytes]] = []  # (label, size, root) each signed tree head says
        if use_checkpoint:
            report.problems.extend(_anchor_problems(report, cursor, directory, key, trees))
        report.problems.extend(tree_problems(trees))
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
        self.cursor = cursor
        self.rows: list[tuple[Any, ...]] = []
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


def _anchor_problems(
    report: Report, cursor: Any, directory: Path, key: Ed25519PublicKey, trees: list[tuple[str, int, bytes]]
) -> Iterator[Problem]:
    """Every signed checkpoint file, one at a time: signature, numbering and links, each head against
    the events, each tree head into `trees`; then the database's checkpoint rows and events against
    the files."""
    signed, seen = _Rows(cursor, "verify_signed", 2), _Rows(cursor, "verify_seen", 1)
    files: list[
        tuple[int, dict[str, Any], str]
    ] = []  # (number, signed document, label) waiting for their rows
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
        if (yield from _file_problems(item, previous, label, directory, key, seen)):
            continue
        report.checkpoints_checked += 1
        previous = item
        files.append((number, {"body": item.body, "signature": item.signature}, label))
        report.checkpoint_number = number
        report.checkpoint_at = item.body.get("created_at")
        latest_at = datetime.fromisoformat(report.checkpoint_at) if report.checkpoint_at else latest_at
        if item.tree is not None:
            trees.append((label, *item.tree))
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
    if not report.checkpoints_checked:
        yield from _nothing_signed(report)
    signed_size = trees[-1][1] if trees else 0
    yield from _database_against_files(directory, latest_at, signed_size)


def _file_problems(
    item: Any, previous: Any, label: str, directory: Path, key: Ed25519PublicKey, seen: _Rows
) -> Generator[Problem, None, bool]:
    """One checkpoint file against its name, the trusted key and the file before it (numbers, link);
    returns whether to pass it over (not taken as signed, or a copy of the one before)."""
    number = item.number or 0
    named = re.search(r"checkpoint-(\d+)\.", item.source)
    if named and int(named.group(1)) != number:
        yield Problem(
            "checkpoint",
            None,
            GLOBAL_CHAIN,
            None,
            f"checkpoint file {item.source} holds checkpoint {number}: a file replaced by another one",
        )
        return True
    seen.add(number)
    if not item.signature_ok:
        yield Problem(
            "checkpoint",
            None,
            GLOBAL_CHAIN,
            None,
            f"{label}: the signature does not hold with the trusted key {signing.key_id(key)}",
        )
        return True
    if previous is None or not number:
        return False
    if number == previous.number and item.signature == previous.signature:
        return True  # the same checkpoint copied twice
    if number <= previous.number:
        yield Problem("checkpoint", None, GLOBAL_CHAIN, None, f"{label}: number {number} appears twice")
        return True
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
            "checkpoint", None, GLOBAL_CHAIN, None, f"{label} does not link to checkpoint {previous.number}"
        )
    return False


def _nothing_signed(report: Report) -> Iterator[Problem]:
    """A record with events and not one signed checkpoint proves nothing: said, whatever else holds
    (unless its first event is younger than the first checkpoint beat would have made)."""
    first = AuditEvent.objects.order_by("occurred_at").only("occurred_at").first()
    grace = timedelta(seconds=2 * settings.AUDIT_CHECKPOINT_EVERY_S + 60)
    if first is not None and timezone.now() - first.occurred_at > grace:
        yield Problem(
            "unsigned",
            None,
            GLOBAL_CHAIN,
            None,
            f"NOTHING IS SIGNED: the record holds {report.events} events since {first.occurred_at.isoformat()}, "
            "but no signed checkpoint: none of it is proven against the key (were the checkpoints deleted?)",
            expected="signed checkpoint files in the checkpoint folder",
        )


def _database_against_files(
    directory: Path, latest_at: datetime | None, signed_size: int
) -> Iterator[Problem]:
    """The checkpoint rows and events the files do not account for, and the seals after the latest
    checkpoint left unsigned too long (verify_seen, verify_signed: what the files held)."""
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
        for raw, seal_id, sealed_at, signed_seq, leaf in _stream(
            f"SELECT s.payload, s.id, s.occurred_at,"  # noqa: S608
            " (SELECT max(v.seq) FROM verify_signed v WHERE v.chain = s.payload->>'chain'),"
            " (SELECT l.leaf_index FROM audit_pendingseal l WHERE l.chain = s.payload->>'chain')"
            f" FROM {_SEALS} AND NOT EXISTS (SELECT 1 FROM {_PURGES} p WHERE p.chain = s.payload->>'chain')",
            [GLOBAL_CHAIN],
        ):
            payload = _json(raw)
            if leaf is not None and leaf < signed_size:
                continue  # its leaf is in a signed tree head
            seal = _Seal(payload.get("seq", 0), payload.get("hash", ""), seal_id, sealed_at)
            yield from _unsigned(payload.get("chain", ""), seal, signed_seq or 0, latest_at)


def _file_rows(report: Report, files: list[tuple[int, dict[str, Any], str]]) -> Iterator[Problem]:
    """Checkpoint files against their rows, a batch at a time."""
    rows = {
        number: (pk, body, signature)
        for number, pk, body, signature in Checkpoint.objects.filter(
            number__in=[n for n, *_ in files]
        ).values_list("number", "pk", "body", "signature")
    }
    for number, document, label in files:
        row = rows.get(number)
        if row is None:
            yield Problem(
                "checkpoint", None, GLOBAL_CHAIN, None, f"{label}: its row is gone from the database"
            )
        elif not row_matches_file(row[1], row[2], document):
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
