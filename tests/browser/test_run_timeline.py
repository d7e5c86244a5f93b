"""A run's timeline beside its graph, in a real browser, on a run the real engine made: the plan, each
step's span, its attempts on it (a 429 then a success: the retry and the wait show), two steps that
ran side by side overlapping in time, and the graph's legend of status colours."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections
from playwright.sync_api import Page, expect

from accounts.models import Role
from routing import engine
from routing.models import Run, Task
from routing.services import TaskSubmission, task_submit
from tests.browser.conftest import SCREENSHOTS, wait_until
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_ERROR = "<img src=x onerror=window.__x=1> slow down"


def execute(run_id: int) -> None:
    try:
        engine.execute_run(run_id)
    finally:
        connections.close_all()


# What the timeline drew: one entry per bar, from Plotly's own data.
BARS = """() => {
  const gd = document.getElementById('timeline');
  const labels = gd.layout.yaxis.ticktext;
  return gd.data.flatMap((t) => t.y.map((y, i) => ({ trace: t.name, row: labels[y].trim(), start: t.base[i],
    end: t.base[i] + t.x[i], hover: t.hovertext[i] })));
}"""


def test_the_timeline_shows_planning_steps_side_by_side_and_a_retried_attempt(
    asgi_page: Page, asgi_log_in, live_pool, settings
):
    settings.CONDUCTOR_RETRY_BACKOFF_S = 0.3
    server = live_pool["server"]
    server.program(
        "conductor",
        [
            Reply(
                plan_json(
                    ("alpha", "Solve it", []), ("beta", "Solve it too", []), ("gamma", "Pick one", "all")
                )
            )
        ],
    )
    server.program(
        "alpha",
        [
            Reply(
                status=429,
                raw_body=json.dumps({"error": {"message": HOSTILE_ERROR, "type": "rate_limit"}}).encode(),
            ),
            Reply("42", delay_s=0.6),
        ],
    )
    server.program("beta", [Reply("42", delay_s=1.2)])
    server.program("gamma", [Reply("42")])
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    run = task.runs.get()
    worker = threading.Thread(target=execute, args=(run.pk,))  # in a thread, as a Celery worker would
    worker.start()
    worker.join(60)
    assert Run.objects.get(pk=run.pk).status == "succeeded"

    page = asgi_page
    asgi_log_in("olga", Role.OPERATOR)
    page.goto(f"/tasks/{task.pk}/graph/")
    expect(page.locator("#timeline")).to_have_attribute("data-rows", "5")  # run, plan, three steps
    expect(page.locator("#timeline")).to_have_attribute("data-attempts", "4")
    wait_until(page, "document.querySelectorAll('#timeline .bars .point').length > 0")
    bars = page.evaluate(BARS)

    def bar(trace: str, row: str) -> list[dict]:
        return [b for b in bars if b["trace"] == trace and b["row"] == row]

    assert len(bar("planning", "plan")) == 1
    (alpha,) = bar("step succeeded", "0 alpha")
    (beta,) = bar("step succeeded", "1 beta")
    (gamma,) = bar("step succeeded", "2 gamma")
    # alpha and beta ran side by side; gamma, which sees both, after both.
    assert alpha["start"] < beta["end"] and beta["start"] < alpha["end"]
    assert gamma["start"] >= max(alpha["end"], beta["end"]) - 0.01
    # alpha's two attempts lie on its span, the rate-limited one first, the backoff's wait between.
    (failed,) = bar("attempt rate limited", "0 alpha")
    (succeeded,) = bar("attempt succeeded", "0 alpha")
    assert (
        alpha["start"] - 0.01 <= failed["start"] < failed["end"] <= succeeded["start"] <= alpha["end"] + 0.01
    )
    assert "HTTP 429" in failed["hover"]
    # A provider's error text is shown as text: Plotly gets it as entities, nothing is parsed.
    assert "&lt;img" in failed["hover"]
    page.locator("#timeline").scroll_into_view_if_needed()
    assert page.locator("#timeline img").count() == 0
    assert page.evaluate("typeof window.__x") == "undefined"

    expect(page.locator("#timeline .xtitle")).to_have_text("seconds since the run started")
    legend = page.locator("#graph-legend li")
    expect(legend).to_have_text(["pending", "running", "succeeded", "failed", "skipped"])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "run-timeline.png"), full_page=True)
