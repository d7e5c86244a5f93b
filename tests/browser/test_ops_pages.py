"""Operators' pages in a real browser: the live overview and the analytics charts, with data."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from audit.models import Role
from routing import engine, replay
from routing.models import Task
from routing.services import TaskSubmission, conductor_active, task_submit
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
    expect(page.locator("#chart-pareto")).to_contain_text("static-v1 (n=")  # its sample size beside it
    expect(page.locator("#chart-routing")).to_contain_text("math-l5")
    # Every axis is titled on screen (plotly.js 3+ drops a title given as a plain string).
    expect(page.locator("#chart-pareto .xtitle")).to_have_text("USD per 1,000 tasks")
    expect(page.locator("#chart-pareto .ytitle")).to_have_text("accuracy")
    expect(page.locator("#chart-cost-worker .ytitle")).to_have_text("USD")
    expect(page.locator("#chart-routing .xtitle")).to_have_text("share of steps")
    # Every run fell in one hour: the time charts drew a bar one hour wide on an axis of hours, not a
    # bar a millisecond wide on an axis of milliseconds (23:59:59.9996 ... 00:00:00.0004), and the one
    # conductor version is named in a legend.
    for chart in ("chart-cost-worker", "chart-volume-vendor", "chart-cost-conductor"):
        span_ms = page.evaluate(
            f"() => {{ const r = document.getElementById('{chart}')._fullLayout.xaxis.range;"
            " return new Date(r[1]) - new Date(r[0]); }"
        )
        assert span_ms >= 3 * 3600 * 1000, (chart, span_ms)
        ticks = page.locator(f"#{chart} .xtick text").all_text_contents()
        assert ticks and not any(re.search(r"\d:\d\d\.\d", t) for t in ticks), (chart, ticks)
    expect(page.locator("#chart-cost-conductor .legend")).to_contain_text(conductor_active().name)
    # Legends sit above the plot, clear of the x axis's ticks and title.
    for chart in ("chart-cost-worker", "chart-cost-conductor", "chart-pareto", "chart-routing"):
        legend = page.locator(f"#{chart} .legend").bounding_box()
        plot = page.locator(f"#{chart} .nsewdrag").first.bounding_box()
        assert legend and plot and legend["y"] + legend["height"] <= plot["y"] + 1, (chart, legend, plot)
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
    # The history: the runs the engine made, as live traffic, and their calls' latency per worker.
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    expect(page.locator("#chart-ops-runs .legendtext")).to_have_text(["live"])
    assert page.locator("#chart-ops-runs .barlayer .point").count() > 0
    expect(page.locator("#chart-ops-latency")).to_contain_text("gpt-4o-mini-2024-07-18 p95")
    expect(page.locator("#chart-ops-errors")).to_have_text("No provider error in this period.")
    expect(page.locator("#chart-ops-spend .ytitle")).to_have_text("USD per minute")
    expect(page.locator("#ops-queues")).to_contain_text("runs")
    page.evaluate("window.__noReload = 1")
    task_submit(submission=TaskSubmission(text="waiting in the queue"), source=Task.Source.API)
    expect(page.locator("#tile-queued")).to_have_text("1", timeout=12_000)  # the page re-read itself
    expect(page.locator("#ops-live")).to_have_text("live")
    # Redrawn from the fresh copy's data, not wiped by the swap.
    assert page.locator("#chart-ops-runs .barlayer .point").count() > 0
    assert page.evaluate("window.__noReload") == 1, "the overview reloaded instead of re-reading"
    screenshot("ops-overview")
    # Another period: a link, a new page.
    page.get_by_role("link", name="last week").click()
    expect(page.locator("#ops-history strong")).to_have_text("last week")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    assert page.locator("#chart-ops-runs .barlayer .point").count() > 0
    screenshot("ops-overview-week")
