"""An auditor in a real browser: the dossier explains each step, exports it, and shows outputs as text."""

from __future__ import annotations

import json
import math

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from audit.models import AuditEvent
from routing import engine
from routing.models import Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned2=1">'


def run_a_routed_task(server) -> Task:
    plan = plan_json(
        ("beta", "Draft an answer to: what is 2+2?", []),
        ("gamma", "Check the draft", "all"),
        thought="beta is cheap; gamma checks",
    )
    prefix, rest = plan.split('"worker": "', 1)
    logprobs = [
        {"token": prefix + '"worker": "', "logprob": 0.0, "top_logprobs": []},
        {
            "token": "beta",
            "logprob": math.log(0.8),
            "top_logprobs": [
                {"token": "beta", "logprob": math.log(0.8)},
                {"token": "al", "logprob": math.log(0.15)},
            ],
        },
        {"token": rest[len("beta") :], "logprob": 0.0, "top_logprobs": []},
    ]
    server.program("conductor", [Reply(plan, logprobs=logprobs)])
    server.program("beta", [Reply(f"4 {HOSTILE}", prompt_tokens=100, completion_tokens=20)])
    server.program("gamma", [Reply("4", prompt_tokens=200, completion_tokens=5)])
    task, _ = task_submit(submission=TaskSubmission(text="What is 2+2?"), source=Task.Source.API)
    engine.execute_run(task.runs.get().pk)
    return task


def test_an_auditor_opens_a_dossier_sees_why_each_step_went_where_and_exports_it(
    page: Page, live_pool, log_in, screenshot, tmp_path
):
    task = run_a_routed_task(live_pool["server"])
    log_in("ann", Role.AUDITOR)

    page.get_by_role("link", name="Audit log").click()
    expect(page.locator("h1")).to_have_text("Audit log")
    page.locator("table.data").get_by_role("link", name=str(task.pk)[:8]).first.click()
    expect(page.locator("h1")).to_have_text("Audit dossier")
    rows = page.locator("tr.dossier-step")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("beta")
    expect(rows.nth(0)).to_contain_text("acme")
    expect(rows.nth(0)).to_contain_text("beta is cheap; gamma checks")  # the conductor's reasoning
    expect(rows.nth(0)).to_contain_text("beta 80%")  # what it weighed, from the log-probabilities
    expect(rows.nth(0)).to_contain_text("alpha 15%")
    expect(rows.nth(0)).to_contain_text("only its instruction")
    expect(rows.nth(1)).to_contain_text("step 0 (beta)")  # what gamma saw
    expect(rows.nth(1)).to_contain_text("globex")
    expect(page.locator("#proof")).to_contain_text("intact up to event")

    page.locator("details", has_text="Instruction and response").first.locator("summary").click()
    expect(page.get_by_text(HOSTILE, exact=False).first).to_be_visible()
    assert page.evaluate("window.__pwned") is None and page.evaluate("window.__pwned2") is None
    assert page.locator("main img").count() == 0
    screenshot("audit-dossier")

    with page.expect_download() as download_info:
        page.locator("#export-dossier").click()
    saved = tmp_path / "dossier.html"
    download_info.value.save_as(saved)
    html = saved.read_text()
    assert "<link" not in html and "<script" not in html  # self-contained, and the output stays text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in html
    assert str(task.pk) in html
    viewed = AuditEvent.objects.filter(action="record.viewed", task_id=task.pk, actor_name="ann")
    assert sorted(viewed.values_list("payload__view", flat=True)) == ["dossier", "dossier export"]

    page.goto(saved.as_uri())  # the exported file, opened on its own, renders with its styles
    expect(page.locator("h1")).to_have_text("Audit dossier")
    assert page.evaluate("window.__pwned") is None
    screenshot("audit-dossier-exported")


def test_an_auditor_exports_the_filtered_event_log_and_verifies_the_record(
    page: Page, live_pool, log_in, screenshot, tmp_path
):
    task = run_a_routed_task(live_pool["server"])
    log_in("ann", Role.AUDITOR)
    page.goto(f"/audit/?task={task.pk}")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Export JSON Lines").click()
    saved = tmp_path / "events.jsonl"
    download_info.value.save_as(saved)
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert lines[0]["type"] == "export" and lines[0]["filters"] == {"task": str(task.pk)}
    exported = [line for line in lines[1:] if line["type"] == "event"]
    assert {e["task_id"] for e in exported} == {str(task.pk)}
    assert [e["id"] for e in exported] == sorted(
        AuditEvent.objects.filter(task_id=task.pk, id__lte=exported[-1]["id"]).values_list("id", flat=True)
    )

    page.get_by_role("link", name="Verify").click()
    page.locator("#verify-now").click()
    expect(page.locator("#verify-summary")).to_contain_text("intact up to event")
    screenshot("audit-verify")


def test_an_auditor_sees_the_vendor_exposure_and_follows_it_to_the_tasks(
    page: Page, live_pool, log_in, screenshot
):
    task = run_a_routed_task(live_pool["server"])
    log_in("ann", Role.AUDITOR)
    page.get_by_role("link", name="Vendors").click()
    row = page.locator("table.data tbody tr", has_text="globex")
    expect(row).to_contain_text("internal")
    row.get_by_role("link", name="tasks").click()
    expect(page.get_by_role("link", name=str(task.pk))).to_be_visible()
    screenshot("audit-vendors")
