"""A witness's check: does the log's current signed tree head extend the one the witness kept? No
Django, no database: given the two notes, the log's public key and the consistency proof (from
`manage.py audit_witness` or `GET /api/audit/log/consistency/`), anyone can run it. A witness that
keeps the last checkpoint it checked and checks each new one this way can cosign it (C2SP
tlog-cosignature): a log that showed two auditors two histories, or was restored from an old backup
and grew again, cannot get both cosigned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from . import merkle, note


@dataclass(frozen=True)
class Witnessed:
    consistent: bool
    sentence: str
    current: note.TreeHead | None = None
    kept: note.TreeHead | None = None


def check(*, kept: str | None, current: str, proof: Sequence[bytes], log_key: Ed25519PublicKey) -> Witnessed:
    """Check the current checkpoint note against the kept one (None: the first this witness sees,
    trusted as it is once its signature holds)."""
    try:
        head = note.opened(current, note.tree_head(note.split(current)[0]).origin, log_key)
    except note.NoteError as exc:
        return Witnessed(False, f"the current checkpoint does not verify: {exc}")
    if kept is None:
        return Witnessed(True, f"first checkpoint seen: {head.size} leaves, signature holds", head)
    try:
        old = note.opened(kept, note.tree_head(note.split(kept)[0]).origin, log_key)
    except note.NoteError as exc:
        return Witnessed(False, f"the kept checkpoint does not verify with the log's key: {exc}", head)
    if old.origin != head.origin:
        return Witnessed(
            False, f"the kept checkpoint is of log {old.origin!r}, not {head.origin!r}", head, old
        )
    if head.size < old.size:
        return Witnessed(
            False,
            f"INCONSISTENT: the log shrank from {old.size} leaves (kept) to {head.size}: leaves were removed, "
            "or the database was restored from an older backup",
            head,
            old,
        )
    if not merkle.consistency_verify(old.size, head.size, old.root, head.root, proof):
        return Witnessed(
            False,
            f"INCONSISTENT: the tree of {head.size} leaves does not extend the kept tree of {old.size} leaves "
            "(the consistency proof fails): the log's history was rewritten, or the database was restored from "
            "an older backup and grew again",
            head,
            old,
        )
    return Witnessed(True, f"consistent: {head.size} leaves extend the kept {old.size}", head, old)


def cosign(current: str, *, name: str, key: Ed25519PrivateKey, timestamp: int) -> str:
    """The checkpoint note with this witness's cosignature line added (only after `check` held)."""
    text, _ = note.split(current)
    return current + note.cosignature(text, name, key, timestamp)
