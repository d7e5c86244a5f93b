"""Exports an auditor hands on: CSV and JSON Lines of a filtered event set, the dossier file, and the
streaming export's memory use on a large record."""

from __future__ import annotations

import csv
import io
import json
import re
import tracemalloc
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.test import Client

from audit.chain import content_of, digest
from audit.checkpoints import checkpoint_create
from audit.exports import FIELDS
from audit.models import AuditEvent
from audit.services import Actor, event_record, legal_hold_place
from routing.models import RunStatus, Task
from routing.services import TaskSubmission, task_submit
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json
from utilities.csv_safe import original_cell


@pytest.fixture
def auditor(make_user) -> Client:
    client = Client()
    client.force_login(make_user("ann", "auditor"))
    return client


def body_of(response) -> str:
    return b"".join(response.streaming_content).decode()


@pytest.fixture
def record(db, audit_files, make_user):
    """Two tasks with events in their run chains and in the global chain, and two checkpoints."""
    ops = make_user("olga", "operator")
    tasks = []
    for text in ("What is 6 * 7?", "What is 2 + 2?"):
        task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.WEB, user=ops)
        tasks.append(task)
    legal_hold_place(task=tasks[0], actor=Actor.for_user(ops), reason="inquiry 7")
    with transaction.atomic():
        event_record(
            actor=Actor.for_user(ops),
            action="record.viewed",
            obj=tasks[0],
            task_id=tasks[0].pk,
            payload={"text": 'quotes " and, commas\nand a newline'},
        )
    checkpoint_create()
    latest = checkpoint_create()
    return {"tasks": tasks, "checkpoint": latest}


@pytest.mark.django_db
def test_csv_export_holds_exactly_the_filtered_events_and_names_the_latest_checkpoint(record, auditor):
    task, checkpoint = record["tasks"][0], record["checkpoint"]
    expected = list(AuditEvent.objects.filter(task_id=task.pk).order_by("id"))
    assert {e.chain for e in expected} == {"global", f"run:{task.runs.get().correlation_id}"}

    response = auditor.get("/audit/export.csv", {"task": str(task.pk)})

    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response["X-Audit-Checkpoint"] == f"{checkpoint.pk}; key={checkpoint.key_id}"
    assert 'filename="audit-events-' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(body_of(response), newline="")))
    header, *events, last = rows
    assert header == FIELDS
    assert [int(r[0]) for r in events] == [e.pk for e in expected]
    for row, event in zip(events, expected, strict=True):
        values = dict(zip(FIELDS, row, strict=True))
        assert values["hash"] == event.hash and values["prev_hash"] == event.prev_hash
        assert (values["chain"], int(values["seq"])) == (event.chain, event.seq)
        assert json.loads(values["payload"]) == event.payload
    assert last[0] == "#checkpoint"
    reference = json.loads(last[1])
    assert reference["id"] == checkpoint.pk and reference["signature"] == checkpoint.signature
    assert reference["body"] == checkpoint.body and reference["file"] == checkpoint.file_name
    assert last[2] == f"rows={len(expected)}"
    assert json.loads(last[3]) == {"task": str(task.pk)}  # the query parameters that select them


@pytest.mark.django_db
def test_jsonl_export_holds_exactly_the_filtered_events_after_a_first_line_naming_the_checkpoint(
    record, auditor
):
    checkpoint = record["checkpoint"]
    expected = list(AuditEvent.objects.filter(action__startswith="legalhold.").order_by("id"))
    assert len(expected) == 1

    response = auditor.get("/audit/export.jsonl", {"action": "legalhold."})

    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    first, *lines = [json.loads(line) for line in body_of(response).splitlines()]
    assert first["type"] == "export" and first["fields"] == FIELDS
    assert first["checkpoint"]["id"] == checkpoint.pk and first["checkpoint"]["key_id"] == checkpoint.key_id
    assert first["filters"] == {"action": "legalhold."}
    assert [line["id"] for line in lines] == [e.pk for e in expected]
    for line, event in zip(lines, expected, strict=True):
        assert line["type"] == "event"
        assert (line["hash"], line["prev_hash"]) == (event.hash, event.prev_hash)
        assert line["payload"] == event.payload and line["task_id"] == str(event.task_id)


@pytest.mark.django_db
def test_each_exported_event_recomputes_to_its_hash_in_both_formats(record, auditor, make_user):
    """A reader re-derives every hash from the file alone: occurred_at to the microsecond as the hash
    covers it, the payload's values, and text cells un-quoted (utilities.csv_safe.original_cell), a name
    that a spreadsheet would read as a formula included."""
    hostile = make_user("@mallory", "operator")
    with transaction.atomic():
        event_record(
            actor=Actor.for_user(hostile),
            action="record.viewed",
            obj=record["tasks"][1],
            payload={"text": '=HYPERLINK("http://x")', "back\\slash": "a\\b\tc", "n": 1.5},
        )
    before = AuditEvent.objects.count()
    assert before > 10

    def recomputed(values: dict) -> str:
        content = content_of(
            chain=values["chain"],
            seq=int(values["seq"]),
            occurred_at=datetime.fromisoformat(values["occurred_at"]),
            actor_type=values["actor_type"],
            actor_id=values["actor_id"],
            actor_name=values["actor_name"],
            action=values["action"],
            object_type=values["object_type"],
            object_id=values["object_id"],
            task_id=values["task_id"] or None,
            correlation_id=values["correlation_id"] or None,
            payload=values["payload"],
        )
        return digest(values["prev_hash"], content)

    rows = list(csv.reader(io.StringIO(body_of(auditor.get("/audit/export.csv")), newline="")))
    from_csv = {}
    for row in rows[1:-1]:
        values = {name: original_cell(cell) for name, cell in zip(FIELDS, row, strict=True)}
        values["payload"] = json.loads(values["payload"])
        from_csv[int(values["id"])] = recomputed(values)
    assert "'@mallory" in {row[6] for row in rows[1:-1]}  # written quoted, read back as it was
    lines = [json.loads(line) for line in body_of(auditor.get("/audit/export.jsonl")).splitlines()[1:]]
    from_jsonl = {line["id"]: recomputed(line) for line in lines}
    stored = {e.pk: e.hash for e in AuditEvent.objects.all()}
    # Each export holds every event there was, and its own audit.exported event (recorded first).
    assert from_csv == {k: stored[k] for k in from_csv} and len(from_csv) == before + 1
    assert from_jsonl == {k: stored[k] for k in from_jsonl} and len(from_jsonl) == before + 2


@pytest.mark.django_db
def test_an_export_of_the_global_chain_is_itself_recorded_and_an_unknown_format_is_404(record, auditor):
    response = auditor.get("/audit/export.csv", {"chain": "global", "action": "note."})
    assert response.status_code == 200
    body_of(response)

    exported = AuditEvent.objects.get(action="audit.exported")
    assert exported.chain == "global" and exported.actor_name == "ann"
    assert exported.payload == {
        "format": "csv",
        "filters": {"action": "note.", "chain": "global"},
        "via": "page",
    }
    assert auditor.get("/audit/export.xml").status_code == 404
    assert AuditEvent.objects.filter(action="audit.exported").count() == 1


@pytest.mark.django_db
def test_an_export_without_any_checkpoint_says_so(db, auditor):
    response = auditor.get("/audit/export.jsonl")
    assert "X-Audit-Checkpoint" not in response
    assert json.loads(body_of(response).splitlines()[0])["checkpoint"] is None


# --- the dossier file ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_dossier_download_is_one_self_contained_file_with_the_events_and_escaped_output(
    live_pool, audit_files, auditor
):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
    server.program("alpha", [Reply("<script>alert(1)</script>")])
    run = run_now(submit("Say <b>hi</b>"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    checkpoint = checkpoint_create()

    response = auditor.get(f"/audit/tasks/{run.task_id}/", {"download": "1"})

    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="dossier-{run.task_id}.html"'
    html = response.content.decode()
    assert "<style>" in html and ".card" in html  # the stylesheet is inlined
    assert not re.search(r"<link\b", html, re.IGNORECASE)
    assert not re.search(r"<script\b[^>]*\bsrc\s*=", html, re.IGNORECASE)
    assert not re.search(r"""\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", html, re.IGNORECASE)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>hi</b>" not in html and "Say &lt;b&gt;hi&lt;/b&gt;" in html
    events = AuditEvent.objects.filter(task_id=run.task_id).exclude(action="record.viewed")
    assert events.count() == 7  # submitted, started, plan, step started + succeeded, run done, sealed
    for event in events:
        assert event.hash in html and event.action in html
    assert "intact up to event" in html
    # The checkpoint's time as the pages write times, not "2026-11-26T21:22:31.531407+00:00".
    at = checkpoint.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"Latest signed checkpoint: {checkpoint.number} at {at} · key" in html


# --- bounded memory -----------------------------------------------------------------------------

BULK_ROWS = 100_000
PEAK_BOUND = 40 * 1024 * 1024  # bytes of Python allocations while the whole export streams


@pytest.mark.django_db
def test_the_streaming_csv_export_runs_in_bounded_memory(auditor):
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO audit_auditevent (chain, seq, prev_hash, hash, occurred_at, actor_type, actor_id,
                actor_name, action, object_type, object_id, task_id, correlation_id, payload)
            SELECT 'bulk', i, md5((i - 1)::text) || md5((i - 1)::text), md5(i::text) || md5(i::text),
                now() - make_interval(secs => %s - i), 'service', '', 'bulk-loader', 'bulk.event', 'task',
                i::text, NULL, NULL,
                jsonb_build_object('i', i, 'note', repeat('lorem ipsum dolor sit amet ', 40))
            FROM generate_series(1, %s) AS i
            """,
            [BULK_ROWS, BULK_ROWS],
        )
        assert cursor.rowcount == BULK_ROWS

    tracemalloc.start()
    try:
        response = auditor.get("/audit/export.csv", {"chain": "bulk"})
        assert response.status_code == 200
        size = lines = 0
        for chunk in response.streaming_content:
            size += len(chunk)
            lines += chunk.count(b"\n")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    mib = 1024 * 1024
    print(
        f"\nstreaming CSV export of {BULK_ROWS:,} events: {size / mib:.1f} MiB streamed, "
        f"peak traced Python memory {peak / mib:.1f} MiB (bound {PEAK_BOUND / mib:.0f} MiB)"
    )
    assert lines == BULK_ROWS + 2  # header, the events, the checkpoint row
    assert size > 2.5 * PEAK_BOUND, "the export is too small to show anything about memory"
    assert peak < PEAK_BOUND
