"""Operators' pages in a real browser: the live overview and the analytics charts, with data."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from audit.models import Role
from routing import engine, replay
from routing.models import Task
from routing.services import TaskSubmission, task_submit
from tests.browser.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def replay_runs(replay_pool):
    items = replay.read_items(replay.split_path("dev"))
    for item in [i for i in items if i.domain == "gsm8k"][:2] + [i for i in items if i.domain == "math-l5"][
        :2
    ]:
        task, _ = task_submit(
            submission=TaskSubmission(
                text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
            ),
            source=Task.Source.CLI,
        )
        engine.execute_run(task.runs.get().pk)


def test_the_analytics_charts_render_with_data(page: Page, replay_runs, log_in, screenshot):
    log_in("olga", Role.OPERATOR)
    page.get_by_role("link", name="Analytics").click()
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    for chart in (
        "chart-cost-worker",
        "chart-volume-vendor",
        "chart-cost-conductor",
        "chart-pareto",
        "chart-routing",
    ):
        # Plotly drew bars or points: the chart holds an SVG with at least one data mark.
        marks = page.locator(f"#{chart} .barlayer .point, #{chart} .scatterlayer .point")
        assert marks.count() > 0, chart
    expect(page.locator("#chart-pareto")).to_contain_text("static-v1")
    expect(page.locator("#chart-routing")).to_contain_text("math-l5")
    screenshot("analytics")


def test_the_analytics_page_says_what_to_do_when_there_is_no_data(
    page: Page, live_server, log_in, screenshot
):
    log_in("olga", Role.OPERATOR)
    page.goto("/analytics/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    expect(page.locator("#chart-pareto")).to_contain_text("submit tasks with a reference answer")
    screenshot("analytics-empty")


def test_the_live_overview_shows_workers_and_refreshes_itself(page: Page, replay_runs, log_in, screenshot):
    log_in("olga", Role.OPERATOR)
    page.get_by_role("link", name="Overview").click()
    expect(page.locator("#ops-workers")).to_contain_text("gpt-4o-mini-2024-07-18")
    expect(page.locator("#tile-queued")).to_have_text("0")
    task_submit(submission=TaskSubmission(text="waiting in the queue"), source=Task.Source.API)
    expect(page.locator("#tile-queued")).to_have_text("1", timeout=12_000)  # the page re-read itself
    screenshot("ops-overview")
