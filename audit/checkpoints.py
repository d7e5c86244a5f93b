"""Signed checkpoints of the chain heads, stored in the database and written out of it as files."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import chain, signing
from .models import GLOBAL_CHAIN, AuditEvent, ChainHead, Checkpoint


def checkpoint_body(*, created_at: str, heads: dict[str, list[Any]]) -> dict[str, Any]:
    return {
        "format": "conductor-web/audit-checkpoint/1",
        "created_at": created_at,
        "key_id": signing.key_id(),
        "heads": heads,
    }


def checkpoint_create() -> Checkpoint:
    """Sign the heads of the global chain and of every run chain still open; write the file."""
    with transaction.atomic():
        # Lock the global head so that the checkpoint and its own audit event are in one order.
        global_head = chain._lock_head(GLOBAL_CHAIN)
        heads = {GLOBAL_CHAIN: [global_head.seq, global_head.hash]}
        for head in ChainHead.objects.filter(sealed=False).exclude(chain=GLOBAL_CHAIN).filter(seq__gt=0):
            heads[head.chain] = [head.seq, head.hash]
        now = timezone.now()
        body = checkpoint_body(created_at=now.isoformat(), heads=heads)
        message = chain.canonical(body)
        signature = signing.sign(message)
        file_name = f"checkpoint-{now:%Y%m%dT%H%M%S%f}Z.json"
        checkpoint = Checkpoint.objects.create(
            created_at=now, body=body, signature=signature, key_id=body["key_id"], file_name=file_name
        )
        document = {
            "body": body,
            "signature": signature,
            "public_key": signing.public_pem(),
            "id": checkpoint.pk,
        }
        directory = settings.AUDIT_CHECKPOINT_DIR
        directory.mkdir(parents=True, exist_ok=True)
        # Written before commit: a file for a rolled-back checkpoint is harmless (it names no event
        # that does not exist), while a committed checkpoint without its file would be worse.
        (directory / file_name).write_text(json.dumps(document, indent=2, sort_keys=True))
        chain.append(
            chain=GLOBAL_CHAIN,
            actor_type="service",
            actor_id="",
            actor_name="checkpoint",
            action="audit.checkpoint",
            object_type="checkpoint",
            object_id=str(checkpoint.pk),
            task_id=None,
            correlation_id=None,
            payload={"heads": len(heads), "global_seq": global_head.seq, "file": file_name},
        )
    return checkpoint


def checkpoint_latest() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-id").first()


def checkpoint_problems(checkpoint: Checkpoint) -> list[str]:
    """Why a checkpoint does not hold: a bad signature, or a head the events no longer match."""
    problems = []
    if checkpoint.key_id != signing.key_id():
        problems.append(
            f"checkpoint {checkpoint.pk} was signed with key {checkpoint.key_id}, not the current key"
        )
    if not signing.verify(chain.canonical(checkpoint.body), checkpoint.signature):
        problems.append(f"checkpoint {checkpoint.pk}: the signature does not match its content")
    purged = set(chain_purges())
    for chain_name, (seq, head_hash) in checkpoint.body["heads"].items():
        if chain_name in purged:
            continue
        if seq == 0 and head_hash == chain.GENESIS:
            continue  # the chain had no events yet when signed (a new installation's global chain)
        event = AuditEvent.objects.filter(chain=chain_name, seq=seq).only("id", "hash").first()
        if event is None:
            problems.append(f"checkpoint {checkpoint.pk}: event {seq} of chain {chain_name} is missing")
        elif event.hash != head_hash:
            problems.append(
                f"checkpoint {checkpoint.pk}: event #{event.pk} ({chain_name} seq {seq}) differs from the signed head"
            )
    return problems


def chain_purges() -> dict[str, Any]:
    from .models import ChainPurge

    return {p.chain: p for p in ChainPurge.objects.all()}
