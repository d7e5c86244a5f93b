"""CSV formula injection: no cell of a CSV the app writes (the auditor's event export, the analytics
charts' data) begins with a character a spreadsheet reads as a formula; numbers stay numbers."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from django.db import transaction
from django.test import Client

from accounts.models import Role
from audit.exports import FIELDS
from audit.models import AuditEvent
from audit.services import Actor, event_record
from routing.models import RunStatus, Step, Worker
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json
from utilities import csv_safe

HOSTILE = ['=HYPERLINK("http://x")', "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def body_of(response) -> str:
    return b"".join(response.streaming_content).decode()


def cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


@pytest.mark.parametrize(
    ("value", "written"),
    [
        *[(v, "'" + v) for v in HOSTILE],
        ("-0.5", "'-0.5"),  # text that looks like a number is still text
        ("'=x", "''=x"),  # a quote already there gets another, so the quoting can be undone
        ("'plain", "'plain"),
        ("plain = fine", "plain = fine"),
        ("", ""),
        (float("-inf"), "'-inf"),
        (Decimal("-Infinity"), "'-Infinity"),
    ],
)
def test_text_cells_are_neutralised_and_the_quote_can_be_undone(value, written):
    out = io.StringIO()
    csv_safe.writer(out).writerow([value])
    (row,) = cells(out.getvalue())
    assert row == [written]
    assert csv_safe.original_cell(row[0]) == str(value)


def test_numbers_none_and_bools_are_written_as_they_are():
    out = io.StringIO()
    w = csv_safe.DictWriter(out, fieldnames=["int", "float", "decimal", "none", "bool"])
    w.writeheader()
    w.writerows([{"int": -3, "float": -0.5, "decimal": Decimal("-0.000645"), "none": None, "bool": True}])
    assert cells(out.getvalue()) == [
        ["int", "float", "decimal", "none", "bool"],
        ["-3", "-0.5", "-0.000645", "", "True"],
    ]


@pytest.mark.django_db
def test_the_event_export_neutralises_hostile_actor_names(audit_files, make_user):
    auditor = Client()
    auditor.force_login(make_user("ann", Role.AUDITOR))
    # The real way in for anyone: a failed login with a formula as the username.
    assert Client().post("/login/", {"username": HOSTILE[0], "password": "wrong"}).status_code == 200
    # The form strips surrounding whitespace from usernames: the tab and CR cases go in directly.
    target = make_user("target")
    with transaction.atomic():
        for name in HOSTILE[1:]:
            event_record(
                actor=Actor(type="user", id="", name=name),
                action="audit.exported",
                obj=target,
                payload={"text": name},
            )

    response = auditor.get("/audit/export.csv")

    assert response.status_code == 200
    header, *rows, last = cells(body_of(response))
    assert header == FIELDS and last[0] == "#checkpoint"
    by_id = {e.pk: e for e in AuditEvent.objects.all()}
    exported = {}
    for row in rows:
        values = dict(zip(FIELDS, row, strict=True))
        assert not any(v.startswith(FORMULA_STARTS) for v in row), row
        event = by_id[int(values["id"])]  # ids and sequence numbers stay plain numbers
        assert values["seq"] == str(event.seq)
        assert csv_safe.original_cell(values["actor_name"]) == event.actor_name  # the hash still checks
        exported[event.actor_name] = values["actor_name"]
    for name in HOSTILE:
        assert exported[name] == "'" + name


@pytest.mark.django_db(transaction=True)
def test_the_analytics_csv_neutralises_hostile_names_and_keeps_costs_numeric(live_pool, make_user):
    Worker.objects.filter(slug="alpha").update(vendor="=cmd|' /C calc'!A0")
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Answer", [])))])
    server.program("alpha", [Reply("42", prompt_tokens=100, completion_tokens=20)])
    run = run_now(submit("=1+1 what is it?", domain="@SUM(A1)"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run)
    assert step.vendor == "=cmd|' /C calc'!A0" and step.cost_usd > 0
    client = Client()
    client.force_login(make_user("olga", Role.OPERATOR))

    by_vendor = client.get("/analytics/", {"chart": "cost_by_vendor"})
    by_domain = client.get("/analytics/", {"chart": "routing_by_domain"})

    assert by_vendor.status_code == 200 and by_domain.status_code == 200
    (row,) = csv.DictReader(io.StringIO(by_vendor.content.decode(), newline=""))
    assert row["vendor"] == "'=cmd|' /C calc'!A0"
    assert Decimal(row["cost_usd"]) == step.cost_usd and row["steps"] == "1"  # numbers, unquoted
    (row,) = csv.DictReader(io.StringIO(by_domain.content.decode(), newline=""))
    assert row["domain"] == "'@SUM(A1)" and row["share"] == "1.0"
