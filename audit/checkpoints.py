"""Signed checkpoints: the trust anchor of the record, kept out of the database.

Each checkpoint is a signed tree head: the size and root of the log's Merkle tree (audit.log: one leaf
per sealed run chain) and the global chain's head, signed (Ed25519, a key the database does not hold)
as a C2SP checkpoint note (audit.note), numbered and linked to the previous one by digest. Its size is
the same whatever the number of runs. It is written as a file under AUDIT_CHECKPOINT_DIR (one folder
per day, `checkpoint-<number>.note`) and as a row that serves as an index. Verification trusts the
files and a public key given to it.

The sealer signs one after each batch it adds to the tree (within a sealing interval of a run's end);
beat makes one every AUDIT_CHECKPOINT_EVERY_S seconds when the global chain moved otherwise.
Checkpoints of before the log (FORMAT_HEADS: JSON, the heads of every chain that moved) still verify.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import chain, log, note, signing
from .actions import Action
from .models import GLOBAL_CHAIN, ChainHead, Checkpoint, CheckpointHead
from .proof import body_digest

FORMAT = "conductor-web/audit-checkpoint/3"
# Before the log: a JSON file signing the heads of every chain that moved. Still read and verified.
FORMAT_HEADS = "conductor-web/audit-checkpoint/2"


def tree_text(body: dict[str, Any]) -> str:
    """The checkpoint text a body of FORMAT signs: the C2SP tlog-checkpoint lines (origin, tree size,
    root) and this log's extension lines (the global chain's head, the number, the previous
    checkpoint's digest, the time). `body_of` reads it back: the one mapping, both ways."""
    global_seq, global_hash = body["heads"][GLOBAL_CHAIN]
    return note.TreeHead(
        origin=body["origin"],
        size=body["tree"]["size"],
        root=bytes.fromhex(body["tree"]["root"]),
        extensions=(
            f"{GLOBAL_CHAIN} {global_seq} {global_hash}",
            f"number {body['number']}",
            f"previous {body['previous']}",
            f"time {body['created_at']}",
        ),
    ).text()


def body_of(head: note.TreeHead, *, key_id: str) -> dict[str, Any]:
    """The body of a checkpoint note's text (NoteError if its extension lines are not this log's)."""
    fields: dict[str, list[str]] = {}
    for line in head.extensions:
        name, *values = line.split(" ")
        fields[name] = values
    try:
        (global_seq, global_hash), (number,), (previous,), (created_at,) = (
            fields[GLOBAL_CHAIN],
            fields["number"],
            fields["previous"],
            fields["time"],
        )
        body = {
            "format": FORMAT,
            "origin": head.origin,
            "number": int(number),
            "previous": previous,
            "created_at": created_at,
            "key_id": key_id,
            "heads": {GLOBAL_CHAIN: [int(global_seq), global_hash]},
            "tree": {"size": head.size, "root": head.root.hex()},
        }
    except (KeyError, ValueError) as exc:
        raise note.NoteError(f"its extension lines are not this log's ({exc})") from None
    if tree_text(body) != head.text():
        raise note.NoteError("its extension lines are not in this log's form")
    return body


def checkpoint_create(*, only_if_moved: bool = False) -> Checkpoint | None:
    """Sign the log's tree head and the global chain's head, and write the checkpoint file.

    only_if_moved: make none when the tree did not grow and nothing but the last checkpoint's own event
    was added to the global chain (beat's way).
    """
    with transaction.atomic():
        # Lock the global head: checkpoints are numbered in one order, with their own audit events, and
        # the tree grows only under this lock (audit.seals), so its size and root hold until the commit.
        global_head = chain._lock_head(GLOBAL_CHAIN)
        last = Checkpoint.objects.order_by("-number", "-id").first()
        tree_size = log.size()
        if only_if_moved and last is not None:
            signed_seq = last.body["heads"][GLOBAL_CHAIN][0]
            signed_size = (last.body.get("tree") or {}).get("size")
            if global_head.seq <= signed_seq + 1 and signed_size == tree_size:  # its own event at most
                return None
        now = timezone.now()
        number = (last.number or last.pk) + 1 if last else 1
        origin = settings.AUDIT_LOG_ORIGIN
        body = {
            "format": FORMAT,
            "origin": origin,
            "number": number,
            "previous": body_digest(last.body) if last else chain.GENESIS,
            "created_at": now.isoformat(),
            "key_id": signing.key_id(),
            "heads": {GLOBAL_CHAIN: [global_head.seq, global_head.hash]},
            "tree": {"size": tree_size, "root": log.root(tree_size).hex()},
        }
        signed = note.sign(tree_text(body), origin, signing.private_key())
        file_name = f"{now:%Y-%m-%d}/checkpoint-{number:010d}.note"
        checkpoint = Checkpoint.objects.create(
            number=number,
            created_at=now,
            body=body,
            signature=_own_signature(signed, origin),
            key_id=body["key_id"],
            file_name=file_name,
            note=signed,
        )
        CheckpointHead.objects.create(
            checkpoint=checkpoint, chain=GLOBAL_CHAIN, seq=global_head.seq, hash=global_head.hash
        )
        path = settings.AUDIT_CHECKPOINT_DIR / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written before commit: a file for a rolled-back checkpoint names no event that does not exist
        # (verification reports it as a checkpoint without its row), a committed one without file is worse.
        path.write_text(signed)
        chain.append(
            chain=GLOBAL_CHAIN,
            actor_type="service",
            actor_id="",
            actor_name="checkpoint",
            action=Action.AUDIT_CHECKPOINT,
            object_type="checkpoint",
            object_id=str(checkpoint.pk),
            task_id=None,
            correlation_id=None,
            payload={
                "number": number,
                "heads": 1,
                "global_seq": global_head.seq,
                "tree_size": tree_size,
                "file": file_name,
            },
        )
    return checkpoint


def _own_signature(signed: str, name: str) -> str:
    """The log key's signature in a note, in hex (as Checkpoint.signature keeps it)."""
    _, signatures = note.split(signed)
    return next(s.blob.hex() for s in signatures if s.name == name)


def checkpoint_latest() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-id").first()


@dataclass(frozen=True)
class SignedCheckpoint:
    """A checkpoint as read from its file (or row), with whether its signature holds."""

    number: int | None
    row_id: int | None
    body: dict[str, Any]
    signature: str
    source: str  # the file's path relative to the checkpoint folder, or "row N"
    signature_ok: bool
    note: str = ""  # the signed note (FORMAT); empty for a JSON checkpoint of FORMAT_HEADS

    @property
    def heads(self) -> dict[str, list[Any]]:
        return self.body.get("heads", {})

    @property
    def tree(self) -> tuple[int, bytes] | None:
        """The log's (size, root) it signs; None for a checkpoint of before the log."""
        tree = self.body.get("tree")
        return (tree["size"], bytes.fromhex(tree["root"])) if tree else None


def _signed(
    body: dict[str, Any], signature: str, *, key: Ed25519PublicKey, source: str, row_id: int | None
) -> SignedCheckpoint:
    return SignedCheckpoint(
        number=body.get("number"),
        row_id=row_id,
        body=body,
        signature=signature,
        source=source,
        signature_ok=signing.verify(chain.canonical(body), signature, key),
    )


def note_read(
    signed: str, *, key: Ed25519PublicKey, source: str, row_id: int | None = None
) -> SignedCheckpoint:
    """A checkpoint note (FORMAT) read and its log signature checked with the trusted key; NoteError if
    it is not a checkpoint of this log's form at all."""
    text, signatures = note.split(signed)
    head = note.tree_head(text)
    body = body_of(head, key_id=signing.key_id(key))
    own = next((s for s in signatures if s.name == head.origin), None)
    try:
        note.opened(signed, head.origin, key)
        holds = True
    except note.NoteError:
        holds = False
    return SignedCheckpoint(
        number=body["number"],
        row_id=row_id,
        body=body,
        signature=own.blob.hex() if own else "",
        source=source,
        signature_ok=holds,
        note=signed,
    )


def checkpoint_read(path: Path, *, key: Ed25519PublicKey, source: str) -> SignedCheckpoint | str:
    """One checkpoint file (a note, or a JSON checkpoint of before the log), or a sentence saying why
    it cannot be read."""
    try:
        if path.suffix == ".note":
            return note_read(path.read_text(encoding="utf-8"), key=key, source=source)
        document = json.loads(path.read_text())
        body, signature = document["body"], document["signature"]
        if not isinstance(body, dict) or not isinstance(signature, str):
            raise TypeError("body or signature of the wrong type")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"checkpoint file {source} cannot be read: {exc}"
    return _signed(body, signature, key=key, source=source, row_id=document.get("id"))


def checkpoint_files(directory: Path, *, key: Ed25519PublicKey) -> Iterator[SignedCheckpoint | str]:
    """Every checkpoint file under a folder, read one at a time in number order (the zero-padded file
    names sort so); a file that cannot be read yields a sentence saying why instead."""
    paths = (
        sorted(
            [*directory.rglob("checkpoint-*.json"), *directory.rglob("checkpoint-*.note")],
            key=lambda p: (p.stem, p),
        )
        if directory.is_dir()
        else []
    )
    for path in paths:
        yield checkpoint_read(path, key=key, source=str(path.relative_to(directory)))


def checkpoint_row(checkpoint: Checkpoint, *, key: Ed25519PublicKey) -> SignedCheckpoint:
    source = f"row {checkpoint.pk}"
    if checkpoint.note:
        try:
            read = note_read(checkpoint.note, key=key, source=source, row_id=checkpoint.pk)
        except note.NoteError:
            read = None
        if read is None or read.body != checkpoint.body or read.signature != checkpoint.signature:
            return SignedCheckpoint(
                checkpoint.number, checkpoint.pk, checkpoint.body, checkpoint.signature, source, False
            )
        return read
    return _signed(checkpoint.body, checkpoint.signature, key=key, source=source, row_id=checkpoint.pk)


def row_matches_file(body: Any, signature: str, document: dict[str, Any]) -> bool:
    """A checkpoint row says what its signed file says: the same body and the same signature. The one
    comparison of the full verification and of a run's proof."""
    return document.get("body") == body and document.get("signature") == signature


def file_matches_row(checkpoint: Checkpoint, *, key: Ed25519PublicKey) -> str | None:
    """Why a checkpoint row's file does not back it (missing, or a different body), or None."""
    label = f"checkpoint {checkpoint.number or checkpoint.pk}"
    read = checkpoint_read(
        settings.AUDIT_CHECKPOINT_DIR / checkpoint.file_name, key=key, source=checkpoint.file_name
    )
    if isinstance(read, str):
        return f"{label}: its file {checkpoint.file_name} is missing or unreadable"
    if not row_matches_file(
        checkpoint.body, checkpoint.signature, {"body": read.body, "signature": read.signature}
    ):
        return f"{label}: its row differs from its file {checkpoint.file_name}"
    return None


def covering(chain_name: str) -> Checkpoint | None:
    """The latest checkpoint that signed a head of this chain (from the index rows)."""
    row = (
        CheckpointHead.objects.filter(chain=chain_name).select_related("checkpoint").order_by("-seq").first()
    )
    return row.checkpoint if row else None


def chain_heads_moved_since_checkpoint() -> int:
    """Events of the global chain that no checkpoint covers yet (the window), for reports."""
    last = checkpoint_latest()
    head = ChainHead.objects.filter(chain=GLOBAL_CHAIN).first()
    if head is None:
        return 0
    signed = last.body["heads"][GLOBAL_CHAIN][0] if last else 0
    return max(0, head.seq - signed - (1 if last else 0))


PURGE_FORMAT = "conductor-web/audit-purge/1"


def purge_body(
    *, chain_name: str, last_seq: int, last_hash: str, purged_at: Any, reason: str
) -> dict[str, Any]:
    """What a retention purge signs: the chain it empties and the head it had (its seal's)."""
    return {
        "format": PURGE_FORMAT,
        "chain": chain_name,
        "last_seq": last_seq,
        "last_hash": last_hash,
        "purged_at": purged_at.isoformat(),
        "reason": reason,
    }


def purge_problem(purge: Any, *, key: Ed25519PublicKey) -> str | None:
    """Why a ChainPurge row does not prove its deletion (no or a bad signature), or None."""
    body = purge_body(
        chain_name=purge.chain,
        last_seq=purge.last_seq,
        last_hash=purge.last_hash,
        purged_at=purge.purged_at,
        reason=purge.reason,
    )
    if not purge.signature:
        return "its events were deleted under a purge that carries no signature"
    if not signing.verify(chain.canonical(body), purge.signature, key):
        return "its events were deleted under a purge whose signature does not hold (not made by the checkpoint key)"
    return None
