"""Signed checkpoints: the trust anchor of the record, kept out of the database.

Each checkpoint signs (Ed25519, a key the database does not hold) the heads of the global chain and
of every chain that moved since the previous checkpoint, sealed ones included, and links to the
previous checkpoint by number and hash. It is written as a file under AUDIT_CHECKPOINT_DIR (one folder
per day) and as rows (Checkpoint, CheckpointHead) that serve as an index. Verification trusts the
files and a public key given to it; the rows only help find the checkpoint that covers one run.

Beat makes one every AUDIT_CHECKPOINT_EVERY_S seconds when anything moved, so the record that no
signature covers yet is a few seconds long.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from . import chain, signing
from .actions import Action
from .models import GLOBAL_CHAIN, ChainHead, Checkpoint, CheckpointHead
from .proof import body_digest

FORMAT = "conductor-web/audit-checkpoint/2"
# A head appended this long before the previous checkpoint may have committed after it: looked at again.
COMMIT_MARGIN = timedelta(seconds=60)


def _moved_heads(since: Any) -> list[tuple[str, int, str]]:
    """Run chains whose head no checkpoint has signed yet (sealed ones included). With `since` (the
    previous checkpoint's time), only chains with an event appended since (less the commit margin):
    a head moves only by an append, and the events' time is indexed (the heads' is not: see
    ChainHead.updated_at)."""
    query = (
        "SELECT h.chain, h.seq, h.hash FROM audit_chainhead h WHERE h.chain <> %s AND h.seq > 0 "
        "AND NOT EXISTS (SELECT 1 FROM audit_checkpointhead c WHERE c.chain = h.chain AND c.seq = h.seq)"
    )
    params: list[Any] = [GLOBAL_CHAIN]
    if since is not None:
        query += " AND h.chain IN (SELECT e.chain FROM audit_auditevent e WHERE e.occurred_at >= %s)"
        params.append(since - COMMIT_MARGIN)
    with connection.cursor() as cursor:
        cursor.execute(query + " ORDER BY h.chain", params)
        return [(name, seq, head_hash) for name, seq, head_hash in cursor.fetchall()]


def checkpoint_create(*, only_if_moved: bool = False) -> Checkpoint | None:
    """Sign the heads that moved since the last checkpoint and write the file.

    only_if_moved: make none when nothing but the last checkpoint's own event was added (beat's way).
    """
    with transaction.atomic():
        # Lock the global head: checkpoints are numbered in one order, with their own audit events.
        global_head = chain._lock_head(GLOBAL_CHAIN)
        last = Checkpoint.objects.order_by("-number", "-id").first()
        moved = _moved_heads(last.created_at if last else None)
        if only_if_moved and last is not None and not moved:
            signed_seq = last.body["heads"][GLOBAL_CHAIN][0]
            if global_head.seq <= signed_seq + 1:  # at most the last checkpoint's own event
                return None
        heads = {GLOBAL_CHAIN: [global_head.seq, global_head.hash]}
        heads.update({name: [seq, head_hash] for name, seq, head_hash in moved})
        now = timezone.now()
        number = (last.number or last.pk) + 1 if last else 1
        body = {
            "format": FORMAT,
            "number": number,
            "previous": body_digest(last.body) if last else chain.GENESIS,
            "created_at": now.isoformat(),
            "key_id": signing.key_id(),
            "heads": heads,
        }
        signature = signing.sign(chain.canonical(body))
        file_name = f"{now:%Y-%m-%d}/checkpoint-{number:010d}.json"
        checkpoint = Checkpoint.objects.create(
            number=number,
            created_at=now,
            body=body,
            signature=signature,
            key_id=body["key_id"],
            file_name=file_name,
        )
        CheckpointHead.objects.bulk_create(
            CheckpointHead(checkpoint=checkpoint, chain=name, seq=seq, hash=head_hash)
            for name, (seq, head_hash) in heads.items()
        )
        document = {
            "body": body,
            "signature": signature,
            "public_key": signing.public_pem(),
            "id": checkpoint.pk,
        }
        path = settings.AUDIT_CHECKPOINT_DIR / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written before commit: a file for a rolled-back checkpoint names no event that does not exist
        # (verification reports it as a checkpoint without its row), a committed one without file is worse.
        path.write_text(json.dumps(document, indent=1, sort_keys=True))
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
            payload={"number": number, "heads": len(heads), "global_seq": global_head.seq, "file": file_name},
        )
    return checkpoint


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

    @property
    def heads(self) -> dict[str, list[Any]]:
        return self.body.get("heads", {})


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


def checkpoint_files(directory: Path, *, key: Ed25519PublicKey) -> Iterator[SignedCheckpoint | str]:
    """Every checkpoint file under a folder, read one at a time in number order (the zero-padded file
    names sort so); a file that cannot be read yields a sentence saying why instead."""
    paths = (
        sorted(directory.rglob("checkpoint-*.json"), key=lambda p: (p.name, p)) if directory.is_dir() else []
    )
    for path in paths:
        source = str(path.relative_to(directory))
        try:
            document = json.loads(path.read_text())
            body, signature = document["body"], document["signature"]
            if not isinstance(body, dict) or not isinstance(signature, str):
                raise TypeError("body or signature of the wrong type")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            yield f"checkpoint file {source} cannot be read: {exc}"
            continue
        yield _signed(body, signature, key=key, source=source, row_id=document.get("id"))


def checkpoint_row(checkpoint: Checkpoint, *, key: Ed25519PublicKey) -> SignedCheckpoint:
    return _signed(
        checkpoint.body, checkpoint.signature, key=key, source=f"row {checkpoint.pk}", row_id=checkpoint.pk
    )


def row_matches_file(body: Any, signature: str, document: dict[str, Any]) -> bool:
    """A checkpoint row says what its signed file says: the same body and the same signature. The one
    comparison of the full verification and of a run's proof."""
    return document.get("body") == body and document.get("signature") == signature


def file_matches_row(checkpoint: Checkpoint) -> str | None:
    """Why a checkpoint row's file does not back it (missing, or a different body), or None."""
    path = settings.AUDIT_CHECKPOINT_DIR / checkpoint.file_name
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"checkpoint {checkpoint.number or checkpoint.pk}: its file {checkpoint.file_name} is missing or unreadable"
    if not row_matches_file(checkpoint.body, checkpoint.signature, document):
        return f"checkpoint {checkpoint.number or checkpoint.pk}: its row differs from its file {checkpoint.file_name}"
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
