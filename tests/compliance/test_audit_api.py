"""The auditors' API: an auditor's token gets the event log, its export, the policy report, vendor
exposure, verification and a task's dossier bundle, as the pages give them to a session; other
roles get 403; each act is recorded as the page records it."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.test import Client

from accounts.models import Role
from audit import signing
from audit.checkpoints import checkpoint_create
from audit.grants import token_create
from audit.models import AuditEvent, PolicyRule
from tests.audit.test_bundle import standalone, write

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def auditor(make_user) -> Client:
    user = make_user("aida", Role.AUDITOR)
    return Client(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.AUDITOR).key}")


@pytest.fixture
def operator(make_user) -> Client:
    user = make_user("olga", Role.OPERATOR)
    return Client(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.OPERATOR).key}")


ENDPOINTS = [
    "/api/audit/events/",
    "/api/audit/export.jsonl",
    "/api/audit/export.csv",
    "/api/audit/policies/",
    "/api/audit/verify/",
    "/api/audit/vendors/",
]


def test_only_auditors_tokens_open_the_audit_api(auditor, operator):
    for path in ENDPOINTS:
        assert auditor.get(path).status_code == 200, path
        assert operator.get(path).status_code == 403, path
        assert Client().get(path).status_code == 403, path
    # The pages stay sessions only: a token there is nobody, sent to the login page.
    assert auditor.get("/audit/export.jsonl").status_code == 302


def test_an_auditors_token_reads_the_events_and_exports_them_as_recorded(finished_run, auditor):
    listed = auditor.get("/api/audit/events/", {"action": "run.", "task": str(finished_run.task_id)}).json()
    actions = {e["action"] for e in listed["results"]}
    assert {"run.started", "run.succeeded"} <= actions and all(a.startswith("run.") for a in actions)
    event = listed["results"][0]
    assert set(event) >= {"chain", "seq", "prev_hash", "hash", "payload", "actor_name"}

    lines = b"".join(auditor.get("/api/audit/export.jsonl", {"task": str(finished_run.task_id)})).decode()
    rows = [json.loads(line) for line in lines.splitlines()]
    assert rows[0]["type"] == "export" and rows[0]["filters"] == {"task": str(finished_run.task_id)}
    exported = {r["id"] for r in rows[1:] if "id" in r}
    assert exported == set(
        AuditEvent.objects.filter(task_id=finished_run.task_id).values_list("id", flat=True)
    ) - {AuditEvent.objects.filter(action="audit.exported").latest("id").pk}
    recorded = AuditEvent.objects.filter(action="audit.exported").latest("id")
    assert recorded.actor_name == "aida" and recorded.payload["format"] == "jsonl"
    assert recorded.payload["via"] == "api"

    response = auditor.get("/api/audit/export.csv", {"action": "task."})
    assert response["Content-Type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert table[0][0] == "id" and any(
        row[table[0].index("action")] == "task.submitted" for row in table[1:-1]
    )


def test_an_auditors_token_reads_the_policy_report_and_vendor_exposure(finished_run, auditor):
    PolicyRule.objects.create(name="no-globex", kind=PolicyRule.Kind.VENDOR_BLOCKED, vendors=["globex"])

    policies = auditor.get("/api/audit/policies/").json()
    vendors = auditor.get("/api/audit/vendors/").json()

    assert [r["name"] for r in policies["rules"]] == ["no-globex"]
    assert policies["rules"][0]["vendors"] == ["globex"]
    reached = {(r["vendor"], r["classification"]) for r in vendors["rows"]}
    step_vendors = set(finished_run.steps.values_list("vendor", flat=True))
    assert {(v, finished_run.task.classification) for v in step_vendors} <= reached
    one = next(iter(step_vendors))
    listed = auditor.get(
        "/api/audit/vendors/", {"vendor": one, "classification": finished_run.task.classification}
    ).json()
    assert str(finished_run.task_id) in listed["tasks"]
    refused = auditor.get("/api/audit/vendors/", {"since": "not a date"})
    assert refused.status_code == 400 and "since" in refused.json()["detail"]


def test_an_auditors_token_verifies_the_record_and_takes_a_dossier_that_verifies_alone(
    finished_run, audit_files, auditor, tmp_path
):
    checkpoint_create()

    verified = auditor.post("/api/audit/verify/")
    bundle = auditor.get(f"/api/audit/tasks/{finished_run.task_id}/dossier/").json()

    assert verified.status_code == 200 and verified.json()["intact"] is True, verified.json()
    assert AuditEvent.objects.filter(action="audit.verified", actor_name="aida").exists()
    key = tmp_path / "audit-public.pem"
    key.write_text(signing.public_pem())
    result = standalone("verify", write(bundle, tmp_path), "--public-key", str(key))
    assert result.returncode == 0, result.stdout + result.stderr
    viewed = AuditEvent.objects.filter(action="record.viewed", task_id=finished_run.task_id).latest("id")
    assert viewed.actor_name == "aida" and "api" in viewed.payload["view"]
    assert auditor.get("/api/audit/tasks/00000000-0000-0000-0000-000000000000/dossier/").status_code == 404
