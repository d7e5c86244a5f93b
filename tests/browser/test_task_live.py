"""The task page follows its run live, in a real Chromium, on the real ASGI stack.

daphne serves the project's ASGI application in its own process; the run is executed by a real
Celery worker process (or, where the test needs to time things, by the engine in a thread of this
process), which publishes to the embedded Redis after each commit; daphne forwards the events to the
page, which re-reads itself. Nothing reloads the page. The embedded Redis is a Unix socket: with the
channel layer's socket timeout shorter than its blocking pop, the websocket dropped every ~5-7 s.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from accounts.models import Role
from routing import live_events
from routing.models import Run, RunStatus, Step, StepStatus, Task
from routing.services import TaskSubmission, task_submit
from tests.browser.conftest import SCREENSHOTS
from tests.browser.test_live_graph import EngineThread
from tests.conftest import wait_for
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "<img src=x onerror=window.__x=1>"
TASK_URL = re.compile(r"/tasks/(?P<id>[0-9a-f-]{36})/$")
STEP_DELAY_S = 1.0
# Every text the live badge showed, in order (a MutationObserver set up before anything happens).
WATCH_BADGE = """(selector) => {
  const badge = document.querySelector(selector);
  window.__badgeTexts = [badge.textContent];
  new MutationObserver(() => window.__badgeTexts.push(badge.textContent))
    .observe(badge, { childList: true, characterData: true, subtree: true });
}"""


def program_run(server, delay_s: float = STEP_DELAY_S) -> None:
    server.program(
        "conductor",
        [Reply(plan_json(("alpha", "Draft an answer", []), ("gamma", "Write the final answer", "all")))],
    )
    server.program(
        "alpha", [Reply("The draft says 42.", delay_s=delay_s, prompt_tokens=100, completion_tokens=20)]
    )
    server.program(
        "gamma", [Reply(f"Final: 42 {HOSTILE}", delay_s=delay_s, prompt_tokens=200, completion_tokens=4)]
    )


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"task-live-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def watch_navigations(page: Page) -> list[str]:
    """A mark a reload would wipe out, and every navigation of the main frame from now on."""
    page.evaluate("window.__noReload = 1")
    navigations = [page.url]
    page.on(
        "framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None
    )
    return navigations


def assert_not_reloaded(page: Page, navigations: list[str]) -> None:
    assert page.evaluate("window.__noReload") == 1, "the page was reloaded"
    assert len(navigations) == 1, f"the page navigated: {navigations}"


def test_a_submitted_task_page_follows_its_run_to_the_end_without_a_reload(
    asgi_page: Page, asgi_log_in, live_pool, celery_workers
):
    page = asgi_page
    program_run(live_pool["server"])
    asgi_log_in("olga", Role.OPERATOR)

    # Submit through the form: it lands on the task's page, queued (no worker is up yet).
    page.get_by_role("navigation").get_by_role("link", name="Submit").click()
    page.get_by_label("Task:", exact=True).fill("What is 6 * 7?")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(TASK_URL)
    task = Task.objects.get(pk=TASK_URL.search(page.url)["id"])
    status = page.locator(".heading .status")  # the task's status badge, as before this page went live
    expect(status).to_have_text("Queued")
    navigations = watch_navigations(page)
    expect(page.locator("tr.step-row")).to_have_count(0)
    shot(page, "1-queued")

    celery_workers("w1")  # the queued run is picked up now, by a real worker process

    # Running, with its plan and its first step on screen, before the run is over.
    expect(status).to_have_text("Running", timeout=60_000)
    rows = page.locator("tr.step-row")
    expect(rows).to_have_count(2, timeout=30_000)
    if Run.objects.get(task=task).status == RunStatus.SUCCEEDED:
        pytest.fail("the run ended before the page showed it running; the test proves nothing")
    # What the reader opens stays open while the page updates under it.
    first_step = Step.objects.get(run__task=task, index=0, depth=0)
    opened = page.locator(f"details[data-key='step-{first_step.pk}']")
    opened.locator("summary").click()
    expect(opened).to_have_attribute("open", "")
    shot(page, "2-running")

    expect(status).to_have_text("Succeeded", timeout=60_000)
    task.refresh_from_db()
    run = task.runs.get()
    assert task.status == RunStatus.SUCCEEDED and run.status == RunStatus.SUCCEEDED, run.error
    expect(status).to_have_class(re.compile(r"\bstatus-succeeded\b"))
    expect(page.locator("#final-answer")).to_have_text(f"Final: 42 {HOSTILE}")
    expect(page.locator("dl.facts")).to_contain_text(f"${task.cost_usd:.6f}")
    expect(page.locator(f"#run-{run.pk}")).to_contain_text(f"${run.cost_usd:.6f}")
    for i in range(2):
        expect(rows.nth(i).locator("td").nth(4)).to_have_text("Succeeded")
    assert all(
        s == StepStatus.SUCCEEDED for s in Step.objects.filter(run=run).values_list("status", flat=True)
    )
    expect(opened).to_have_attribute("open", "")
    # The worker's markup is text: nothing of it was parsed or ran.
    assert page.locator("main img").count() == 0
    assert page.evaluate("typeof window.__x") == "undefined"
    # Finished: the live badge says so and the socket is closed; it never dropped meanwhile (one
    # socket opened, over the worker's start-up and the whole run).
    expect(page.locator("#task-live")).to_have_text("finished")
    live_state = page.evaluate(
        "({ closed: window.__conductorTaskLive.socket.readyState === WebSocket.CLOSED,"
        " opens: window.__conductorTaskLive.opens, events: window.__conductorTaskLive.events })"
    )
    assert live_state["closed"], live_state
    assert live_state["opens"] == 1, f"the websocket dropped during the run: {live_state}"
    assert live_state["events"] > 0, "no live event reached the page"
    assert_not_reloaded(page, navigations)
    shot(page, "3-succeeded")


def test_a_dropped_socket_reconnects_and_the_task_page_catches_up(asgi_page: Page, asgi_log_in, live_pool):
    page = asgi_page
    program_run(live_pool["server"], delay_s=1.5)
    asgi_log_in("olga", Role.OPERATOR)
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    run = task.runs.get()
    page.goto(f"/tasks/{task.pk}/")
    expect(page.locator("#task-live")).to_have_text("live")
    navigations = watch_navigations(page)

    worker = EngineThread(run.pk)
    worker.start()
    try:
        expect(page.locator("tr.step-row")).to_have_count(2, timeout=30_000)
        page.evaluate(
            "window.__firstSocket = window.__conductorTaskLive.socket; window.__firstSocket.close()"
        )
        expect(page.locator("#task-live")).to_have_text("reconnecting…")
        assert worker.is_alive(), "the run ended before the socket was dropped; the test proves nothing"
        expect(page.locator("#task-status")).to_have_text("Succeeded", timeout=30_000)
    finally:
        worker.finish()
    assert page.evaluate("window.__conductorTaskLive.socket !== window.__firstSocket")
    expect(page.locator("#final-answer")).to_have_text(f"Final: 42 {HOSTILE}")
    expect(page.locator("#task-live")).to_have_text("finished")
    assert_not_reloaded(page, navigations)


def test_a_finished_task_page_does_not_connect(asgi_page: Page, asgi_log_in, live_pool):
    page = asgi_page
    program_run(live_pool["server"], delay_s=0)
    asgi_log_in("ann", Role.AUDITOR)
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    worker = EngineThread(task.runs.get().pk)
    worker.start()
    worker.finish()
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.goto(f"/tasks/{task.pk}/")
    expect(page.locator("#task-status")).to_have_text("Succeeded")
    expect(page.locator("#task-live")).to_have_count(0)
    assert page.locator("script[src*='task_live']").count() == 0
    page.wait_for_timeout(500)
    assert sockets == []


def test_an_idle_live_page_keeps_its_websocket(asgi_page: Page, asgi_log_in, daphne_server):
    """No run going on: nothing is sent for longer than the channel layer's blocking pop. The socket
    must stay up (a read timeout shorter than the pop would drop it every few seconds, with a
    TimeoutError in daphne's log)."""
    page = asgi_page
    asgi_log_in("olga", Role.OPERATOR)
    task, _ = task_submit(submission=TaskSubmission(text="Nobody runs me"), source=Task.Source.API)
    page.goto(f"/tasks/{task.pk}/graph/")
    expect(page.locator("#live-state")).to_have_text("live")
    page.evaluate(WATCH_BADGE, "#live-state")
    started = time.monotonic()
    page.wait_for_timeout(12_000)
    assert time.monotonic() - started >= 12
    texts = page.evaluate("window.__badgeTexts")
    assert texts == ["live"], f"the graph page's websocket dropped while idle: {texts}"
    assert "TimeoutError" not in daphne_server.log()
    # And it still delivers: an event published now reaches the page (sent by the process's
    # publisher thread, as a worker's are).
    event = {"run": task.runs.get().pk, "seq": 99, "action": "test.ping"}
    live_events.publish(task_id=task.pk, event=event)
    assert live_events.flush()
    wait_for(
        lambda: page.evaluate("window.__conductorGraph.latencies.length") > 0, timeout=10, what="the event"
    )
