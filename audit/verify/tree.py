"""The log's Merkle tree, whole: each leaf against the seal it records, each stored node against its
two children (compared by PostgreSQL, which hashes as RFC 9162 does), and each signed tree head's and
each audit.log_grown event's root against the root the stored tree gives at that size.

A leaf removed (a gap in the indexes), reordered or altered (not the leaf of the seal whose index it
holds), duplicated or inserted (a leaf no seal claims), a node rewritten: each is named. A tree
rewritten whole, every node recomputed, is caught by the roots the checkpoints signed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.db import connection

from .. import log, merkle
from ..actions import Action
from ..models import GLOBAL_CHAIN, PendingSeal
from .report import Problem, hash_short

BATCH = 2000

# Stored nodes above the leaves that are not the hash of their two children (or lack one).
_BAD_NODES = """
    SELECT p.level, p.index FROM audit_lognode p
    LEFT JOIN audit_lognode l ON l.level = p.level - 1 AND l.index = 2 * p.index
    LEFT JOIN audit_lognode r ON r.level = p.level - 1 AND r.index = 2 * p.index + 1
    WHERE p.level > 0 AND (l.hash IS NULL OR r.hash IS NULL OR p.hash <> sha256('\\x01'::bytea || l.hash || r.hash))
    ORDER BY p.level, p.index LIMIT 100
"""

# Two complete siblings with no parent stored: a node deleted.
_ORPHANS = """
    SELECT l.level, l.index FROM audit_lognode l
    JOIN audit_lognode r ON r.level = l.level AND r.index = l.index + 1
    WHERE l.index % 2 = 0 AND NOT EXISTS (
        SELECT 1 FROM audit_lognode p WHERE p.level = l.level + 1 AND p.index = l.index / 2)
    ORDER BY l.level, l.index LIMIT 100
"""

# Every leaf with the seal that claims its index, in index order (either side may be missing).
_LEAVES = """
    SELECT coalesce(n.index, p.leaf_index), n.hash, p.id
    FROM (SELECT index, hash FROM audit_lognode WHERE level = 0) n
    FULL JOIN audit_pendingseal p ON p.leaf_index = n.index
    WHERE n.index IS NOT NULL OR p.leaf_index IS NOT NULL
    ORDER BY 1
"""


def tree_problems(signed: list[tuple[str, int, bytes]]) -> Iterator[Problem]:
    """The whole tree, and the roots `signed` (label, size, root) says it had."""
    yield from _leaf_problems()
    with connection.cursor() as cursor:
        cursor.execute(_BAD_NODES)
        for level, index in cursor.fetchall():
            yield _problem(
                f"the log's node {index} at level {level} is not the hash of its two children: "
                "the tree was changed after it was written"
            )
        cursor.execute(_ORPHANS)
        for level, index in cursor.fetchall():
            yield _problem(
                f"the log's node {index // 2} at level {level + 1} is gone (its children are there)"
            )
    yield from _root_problems([*signed, *_grown_roots()])


def _problem(detail: str, expected: str = "") -> Problem:
    return Problem("log", None, GLOBAL_CHAIN, None, detail, expected=expected)


def _leaf_problems() -> Iterator[Problem]:
    expected = 0
    with connection.chunked_cursor() as cursor:
        cursor.execute(_LEAVES)
        while batch := cursor.fetchmany(BATCH):
            seals = PendingSeal.objects.in_bulk([row_id for *_, row_id in batch if row_id is not None])
            for index, stored, row_id in batch:
                if index > expected:
                    gone = (
                        f"leaf {expected} is"
                        if index == expected + 1
                        else f"leaves {expected}..{index - 1} are"
                    )
                    yield _problem(
                        f"{gone} gone from the log: its indexes jump from {expected - 1} to {index}"
                    )
                expected = index + 1
                if stored is None:
                    row = seals[row_id]
                    yield _problem(
                        f"leaf {index}, the leaf of {row.chain} (pending seal row {row_id}), is gone from the log"
                    )
                    continue
                if row_id is None:
                    yield _problem(
                        f"leaf {index} records no seal (no pending seal holds its index): a leaf inserted or duplicated"
                    )
                    continue
                row = seals[row_id]
                if bytes(stored) != merkle.leaf_hash(log.leaf_of(row)):
                    yield _problem(
                        f"leaf {index} is not the leaf of {row.chain} (pending seal row {row_id}), whose index it "
                        "holds: a leaf altered or reordered, or its seal rewritten",
                        expected=f"leaf hash {hash_short(merkle.leaf_hash(log.leaf_of(row)).hex())}, "
                        f"found {hash_short(bytes(stored).hex())}",
                    )


def _grown_roots() -> list[tuple[str, int, bytes]]:
    """The (size, root) each audit.log_grown event of the global chain committed to."""
    roots = []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, payload FROM audit_auditevent WHERE chain = %(chain)s AND action = %(action)s ORDER BY id",
            {"chain": GLOBAL_CHAIN, "action": str(Action.AUDIT_LOG_GROWN)},
        )
        for event_id, raw in cursor.fetchall():
            label, payload = f"event #{event_id} ({Action.AUDIT_LOG_GROWN})", _payload(raw)
            try:
                roots.append((label, int(payload["size"]), bytes.fromhex(payload["root"])))
            except (KeyError, TypeError, ValueError):
                roots.append((label, -1, b""))  # named by _root_problems
    return roots


def _payload(raw: Any) -> dict[str, Any]:
    value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return value if isinstance(value, dict) else {}


def _root_problems(roots: list[tuple[str, int, bytes]]) -> Iterator[Problem]:
    size = log.size()
    for label, tree_size, signed_root in roots:
        if tree_size < 0:
            yield _problem(f"{label} does not say the size and root of the tree it grew")
            continue
        if tree_size > size:
            yield _problem(
                f"{label} says the log held {tree_size} leaves; it holds {size}: leaves were removed",
                expected=f"at least {tree_size} leaves",
            )
            continue
        try:
            found = log.root(tree_size)
        except log.LogError as exc:
            yield _problem(f"{label}: the root of its {tree_size} leaves cannot be recomputed: {exc}")
            continue
        if found != signed_root:
            yield _problem(
                f"{label} says the root of the first {tree_size} leaves is {hash_short(signed_root.hex())}; "
                f"the log's stored tree gives {hash_short(found.hex())}: the tree was rewritten",
                expected=f"root {hash_short(signed_root.hex())}",
            )
