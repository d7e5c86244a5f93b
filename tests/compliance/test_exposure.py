"""The exposure maps: a task's content by vendor in its dossier (HTML and PDF), and data class to vendor
over a period on the vendors page. Runs made by the real engine against loopback providers."""

from __future__ import annotations

import contextlib
import json
import re
import zlib

import pytest
from django.test import Client

from accounts.models import Role
from compliance import dossiers
from routing import engine
from routing.models import Step, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)
HOSTILE = "<script>alert('x')</script>"


@pytest.fixture
def three_steps(live_pool):
    """alpha (acme) answers first; beta (acme) sees nothing; gamma (globex) sees alpha's answer."""
    server = live_pool["server"]
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Find it", []), ("beta", "Check it", []), ("gamma", "Sum up", [0])))],
    )
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"{slug} says {HOSTILE}", prompt_tokens=50, completion_tokens=5)])
    task, _ = task_submit(
        submission=TaskSubmission(text=f"Exposure {HOSTILE}", classification="internal"),
        source=Task.Source.API,
    )
    engine.execute_run(task.runs.get().pk)
    return Task.objects.get(pk=task.pk)


def steps_of(task: Task) -> dict[str, Step]:
    return {s.worker_slug: s for s in Step.objects.filter(run__task=task)}


def test_a_tasks_map_names_what_each_vendor_received_and_which_call_carried_it(three_steps):
    task = three_steps
    steps = steps_of(task)
    context = dossiers.dossier_context(task)
    exposure = context["exposure"]
    # the LLM conductor was sent the task to plan it: a column of its own
    assert exposure["vendors"] == ["acme", "conductor llm-test", "globex"]
    assert exposure["classification"] == "internal"
    plan = next(row for row in exposure["rows"] if row["kind"] == "plan")
    assert [(v, n) for v, _, n in plan["line"] if n] == [("conductor llm-test", 1)]
    received = {
        (row["kind"], row["step"].worker_slug if row["step"] else None): {
            vendor: [s.worker_slug for s in cells] for vendor, cells, _ in row["line"] if cells
        }
        for row in exposure["rows"]
    }
    assert received == {
        ("instruction", "alpha"): {"acme": ["alpha"]},
        ("instruction", "beta"): {"acme": ["beta"]},
        ("instruction", "gamma"): {"globex": ["gamma"]},
        ("answer", "alpha"): {"globex": ["gamma"]},  # only gamma was allowed to see it
        ("plan", None): {},
    }

    auditor = Client()
    auditor.force_login(_user("ada", Role.AUDITOR))
    page = auditor.get(f"/audit/tasks/{task.pk}/").content.decode()
    section = page[page.index('id="exposure-map"') :]
    section = section[: section.index("</section>")]
    assert f'href="/tasks/{task.pk}/#step-{steps["gamma"].pk}"' in section
    assert len(re.findall(r'<td class="sent">', section)) == 5
    assert f'href="/tasks/{task.pk}/#run-{task.runs.get().pk}">planned</a>' in section
    assert HOSTILE not in page

    task_page = auditor.get(f"/tasks/{task.pk}/").content.decode()
    assert f'id="step-{steps["gamma"].pk}"' in task_page  # where the map's links land


def test_the_dossier_exports_as_a_pdf_and_says_it_was_exported(three_steps):
    auditor = Client()
    auditor.force_login(_user("ada", Role.AUDITOR))
    response = auditor.get(f"/audit/tasks/{three_steps.pk}/", {"download": "pdf"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"] == f'attachment; filename="dossier-{three_steps.pk}.pdf"'
    assert response.content.startswith(b"%PDF-") and len(response.content) > 5000
    gamma = Step.objects.get(run__task=three_steps, worker_slug="gamma")
    # the map's links open the app from the file
    assert f"http://testserver/tasks/{three_steps.pk}/#step-{gamma.pk}".encode() in pdf_objects(
        response.content
    )
    from audit.models import AuditEvent

    viewed = AuditEvent.objects.filter(action="record.viewed", task_id=three_steps.pk).latest("id")
    assert viewed.payload["view"] == "dossier export (PDF)"
    assert auditor.get(f"/audit/tasks/{three_steps.pk}/", {"download": "docx"}).status_code == 400


def test_the_dossier_folds_views_of_the_record_apart_from_the_tasks_history(three_steps):
    """Each look at a record is an event; a much-viewed task keeps its history readable (and its
    dossier's size bounded): viewers are counted, the latest views listed, the rest one link away."""
    from audit.models import AuditEvent

    auditor, operator = Client(), Client()
    auditor.force_login(_user("ada", Role.AUDITOR))
    operator.force_login(_user("olga", Role.OPERATOR))
    url = f"/audit/tasks/{three_steps.pk}/"
    for _ in range(dossiers.VIEWS_SHOWN + 4):
        assert auditor.get(url).status_code == 200
    assert operator.get(f"/tasks/{three_steps.pk}/").status_code == 200

    response = auditor.get(url)

    total = AuditEvent.objects.filter(task_id=three_steps.pk, action="record.viewed").count()
    assert total == dossiers.VIEWS_SHOWN + 6
    views = response.context["views"]  # the record as it stood when this look began: the views before it
    seen = total - 1
    assert views["total"] == seen and len(views["latest"]) == dossiers.VIEWS_SHOWN
    assert {v["actor_name"]: v["n"] for v in views["viewers"]} == {"ada": seen - 1, "olga": 1}
    assert not [e for e in response.context["events"] if e.action == "record.viewed"]
    history = AuditEvent.objects.filter(task_id=three_steps.pk).exclude(action="record.viewed").count()
    assert len(response.context["events"]) == history
    html = response.content.decode()
    assert f"Views of this record ({seen})" in html and f"Audit events ({history})" in html
    assert f"?task={three_steps.pk}&amp;action=record.viewed" in html


def test_the_dossier_says_why_a_conductor_step_was_allowed(live_pool):
    """A conductor step passes no rule (it is the conductor itself): the dossier says so, not "allowed ()"."""
    server = live_pool["server"]
    outer = plan_json(("alpha", "Draft", []), ("conductor", "Decide whether to check it", "all"))
    server.program("conductor", [Reply(outer), Reply(plan_json())])  # the nested plan: pass through
    server.program("alpha", [Reply("draft")])
    task, _ = task_submit(
        submission=TaskSubmission(text="Check or pass", max_depth=1), source=Task.Source.API
    )
    engine.execute_run(task.runs.get().pk)
    auditor = Client()
    auditor.force_login(_user("ada", Role.AUDITOR))

    html = auditor.get(f"/audit/tasks/{task.pk}/").content.decode()

    assert "allowed: the conductor itself" in html and "allowed ()" not in html
    assert "allowed (worker-clearance" in html  # alpha's verdict names the rules it passed


def test_the_vendors_page_draws_data_class_to_vendor_and_lists_each_bands_tasks(three_steps):
    auditor = Client()
    auditor.force_login(_user("ada", Role.AUDITOR))
    page = auditor.get("/audit/vendors/").content.decode()
    data = re.search(r'<script id="exposure-data" type="application/json">(.*?)</script>', page, re.S)
    flows = json.loads(data.group(1))
    assert flows["nodes"] == ["internal", "acme", "globex"] and flows["classes"] == 1
    bands = {(link["classification"], link["vendor"]): link["value"] for link in flows["links"]}
    assert bands == {("internal", "acme"): 2, ("internal", "globex"): 1}

    listed = auditor.get("/audit/vendors/", {"vendor": "globex", "classification": "internal"})
    text = listed.content.decode()
    assert 'id="filtered-by"' in text and f'href="/audit/tasks/{three_steps.pk}/"' in text


def pdf_objects(data: bytes) -> bytes:
    """The PDF with its compressed streams inflated (WeasyPrint packs the link annotations there)."""
    inflated = [data]
    for match in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        with contextlib.suppress(zlib.error):
            inflated.append(zlib.decompress(match.group(1)))
    return b"".join(inflated)


def _user(name: str, role: str):
    from django.contrib.auth import get_user_model

    from audit.grants import user_set_roles

    user = get_user_model().objects.create_user(username=name, password="x" * 12)
    user_set_roles(user=user, roles=[role])
    return user
