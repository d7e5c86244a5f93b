"""Runs side by side in a real browser: from a task page with a live run and its shadow run, the
"Compare runs" link opens the runs in columns, the rows where they differ marked."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from tests.operations.test_compare import XSS, live_and_shadow

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_page_opens_its_runs_side_by_side_with_the_differences_marked(
    page: Page, live_pool, log_in, screenshot
):
    live, shadow = live_and_shadow(live_pool["server"])
    log_in("ann", Role.AUDITOR)
    page.goto(f"/tasks/{live.task_id}/")

    page.get_by_role("link", name="Compare runs").click()

    expect(page.get_by_role("heading", name="Compare runs", level=1)).to_be_visible()
    table = page.locator("#compare-table")
    expect(table.locator("thead th[data-run]")).to_have_count(2)
    expect(table.locator("thead")).to_contain_text(f"Run {live.pk}")
    expect(table.locator("thead")).to_contain_text(f"Run {shadow.pk}")
    conductor = table.locator('tr[data-field="conductor"]')
    expect(conductor).to_have_class("differs")
    expect(conductor.locator("th .diff-mark")).to_have_text("≠ differs")
    expect(conductor.locator("td.differs")).to_have_count(2)
    # The second step only the live run has: its worker beside a dash, marked.
    worker = table.locator('#compare-step-1 tr[data-field="worker"]')
    expect(worker.locator("td").nth(0)).to_have_text("gamma")
    expect(worker.locator("td").nth(1)).to_have_text("–")
    expect(worker.locator(".diff-mark")).to_be_visible()
    # The same backend on both sides: no marker.
    expect(table.locator('tr[data-field="backend"] .diff-mark')).to_have_count(0)
    # The answers' markup is text, never parsed.
    expect(table.locator('#compare-run tr[data-field="final_answer"] td').nth(1)).to_contain_text(XSS)
    assert page.locator("main script").count() == 0
    screenshot("run-compare")
