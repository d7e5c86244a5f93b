"""Pending seals: a run's end seals its own chain and inserts a PendingSeal row; the sealer appends
their run.sealed events to the global chain in batches.

Why: appending the seal in the run end's own statement made every run end in the deployment wait in
turn for the one row of the global chain's head, from that statement to its commit. A pending row is a
plain insert that no other run end waits for; the sealer takes the head once a batch. The seals are the
same events as before (services.run_seal_fields), so every reader of run.sealed is unchanged; a run's
seal reaches the global chain within a sealing interval (AUDIT_SEAL_EVERY_S) instead of at its commit,
and verification holds a pending seal to AUDIT_SEAL_GRACE_S (audit.verify.pending).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import chain, log, rows
from .actions import Action
from .models import GLOBAL_CHAIN, AuditEvent, PendingSeal
from .services import ENGINE, run_seal_fields

logger = logging.getLogger(__name__)

# Pending seals per sealer transaction: one event of about 600 bytes each in one JSON parameter (under a
# megabyte), their rows locked until it commits. Beat's sealer empties a second's run ends in one batch
# up to about this many run ends a second.
SEAL_BATCH = 1000


def pending_seal(*, run: Any, task_id: uuid.UUID | None, last: AuditEvent) -> PendingSeal:
    """The pending seal (unsaved) of a run whose chain's last event, whose append sealed the chain, is
    `last`: the run's end inserts it in its own transaction."""
    return PendingSeal(
        chain=last.chain,
        object_type=run._meta.model_name,
        object_id=str(run.pk),
        task_id=task_id,
        seq=last.seq,
        hash=last.hash,
        created_at=timezone.now(),
    )


def seal_fields(row: PendingSeal) -> dict[str, Any]:
    """The fields of a pending row's run.sealed event, exactly those the run's end used to append."""
    return run_seal_fields(
        object_type=row.object_type,
        object_id=row.object_id,
        task_id=row.task_id,
        chain=row.chain,
        seq=row.seq,
        hash_=row.hash,
    )


def seal_pending(*, limit: int = SEAL_BATCH, sign: bool = True) -> int:
    """Append the oldest pending seals (at most `limit`) to the global chain and to the log's Merkle
    tree, in id order, and sign the grown tree head (`sign`); returns how many. One transaction: each
    row is marked with its run.sealed event and its leaf index, the tree's new nodes written, one
    audit.log_grown event commits to the new size and root, and the checkpoint signs it. Killed part
    way, nothing of the batch is sealed, and the next sealer takes the same rows.

    The rows are taken FOR UPDATE SKIP LOCKED, so two sealers at once never take the same row (the
    second takes the next ones, or none); the global chain's head is locked once for the batch, and the
    tree is grown under that lock, so neither the chain nor the tree ever forks. Rows are locked before
    the head by every sealer: no deadlock. A row sealed before the log existed (its run.sealed event
    there, no leaf) gets its leaf the same way, with no second seal.
    """
    from .checkpoints import checkpoint_create  # checkpoints reads the log this module grows

    with transaction.atomic(durable=True):
        pending = list(
            PendingSeal.objects.select_for_update(skip_locked=True)
            .filter(leaf_index__isnull=True)
            .order_by("id")[:limit]
        )
        if not pending:
            return 0
        unsealed = [row for row in pending if row.seal_event_id is None]
        # On the head read under its lock: once a batch, held until the commit.
        head = chain.lock_head(GLOBAL_CHAIN)
        grown = log.grow([log.leaf_of(row) for row in pending])
        grown_event = {
            "actor_type": ENGINE.type,
            "actor_id": ENGINE.id,
            "actor_name": ENGINE.name,
            "action": Action.AUDIT_LOG_GROWN,
            "object_type": "log",
            "object_id": str(grown.size),
            "task_id": None,
            "correlation_id": None,
            "payload": {"from": grown.first, "size": grown.size, "root": grown.root.hex()},
        }
        planned = chain.plan(GLOBAL_CHAIN, [*(seal_fields(row) for row in unsealed), grown_event], head=head)
        _append(planned, pending, unsealed, grown)
        if sign:
            checkpoint_create()
    logger.debug(
        "sealed %d run chains (pending rows %d..%d) as leaves %d..%d",
        len(pending),
        pending[0].pk,
        pending[-1].pk,
        grown.first,
        grown.size - 1,
    )
    return len(pending)


_EVENT_COLUMNS = ", ".join(
    rows.quoted(f.column) for f in AuditEvent._meta.concrete_fields if not f.primary_key
)

# The batch's events inserted from one JSON array (their hashes made by `chain.plan` on the head they
# expect), only if `head_moved` moved the global chain's head from that head to the last of them (see
# chain.append_text; it locks the head); the tree's new nodes inserted; each pending row marked with
# its leaf and the id of the event of its seq (a row sealed before the log keeps its seal). Its text
# is the same for every batch: prepared once per connection.
_APPEND_SEALS = (
    "WITH {head}, "
    "sealed AS (INSERT INTO audit_auditevent ({columns}) "
    "SELECT {columns} FROM jsonb_populate_recordset(NULL::audit_auditevent, %(seals)s::jsonb) "
    "WHERE EXISTS (SELECT 1 FROM {head_moved}) RETURNING id, seq), "
    "grown AS (INSERT INTO {nodes} (level, index, hash) "
    "SELECT * FROM unnest(%(node_levels)s::smallint[], %(node_indexes)s::bigint[], %(node_hashes)s::bytea[]) "
    "WHERE EXISTS (SELECT 1 FROM {head_moved})), "
    "marked AS (UPDATE audit_pendingseal p SET seal_event_id = coalesce(p.seal_event_id, sealed.id), "
    "leaf_index = w.leaf "
    "FROM unnest(%(pending_ids)s::bigint[], %(pending_seqs)s::bigint[], %(pending_leaves)s::bigint[]) "
    "AS w(id, seq, leaf) LEFT JOIN sealed ON sealed.seq = w.seq "
    "WHERE p.id = w.id AND p.leaf_index IS NULL AND EXISTS (SELECT 1 FROM {head_moved}) "
    "RETURNING p.id, p.seal_event_id) "
    "SELECT id, seal_event_id FROM marked"
)


def _append(
    planned: chain.Planned, pending: list[PendingSeal], unsealed: list[PendingSeal], grown: log.Grown
) -> None:
    """Write the planned events and the grown nodes, and mark the rows (the head they were built on is
    locked by this transaction: it cannot have moved)."""
    head, *_ = chain.append_text(1)  # the head's expression: its text is the same for any count
    statement = _APPEND_SEALS.format(
        head=head, columns=_EVENT_COLUMNS, head_moved=chain.HEAD_MOVED, nodes=log.NODES_TABLE
    )
    head_params = {k: v for k, v in chain.append_params(planned).items() if k.startswith("head_")}
    seqs = {row.pk: event.seq for row, event in zip(unsealed, planned.events, strict=False)}
    params = (
        head_params
        | log.node_rows(grown)
        | {
            "seals": f"[{','.join(planned.documents)}]",
            "pending_ids": [row.pk for row in pending],
            "pending_seqs": [seqs.get(row.pk) for row in pending],
            "pending_leaves": [grown.first + offset for offset in range(len(pending))],
        }
    )
    with rows.prepared_cursor() as cursor:
        cursor.execute(statement, params)
        marked = dict(cursor.fetchall())
    if len(marked) != len(pending):
        raise RuntimeError(f"{len(marked)} of {len(pending)} pending seals were appended and marked")
    for offset, row in enumerate(pending):
        row.seal_event_id = marked[row.pk]
        row.leaf_index = grown.first + offset
    chain.appended(planned, [*(marked[row.pk] for row in unsealed), _grown_id(planned)])


def _grown_id(planned: chain.Planned) -> int:
    """The id of the batch's audit.log_grown event (its last), looked up by its seq."""
    event = planned.events[-1]
    return AuditEvent.objects.filter(chain=GLOBAL_CHAIN, seq=event.seq).values_list("pk", flat=True).get()


def chains_awaiting_seal(chains: list[str]) -> set[str]:
    """Those of `chains` whose seal is pending (its row not yet sealed): ended, their seal on its way
    to the global chain (for a check of run rows that wants every ended run sealed)."""
    return set(
        PendingSeal.objects.filter(chain__in=chains, seal_event_id__isnull=True).values_list(
            "chain", flat=True
        )
    )
