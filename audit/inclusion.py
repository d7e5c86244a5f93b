"""A run's place in the log: its leaf, the audit path to the root of the latest signed tree head, and
that tree head's note. What a run's proof, its dossier, its bundle and the audit API carry; checked
offline with the public key alone (audit.bundle, or any RFC 9162 verifier).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from . import log, merkle
from .models import Checkpoint, PendingSeal


@dataclass(frozen=True)
class Inclusion:
    chain: str
    leaf_index: int
    tree_size: int
    leaf: bytes  # the leaf's data (proof.seal_leaf)
    path: list[bytes]  # RFC 9162 audit path, the leaf's sibling first
    checkpoint: Checkpoint  # the signed tree head it leads to

    @property
    def root(self) -> bytes:
        return bytes.fromhex(self.checkpoint.body["tree"]["root"])

    @property
    def holds(self) -> bool:
        """The path leads from the leaf to the signed root (what an offline verifier checks)."""
        return merkle.inclusion_verify(
            self.leaf_index, self.tree_size, merkle.leaf_hash(self.leaf), self.path, self.root
        )

    def document(self) -> dict[str, Any]:
        """As a bundle and the API carry it (hex hashes, the note as its file holds it)."""
        return {
            "leaf_index": self.leaf_index,
            "tree_size": self.tree_size,
            "leaf": self.leaf.decode(),
            "leaf_hash": merkle.leaf_hash(self.leaf).hex(),
            "audit_path": [h.hex() for h in self.path],
            "root": self.root.hex(),
            "root_base64": base64.b64encode(self.root).decode(),
            "checkpoint_number": self.checkpoint.number,
            "checkpoint": self.checkpoint.note,
        }


def latest_tree_head() -> Checkpoint | None:
    """The latest checkpoint that signs a tree head (a note)."""
    return Checkpoint.objects.exclude(note="").order_by("-number", "-id").first()


def of_row(row: PendingSeal, *, head: Checkpoint | None = None) -> Inclusion | None:
    """The inclusion proof of a pending seal's leaf in the latest signed tree head (`head` if given);
    None while the row has no leaf or no signed tree covers it yet. LogError if a node is gone."""
    head = head or latest_tree_head()
    if row.leaf_index is None or head is None or head.body["tree"]["size"] <= row.leaf_index:
        return None
    size = head.body["tree"]["size"]
    return Inclusion(
        chain=row.chain,
        leaf_index=row.leaf_index,
        tree_size=size,
        leaf=log.leaf_of(row),
        path=log.inclusion(row.leaf_index, size),
        checkpoint=head,
    )


def of_chain(name: str, *, head: Checkpoint | None = None) -> Inclusion | None:
    """A run chain's inclusion proof in `head` (default: the latest signed tree head); a caller proving
    several runs reads the head once, so that all its proofs lead to the same one."""
    row = PendingSeal.objects.filter(chain=name).first()
    return of_row(row, head=head) if row is not None else None
