"""The audit log's Merkle tree in the database: LogNode rows (audit.merkle's complete nodes), written
by the sealer only, under the global chain head's lock (so one tree, never forked), read by proofs.

A leaf is a run's seal (proof.seal_leaf of its pending row); its index is the pending row's
leaf_index. The tree's size is the number of leaves. Roots, audit paths and consistency proofs are
built from O(log n) rows in one query each.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from . import merkle
from .models import LogNode, PendingSeal
from .proof import seal_leaf


class LogError(RuntimeError):
    """The tree's stored nodes cannot answer: a node is gone."""


def leaf_of(row: PendingSeal, *, seq: int | None = None, hash_: str | None = None) -> bytes:
    """The leaf that records a pending seal's run chain (ending at `seq`, `hash_` instead of the row's
    own, for the leaf of the chain as it ends now)."""
    return seal_leaf(
        chain=row.chain,
        seq=row.seq if seq is None else seq,
        hash_=row.hash if hash_ is None else hash_,
        object_type=row.object_type,
        object_id=row.object_id,
        task_id=row.task_id,
    )


_SIZE = "SELECT coalesce(max(index) + 1, 0) FROM audit_lognode WHERE level = 0"

_NODES = (
    "SELECT n.level, n.index, n.hash FROM audit_lognode n "
    "JOIN unnest(%(levels)s::smallint[], %(indexes)s::bigint[]) AS w(level, index) "
    "ON n.level = w.level AND n.index = w.index"
)


def size() -> int:
    """How many leaves the tree holds."""
    with connection.cursor() as cursor:
        cursor.execute(_SIZE)
        return int(cursor.fetchone()[0])


def nodes(wanted: set[merkle.Node]) -> dict[merkle.Node, bytes]:
    """The stored hashes of these nodes; LogError naming one that is gone."""
    if not wanted:
        return {}
    ordered = sorted(wanted)
    with connection.cursor() as cursor:
        cursor.execute(_NODES, {"levels": [lv for lv, _ in ordered], "indexes": [i for _, i in ordered]})
        found = {(level, index): bytes(hash_) for level, index, hash_ in cursor.fetchall()}
    missing = [node for node in ordered if node not in found]
    if missing:
        level, index = missing[0]
        raise LogError(f"the log's node {index} at level {level} is gone ({len(missing)} node(s) missing)")
    return found


def root(tree_size: int) -> bytes:
    return merkle.root(tree_size, nodes)


def inclusion(index: int, tree_size: int) -> list[bytes]:
    """The audit path of leaf `index` in the tree of `tree_size` leaves (RFC 9162 PATH)."""
    return merkle.hashes(merkle.ranges_inclusion(index, tree_size), nodes)


def consistency(first: int, second: int) -> list[bytes]:
    """The proof that the tree of `second` leaves extends the one of `first` (RFC 9162 PROOF)."""
    return merkle.hashes(merkle.ranges_consistency(first, second), nodes)


@dataclass(frozen=True)
class Grown:
    """Leaves appended to the tree: the nodes to write, and the tree they make."""

    first: int  # the first new leaf's index
    size: int  # the tree's size after
    root: bytes
    nodes: list[tuple[merkle.Node, bytes]]


def grow(leaves: list[bytes]) -> Grown:
    """The nodes that appending these leaves (their data) completes, on the tree as stored. The caller
    holds the global chain's head lock (the sealer), so no other sealer grows the tree meanwhile, and
    writes `nodes` in its transaction."""
    first = size()
    frontier = nodes(set(merkle.frontier_nodes(first)))
    made: list[tuple[merkle.Node, bytes]] = []
    for offset, leaf in enumerate(leaves):
        made += merkle.completed(first + offset, merkle.leaf_hash(leaf), frontier)
    end = first + len(leaves)
    # The frontier now holds the complete nodes of the grown tree's right edge: its root's parts.
    tree_root = merkle.root(end, lambda need: {node: frontier[node] for node in need})
    return Grown(first=first, size=end, root=tree_root, nodes=made)


def node_rows(grown: Grown) -> dict[str, list[int] | list[bytes]]:
    """The grown nodes as the arrays of an unnest insert."""
    return {
        "node_levels": [level for (level, _), _ in grown.nodes],
        "node_indexes": [index for (_, index), _ in grown.nodes],
        "node_hashes": [hash_ for _, hash_ in grown.nodes],
    }


NODES_TABLE = LogNode._meta.db_table
