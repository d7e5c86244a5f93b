"""Exports an auditor can hand on: CSV and JSON Lines of any filtered event set, streamed, each with
the signed checkpoint it verifies against; and a task's dossier as one self-contained HTML file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet

from . import csv_safe
from .checkpoints import checkpoint_latest
from .models import AuditEvent

FIELDS = [
    "id",
    "chain",
    "seq",
    "occurred_at",
    "actor_type",
    "actor_id",
    "actor_name",
    "action",
    "object_type",
    "object_id",
    "task_id",
    "correlation_id",
    "payload",
    "prev_hash",
    "hash",
]
BATCH = 2000  # rows per fetch from a server-side cursor: memory stays flat whatever the export's size


def checkpoint_reference() -> dict[str, Any] | None:
    checkpoint = checkpoint_latest()
    if checkpoint is None:
        return None
    return {
        "id": checkpoint.pk,
        "number": checkpoint.number,
        "created_at": checkpoint.created_at.isoformat(),
        "key_id": checkpoint.key_id,
        "signature": checkpoint.signature,
        "file": checkpoint.file_name,
        "body": checkpoint.body,
    }


def _rows(qs: QuerySet[AuditEvent]) -> Iterator[tuple]:
    return qs.order_by("id").values_list(*FIELDS).iterator(chunk_size=BATCH)


class _Line:
    """A file-like object whose write returns the line, for a csv writer inside a generator."""

    def write(self, value: str) -> str:
        return value


def stream_csv(qs: QuerySet[AuditEvent], *, filters: dict[str, str]) -> Iterable[str]:
    # Cells a spreadsheet would read as a formula get a leading quote (csv_safe.original_cell undoes it).
    writer = csv_safe.writer(_Line())
    yield writer.writerow(FIELDS)
    count = 0
    for row in _rows(qs):
        values = list(row)
        values[3] = values[3].isoformat()
        values[12] = json.dumps(values[12], sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
        count += 1
        yield writer.writerow(["" if v is None else v for v in values])
    reference = checkpoint_reference()
    # The last row names the checkpoint: a reader can verify the hashes above against it.
    yield writer.writerow(
        [
            "#checkpoint",
            json.dumps(reference, sort_keys=True),
            f"rows={count}",
            json.dumps(filters, sort_keys=True),
        ]
    )


def stream_jsonl(qs: QuerySet[AuditEvent], *, filters: dict[str, str]) -> Iterable[str]:
    yield (
        json.dumps(
            {"type": "export", "filters": filters, "checkpoint": checkpoint_reference(), "fields": FIELDS}
        )
        + "\n"
    )
    for row in _rows(qs):
        record = dict(zip(FIELDS, row, strict=True))
        yield json.dumps({"type": "event", **record}, cls=DjangoJSONEncoder, ensure_ascii=False) + "\n"
