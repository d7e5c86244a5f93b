"""Operators' pages in a real browser: the live overview and the analytics charts, with data."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from accounts.models import Role
from routing import engine, replay
from routing.models import Attempt, Decision, Grain, RunRollup, Step, Task
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
    expect(page.locator("#chart-ops-latency .legendtext")).to_contain_text(["gpt-4o-mini-2024-07-18"])
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


def boxes_overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_the_latency_chart_keeps_its_plot_with_a_dozen_workers(page: Page, replay_pool, log_in, screenshot):
    """A legend of a dozen workers runs to several rows: the plot keeps its height below it."""
    task, _ = task_submit(submission=TaskSubmission(text="many workers"), source=Task.Source.API)
    run = task.runs.get()
    decision = Decision.objects.create(run=run, backend="static", version_name="static-v1", valid=True)
    now = timezone.now()
    for i in range(12):
        step = Step.objects.create(
            run=run, decision=decision, index=i, worker_slug=f"worker-{i:02d}-2024-07-18", instruction="x"
        )
        Attempt.objects.create(
            step=step,
            number=1,
            status=Attempt.Status.SUCCEEDED,
            latency_ms=100 + 10 * i,
            started_at=now - timedelta(minutes=2),
            finished_at=now - timedelta(minutes=2) + timedelta(milliseconds=100 + 10 * i),
        )
    log_in("olga", Role.OPERATOR)
    page.goto("/ops/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    expect(page.locator("#chart-ops-latency .legend .traces")).to_have_count(12)
    legend = page.locator("#chart-ops-latency .legend").bounding_box()
    plot = page.locator("#chart-ops-latency .nsewdrag").first.bounding_box()
    assert legend and plot and legend["y"] + legend["height"] <= plot["y"] + 1, (legend, plot)
    assert plot["height"] >= 195, plot  # the plot area's 200 px, not a strip under the legend
    screenshot("ops-latency-many-workers")


def test_the_accuracy_cost_scatter_labels_do_not_collide_and_ticks_are_dollars(
    page: Page, replay_pool, log_in, screenshot
):
    """Points that crowd (similar cost and accuracy) are named in a legend and on hover, not by labels
    printed over each other; the log axis of cost is ticked in dollars."""
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    names = [f"worker-{i}-2024-08-06" for i in range(8)]
    for i, name in enumerate(names):
        RunRollup.objects.create(
            grain=Grain.HOUR,
            start=hour,
            run_kind="live",
            conductor="static-v1",
            classification="internal",
            domain="gsm8k",
            final_worker=name,
            status="succeeded",
            runs=10,
            cost_usd=Decimal("0.004") + Decimal("0.0004") * i,
            scored=10,
            score_sum=7.0 + 0.1 * (i % 3),
            scored_cost_usd=Decimal("0.004") + Decimal("0.0004") * i,
        )
    log_in("olga", Role.OPERATOR)
    page.goto("/analytics/")
    wait_until(page, "document.body.dataset.chartsReady === '1'")
    labels = [
        box
        for box in (t.bounding_box() for t in page.locator("#chart-pareto .scatterlayer text").all())
        if box and box["width"] > 0
    ]
    collisions = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :] if boxes_overlap(a, b)]
    assert not collisions, collisions
    legend = page.locator("#chart-pareto .legend")
    for name in names:
        expect(legend).to_contain_text(f"{name} (n=10)")
    expect(legend).to_contain_text("static-v1 (n=80)")
    ticks = page.locator("#chart-pareto .xtick text").all_text_contents()
    assert len(ticks) >= 2 and all(re.fullmatch(r"\$\d[\d,]*(\.\d+)?", t) for t in ticks), ticks
    values = [float(t[1:].replace(",", "")) for t in ticks]
    assert values == sorted(values) and len(set(values)) == len(values), ticks
    plot = page.locator("#chart-pareto .nsewdrag").first.bounding_box()
    assert plot and plot["height"] >= 235, plot  # the legend of ten names does not squeeze the plot
    screenshot("analytics-pareto-crowded")
