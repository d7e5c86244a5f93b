"""Review in a real Chromium: an auditor marks a run's answer wrong from its task's page, sees the
verdict, and finds the run among the reviewed in the queue, where it no longer waits."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from tests.audit.support import run_now, submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_auditor_marks_a_run_wrong_from_its_page_and_the_queue_follows(
    page: Page, live_pool, log_in, screenshot
):
    server = live_pool["server"]
    server.program("conductor", [Reply(plan_json(("alpha", "Compute", [])))])
    server.program("alpha", [Reply("6 * 7 = 41")])
    run = run_now(submit("What is 6 * 7?"))
    log_in("aida", Role.AUDITOR)

    page.get_by_role("navigation").get_by_role("link", name="Review").click()
    row = page.locator("#review-table tr", has_text=f"run {run.pk}")
    expect(row).to_contain_text("waiting")
    screenshot("review-queue")
    row.get_by_role("link", name=f"run {run.pk}").click()
    page.wait_for_url(f"**/tasks/{run.task_id}/#run-{run.pk}")
    form = page.locator(f"#review-{run.pk} form")
    form.get_by_label("Verdict").select_option("wrong")
    form.get_by_label("Label").fill("arithmetic")
    form.get_by_label("Comment").fill("6 * 7 is 42, not 41.")
    form.get_by_role("button", name="Record verdict").click()

    expect(page.locator(".flash").first).to_contain_text(f"run {run.pk} marked wrong")
    verdicts = page.locator(f"#review-{run.pk} .annotations")
    expect(verdicts).to_contain_text("Wrong")
    expect(verdicts).to_contain_text("arithmetic")
    expect(verdicts).to_contain_text("6 * 7 is 42, not 41.")
    screenshot("review-task-page")
    page.goto("/review/")
    expect(page.locator("#review-table tr", has_text=f"run {run.pk}")).to_have_count(0)
    page.goto("/review/?state=reviewed")
    expect(page.locator("#review-table tr", has_text=f"run {run.pk}")).to_contain_text("wrong")
