"""Exports an auditor can hand on: CSV and JSON Lines of any filtered event set, streamed, each with
the signed checkpoint it verifies against; and a task's dossier as one self-contained HTML file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone

from utilities import csv_safe

from .actions import Action
from .checkpoints import checkpoint_latest
from .filters import AuditEventFilter
from .models import AuditEvent
from .services import Actor, event_record

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


# The export is written by PostgreSQL (COPY): the app only frames it, so an export runs at the database's pace, in bounded memory. The SQL says what the
# Python writers said: occurred_at exactly as the hash covers it (audit.chain.content_of: UTC,
# isoformat), and a text cell a spreadsheet would read as a formula quoted as utilities.csv_safe does.
_ISO = (
    "to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN "
    "mod(extract(microseconds FROM {c})::bigint, 1000000) = 0 THEN '' "
    "ELSE to_char({c} AT TIME ZONE 'UTC', '.US') END || '+00:00'"
)
_STARTS = ", ".join(f"chr({ord(c)})" for c in csv_safe.FORMULA_STARTS)
_QUOTE = f"chr({ord(csv_safe.QUOTE)})"


def _safe(column: str) -> str:
    """utilities.csv_safe.safe_cell in SQL, for a text column."""
    return (
        f"CASE WHEN left(ltrim({column}, {_QUOTE}), 1) IN ({_STARTS}) "
        f"THEN {_QUOTE} || {column} ELSE {column} END"
    )


def _selected(qs: QuerySet[AuditEvent]) -> tuple[str, tuple[Any, ...]]:
    """The filtered events as SQL over `t`, in id order."""
    sql, params = qs.order_by("id").values_list(*FIELDS).query.sql_with_params()
    return f"FROM ({sql}) t ORDER BY t.id", tuple(params)


def _csv_columns() -> str:
    columns = []
    for name in FIELDS:
        column = f"t.{name}"
        if name in ("id", "seq"):
            columns.append(column)
        elif name == "occurred_at":
            columns.append(_ISO.format(c=column))
        elif name in ("task_id", "correlation_id"):
            columns.append(f"{column}::text")
        else:
            columns.append(_safe(f"{column}::text"))
    return ", ".join(columns)


def _json_columns() -> str:
    pairs = ["'type', 'event'"]
    for name in FIELDS:
        pairs.append(f"'{name}', " + (_ISO.format(c=f"t.{name}") if name == "occurred_at" else f"t.{name}"))
    return f"json_build_object({', '.join(pairs)})::text"


CHUNK = 256 * 1024  # bytes per piece of the response


def _chunks(blocks: Iterable[Any]) -> Iterator[bytes]:
    """COPY's rows, handed on in pieces of about CHUNK bytes."""
    buffer = bytearray()
    for block in blocks:
        buffer += block
        if len(buffer) >= CHUNK:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)


class _Line:
    """A file-like object whose write returns the line, for a csv writer inside a generator."""

    def write(self, value: str) -> str:
        return value


def stream_csv(qs: QuerySet[AuditEvent], *, filters: dict[str, str]) -> Iterator[str | bytes]:
    writer = csv_safe.writer(_Line(), lineterminator="\n")
    yield writer.writerow(FIELDS)
    where, params = _selected(qs)
    with connection.cursor() as cursor:
        statement = f"COPY (SELECT {_csv_columns()} {where}) TO STDOUT WITH (FORMAT csv)"
        with cursor.copy(statement, params) as copy:
            yield from _chunks(copy)
        count = cursor.rowcount
    # The last row names the checkpoint: a reader can verify the hashes above against it.
    yield writer.writerow(
        [
            "#checkpoint",
            json.dumps(checkpoint_reference(), sort_keys=True),
            f"rows={count}",
            json.dumps(filters, sort_keys=True),
        ]
    )


def stream_jsonl(qs: QuerySet[AuditEvent], *, filters: dict[str, str]) -> Iterator[str | bytes]:
    yield (
        json.dumps(
            {"type": "export", "filters": filters, "checkpoint": checkpoint_reference(), "fields": FIELDS}
        )
        + "\n"
    )
    where, params = _selected(qs)
    with connection.cursor() as cursor:
        # COPY's text format doubles each backslash, and escapes nothing else that JSON text can hold
        # (it has no raw control characters): undone row by row.
        statement = f"COPY (SELECT {_json_columns()} {where}) TO STDOUT"
        with cursor.copy(statement, params) as copy:
            yield from _chunks(bytes(block).replace(b"\\\\", b"\\") for block in copy)


EXPORT_FORMATS = ("csv", "jsonl")


def export_response(request: HttpRequest, fmt: str, *, via: str) -> StreamingHttpResponse:
    """The events that the event log's filters (the request's query) select, streamed as `fmt`, with
    the `audit.exported` event that records who took them, in which format, with which filters."""
    events = AuditEventFilter(request.GET)
    applied = events.applied()
    qs = events.qs
    with transaction.atomic():
        event_record(
            actor=Actor.for_user(request.user),
            action=Action.AUDIT_EXPORTED,
            obj=request.user,
            payload={"format": fmt, "filters": applied, "via": via},
        )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    if fmt == "csv":
        response = StreamingHttpResponse(
            stream_csv(qs, filters=applied), content_type="text/csv; charset=utf-8"
        )
    else:
        response = StreamingHttpResponse(
            stream_jsonl(qs, filters=applied), content_type="application/x-ndjson"
        )
    response["Content-Disposition"] = f'attachment; filename="audit-events-{stamp}.{fmt}"'
    reference = checkpoint_reference()
    if reference:
        response["X-Audit-Checkpoint"] = f"{reference['id']}; key={reference['key_id']}"
    return response
