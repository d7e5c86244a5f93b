"""Time ranges and saved views of the task list in a real Chromium: pick a quick range, save the
view, open it again from its address."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from accounts.models import Role
from audit.models import AuditEvent
from routing.models import SavedView, Task
from routing.services import TaskSubmission, task_submit

pytestmark = pytest.mark.django_db(transaction=True)


def submit(text: str, age: timedelta) -> Task:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
    Task.objects.filter(pk=task.pk).update(created_at=timezone.now() - age)
    return task


def test_a_quick_range_is_saved_as_a_view_and_opened_again(page: Page, log_in, screenshot):
    log_in("ada", Role.OPERATOR)
    submit("Asked three days ago", timedelta(days=3))
    submit("Asked ten minutes ago", timedelta(minutes=10))
    page.goto("/")
    rows = page.locator("table.data tbody tr")
    expect(rows).to_have_count(2)

    page.locator(".ranges").get_by_role("link", name="Last 24 hours").click()
    page.wait_for_url(re.compile(r"[?&]since=\d{4}-\d\d-\d\dT"))
    expect(rows).to_have_count(1)
    expect(rows.nth(0)).to_contain_text("Asked ten minutes ago")
    expect(page.locator("#filtered-by")).to_contain_text("since")
    expect(page.locator("#filtered-by")).to_contain_text("UTC")
    # The provider calls keep the range.
    expect(page.locator(".ranges").get_by_role("link", name="provider calls")).to_have_attribute(
        "href", re.compile(r"^/attempts/\?since=")
    )

    saved = page.locator("#saved-views")
    saved.locator("summary").click()
    saved.get_by_placeholder("Name this view").fill("Today's tasks")
    saved.get_by_label("shared with everyone who reads tasks").check()
    screenshot("saved-view-form")
    saved.get_by_role("button", name="Save this view").click()
    page.wait_for_url(re.compile(r"/\?since="))
    view = SavedView.objects.get()
    assert view.shared and view.query.startswith("since=")
    assert AuditEvent.objects.filter(action="view.saved", object_id=str(view.pk)).exists()

    page.goto("/")
    expect(rows).to_have_count(2)
    page.locator("#saved-views").get_by_role("link", name="Today's tasks").click()
    page.wait_for_url(re.compile(r"/\?since="))
    expect(rows).to_have_count(1)
    expect(rows.nth(0)).to_contain_text("Asked ten minutes ago")
    screenshot("saved-view-opened")
