"""The task pages in a real Chromium: log in, submit, watch a run's result, filter, browse workers."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from routing import engine
from routing.models import RunStatus, Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

TASK_TEXT = "<script>window.__xss = 1</script> What is 2+2?"
IMG_XSS = '<img src=x onerror="window.__xss2=1">'
TASK_URL = re.compile(r"/tasks/(?P<id>[0-9a-f-]{36})/$")


def submit_through_the_form(page: Page, text: str, screenshot=None) -> Task:
    page.get_by_role("navigation").get_by_role("link", name="Submit").click()
    expect(page.get_by_role("heading", name="Submit a task")).to_be_visible()
    page.get_by_label("Task:", exact=True).fill(text)
    if screenshot is not None:
        screenshot("task-submit")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(TASK_URL)
    task_id = TASK_URL.search(page.url)["id"]
    return Task.objects.get(pk=task_id)


def program_two_step_run(server) -> None:
    server.program(
        "conductor",
        [
            Reply(
                plan_json(("alpha", "Compute the sum", []), ("gamma", "Check the sum", "all")),
                prompt_tokens=300,
                completion_tokens=60,
            )
        ],
    )
    server.program("alpha", [Reply(f"The sum is 4 {IMG_XSS}", prompt_tokens=100, completion_tokens=20)])
    server.program("gamma", [Reply("4", prompt_tokens=200, completion_tokens=4)])


def test_a_task_submitted_in_the_browser_shows_its_text_literally_and_then_its_run(
    page: Page, live_pool, log_in, screenshot
):
    user = log_in("grace", Role.OPERATOR)

    task = submit_through_the_form(page, TASK_TEXT, screenshot)

    assert task.text == TASK_TEXT
    assert task.source == Task.Source.WEB and task.submitted_by == user
    heading = page.locator(".heading")
    expect(heading.get_by_role("heading", level=1)).to_contain_text(str(task.pk))
    expect(heading.locator(".status")).to_have_text("Queued")
    # The markup is shown as text, never parsed: no script element, and it did not run.
    expect(page.locator("pre.text").first).to_have_text(TASK_TEXT)
    page_scripts = (
        "main script:not([src$='/static/js/live.js']):not([src$='/static/js/task_live.js'])"
        ":not([src$='/static/js/task_page.js'])"
    )
    assert page.locator(page_scripts).count() == 0
    assert page.evaluate("window.__xss") is None
    screenshot("task-queued")

    program_two_step_run(live_pool["server"])
    run = task.runs.get()
    engine.execute_run(run.pk)
    run.refresh_from_db()
    task.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error

    page.reload()

    expect(heading.locator(".status")).to_have_text("Succeeded")
    expect(page.locator("#final-answer")).to_have_text("4")
    expect(page.locator("dl.facts")).to_contain_text(f"${task.cost_usd:.6f}")
    expect(page.locator("section.card").nth(1)).to_contain_text(f"${run.cost_usd:.6f}")
    expect(page.locator("p.thought")).to_have_text("test plan")
    rows = page.locator("tr.step-row")
    expect(rows).to_have_count(2)
    # Worker, vendor, what it saw, status, tokens and cost (Decimal on the worker's prices:
    # 100 * $1.00/M + 20 * $2.00/M, and 200 * $3.00/M + 4 * $15.00/M).
    for row, cells in zip(
        (rows.nth(0), rows.nth(1)),
        (
            ["0", "alpha", "acme", "nothing", "Succeeded", "100 / 20", "0.000140"],
            ["1", "gamma", "globex", "all earlier", "Succeeded", "200 / 4", "0.000660"],
        ),
        strict=True,
    ):
        expect(row.locator("td")).to_have_count(9)
        for i, text in enumerate(cells):
            expect(row.locator("td").nth(i)).to_have_text(text)
        expect(row.locator("td").nth(8)).to_have_text("1")
    assert run.cost_usd == Decimal("0.000140") + Decimal("0.000660") + Decimal("0.000042")
    # Numbers line up on the right, under their right-aligned headers.
    cost_cell = rows.nth(0).locator("td").nth(6)
    assert cost_cell.evaluate("e => getComputedStyle(e).textAlign") == "right"
    assert page.locator("table.steps th.num").first.evaluate("e => getComputedStyle(e).textAlign") == "right"

    # The response hides in the step's <details> until it is opened; its markup is text.
    detail = page.locator("tr.step-detail").nth(0)
    response = detail.locator("pre.text").last
    expect(response).to_be_hidden()
    detail.locator("summary").click()
    expect(response).to_be_visible()
    expect(response).to_have_text(f"The sum is 4 {IMG_XSS}")
    expect(detail.locator("h4", has_text="Response")).to_be_visible()
    assert page.locator("main img").count() == 0
    assert page.evaluate("window.__xss2") is None
    assert page.evaluate("window.__xss") is None
    screenshot("task-succeeded")


def test_the_task_list_shows_submitted_tasks_and_filters_them_by_status_and_text(
    page: Page, live_pool, log_in, screenshot
):
    user = log_in("ada", Role.OPERATOR)
    done = submit_through_the_form(page, "Translate hello to French")
    program_two_step_run(live_pool["server"])
    engine.execute_run(done.runs.get().pk)
    waiting, _ = task_submit(submission=TaskSubmission(text="Sum 2 and 3"), source=Task.Source.API, user=user)

    page.get_by_role("navigation").get_by_role("link", name="Tasks").click()

    rows = page.locator("table.data tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("Sum 2 and 3")  # newest first
    expect(rows.nth(0).locator(".status")).to_have_text("Queued")
    expect(rows.nth(1)).to_contain_text("Translate hello to French")
    expect(rows.nth(1).locator(".status")).to_have_text("Succeeded")
    screenshot("task-list")

    filters = page.locator("form.filters")
    filters.locator("select[name=status]").select_option(label="Succeeded")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"[?&]status=succeeded"))
    expect(rows).to_have_count(1)
    expect(rows.nth(0)).to_contain_text("Translate hello to French")
    expect(filters.locator("select[name=status]")).to_have_value("succeeded")

    filters.locator("select[name=status]").select_option(label="Queued")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"[?&]status=queued"))
    expect(rows).to_have_count(1)
    expect(rows.nth(0)).to_contain_text("Sum 2 and 3")

    # The row links to the task's page.
    rows.nth(0).get_by_role("link").click()
    page.wait_for_url(re.compile(rf"/tasks/{waiting.pk}/$"))
    page.go_back()

    filters.locator("select[name=status]").select_option(label="Any status")
    filters.get_by_placeholder("Search task text").fill("no task says this")
    filters.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"[?&]q=no\+task\+says\+this"))
    expect(page.locator("table.data")).to_have_count(0)
    expect(page.locator(".empty")).to_contain_text("No tasks match these filters.")
    expect(filters.get_by_placeholder("Search task text")).to_have_value("no task says this")
    screenshot("task-list-empty")


def test_the_workers_page_lists_the_pool(page: Page, live_pool, log_in, screenshot):
    log_in("linus", Role.ML_STAFF)

    page.get_by_role("navigation").get_by_role("link", name="Workers").click()

    expect(page.get_by_role("heading", name="Worker pool")).to_be_visible()
    rows = page.locator("table.data tbody tr")
    expect(rows).to_have_count(3)
    by_slug = {
        "alpha": [
            "alpha",
            "openai/alpha",
            "acme",
            "public, internal",
            "1.0000",
            "2.0000",
            "Set by an operator",
            "yes",
        ],
        "beta": [
            "beta",
            "openai/beta",
            "acme",
            "public, internal",
            "0.5000",
            "1.5000",
            "Set by an operator",
            "yes",
        ],
        "gamma": [
            "gamma",
            "openai/gamma",
            "globex",
            "public, internal",
            "3.0000",
            "15.0000",
            "Set by an operator",
            "yes",
        ],
    }
    for slug, cells in by_slug.items():
        row = rows.filter(has=page.locator("td", has_text=re.compile(rf"^{slug}$")))
        expect(row).to_have_count(1)
        expect(row.locator("td")).to_have_text(cells)
    screenshot("workers")


def test_an_auditor_reads_the_tasks_but_is_offered_no_way_to_submit(
    page: Page, live_pool, log_in, screenshot
):
    log_in("ann", Role.AUDITOR)
    task, _ = task_submit(submission=TaskSubmission(text="Sum 2 and 3"), source=Task.Source.API)

    page.reload()

    nav = page.get_by_role("navigation")
    for name in ("Tasks", "Workers", "Audit log"):
        expect(nav.get_by_role("link", name=name)).to_be_visible()
    expect(nav.get_by_role("link", name="Submit")).to_have_count(0)
    expect(page.get_by_role("link", name="Submit a task")).to_have_count(0)
    expect(page.locator('a[href="/tasks/new/"]')).to_have_count(0)
    rows = page.locator("table.data tbody tr")
    expect(rows).to_have_count(1)
    screenshot("task-list-auditor")

    rows.nth(0).get_by_role("link").click()
    page.wait_for_url(re.compile(rf"/tasks/{task.pk}/$"))
    expect(page.locator("pre.text").first).to_have_text("Sum 2 and 3")
    expect(nav.get_by_role("link", name="Submit")).to_have_count(0)


def test_an_anonymous_visit_goes_to_the_login_page_which_is_styled(page: Page, live_server, screenshot):
    page.goto("/")

    page.wait_for_url(f"{live_server.url}/login/?next=/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    expect(page.get_by_label("Username")).to_be_visible()
    expect(page.get_by_role("navigation")).to_have_count(0)  # no app navigation before logging in
    # The stylesheet loaded from the live server: the body has the app's background, not white.
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(246, 247, 249)"
    assert page.evaluate("document.styleSheets.length") == 1
    screenshot("login")
