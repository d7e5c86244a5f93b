"""The live workflow graph in a real browser, on the real ASGI stack.

daphne serves the project's ASGI application in its own process (HTTP and websockets); the engine
runs in a thread of this process and publishes to Redis after each commit; daphne forwards the
events to the page. Nothing reloads the page: what changes on screen comes over the websocket.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from playwright.sync_api import Page, expect

from accounts.models import Role
from audit.chain import run_chain
from audit.models import ChainHead
from routing import engine
from routing.models import Run, Task
from routing.services import TaskSubmission, task_submit
from tests.browser.conftest import SCREENSHOTS, wait_until
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE = "<img src=x onerror=window.__x=1>"
STEP_DELAY_S = 0.8
RUNNING = "#2456c7"  # the graph's colours, as in static/js/task_graph.js
SUCCEEDED = "#1d7a3e"

NODES = "#graph .scatterlayer .trace:last-child .point"
STEP_STATUSES = "() => Array.from(window.__conductorGraph.steps.values()).map((s) => s.status)"
NODE_COLORS = "() => { const d = document.getElementById('graph').data; return d ? d[2].marker.color : []; }"


def program_run(server) -> None:
    server.program(
        "conductor",
        [
            Reply(
                plan_json(
                    ("alpha", "Draft an answer: what is 6 * 7?", []),
                    ("beta", "Check the draft", [0]),
                    ("gamma", "Write the final answer", "all"),
                    thought="draft, check, finish",
                )
            )
        ],
    )
    server.program("alpha", [Reply("The draft says 42.", delay_s=STEP_DELAY_S)])
    server.program("beta", [Reply("The draft is right.", delay_s=STEP_DELAY_S)])
    server.program("gamma", [Reply(f"Final: 42 {HOSTILE}", delay_s=STEP_DELAY_S)])


def submit() -> Run:
    task, _ = task_submit(submission=TaskSubmission(text="What is 6 * 7?"), source=Task.Source.API)
    return task.runs.get()


class EngineThread(threading.Thread):
    """engine.execute_run in a thread of this process, as a Celery worker would run it."""

    def __init__(self, run_id: int):
        super().__init__(daemon=True)
        self.run_id = run_id
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            engine.execute_run(self.run_id)
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc
        finally:
            connections.close_all()

    def finish(self, timeout: float = 60) -> None:
        self.join(timeout)
        assert not self.is_alive(), "the engine did not finish"
        assert self.error is None, f"the engine raised {self.error!r}"


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"live-graph-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def click_node(page: Page, index: int, worker: str) -> None:
    """Click a node where a user would: Plotly's drag layer lies on top and turns the click into a
    plotly_click on the point under the pointer, once its hover label shows (as a user's would).
    The node is found again before each try: an open panel can resize the graph (Plotly redraws it
    responsively a moment later), and a click at the old place lands beside the node."""
    heading = page.locator("#node-panel h3")
    for _ in range(6):  # on a loaded machine Plotly can drop a click that lands while it redraws
        wait_until(page, "() => window.Live.settled()")  # no re-read on its way to redraw under the pointer
        box = page.locator(NODES).nth(index).bounding_box()
        assert box is not None
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x - 3, y - 3)
        page.mouse.move(x, y, steps=3)
        try:
            expect(page.locator("#graph .hoverlayer .hovertext")).to_contain_text(
                f"{worker} · ", timeout=3000
            )
        except AssertionError:
            continue  # the graph moved under the pointer: find the node again
        page.mouse.click(x, y)
        try:
            expect(heading).to_contain_text(f"· {worker}", timeout=3000)
            return
        except AssertionError:
            page.mouse.move(0, 0)
    raise AssertionError(f"clicking the {worker} node did not open its panel")


def open_graph(page: Page, run: Run) -> None:
    page.goto(f"/tasks/{run.task_id}/graph/")
    expect(page.locator("#live-state")).to_have_text("live")
    graph = page.locator("#graph")
    expect(graph).to_have_attribute("data-nodes", "0")
    expect(graph).to_have_attribute("data-run-status", "queued")
    # A mark that a page reload would wipe out, and a count of navigations.
    page.evaluate("window.__noReload = 1")


def assert_not_reloaded(page: Page, navigations: list[str]) -> None:
    assert page.evaluate("window.__noReload") == 1, "the page was reloaded"
    assert len(navigations) == 1, f"the page navigated: {navigations}"


def test_the_graph_fills_in_live_as_the_run_goes_and_shows_each_step_on_click(
    asgi_page: Page, asgi_log_in, live_pool
):
    page = asgi_page
    program_run(live_pool["server"])
    asgi_log_in("olga", Role.OPERATOR)
    run = submit()
    open_graph(page, run)
    navigations: list[str] = []
    page.on(
        "framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None
    )
    navigations.append(page.url)
    shot(page, "1-queued")

    worker = EngineThread(run.pk)
    worker.start()
    try:
        graph = page.locator("#graph")
        expect(graph).to_have_attribute("data-nodes", "3", timeout=20_000)
        # A node turns "running" on screen (blue), before the run is over.
        wait_until(page, f"() => ({NODE_COLORS})().includes('{RUNNING}')", timeout=20_000)
        assert "running" in page.evaluate(STEP_STATUSES)
        assert page.evaluate("document.getElementById('graph').dataset.runStatus") == "running"
        shot(page, "2-running")
        expect(graph).to_have_attribute("data-run-status", "succeeded", timeout=30_000)
    finally:
        worker.finish()

    assert page.evaluate(STEP_STATUSES) == ["succeeded"] * 3
    assert page.evaluate(NODE_COLORS) == [SUCCEEDED] * 3
    expect(page.locator("#live-state")).to_have_text("live")
    expect(page.locator("#run-status")).to_contain_text(f"Run {run.pk}: succeeded")
    assert_not_reloaded(page, navigations)
    state = page.evaluate(
        "({ n: window.__conductorGraph.latencies.length, seq: window.__conductorGraph.lastSeq })"
    )
    assert state["n"] > 0, "no live event reached the page"
    assert state["seq"] == ChainHead.objects.get(chain=run_chain(run.correlation_id)).seq
    shot(page, "3-succeeded")

    # Click the first node: its instruction, what it was shown, its answer.
    panel = page.locator("#node-panel")
    click_node(page, 0, "alpha")
    expect(panel.locator("h3")).to_have_text("Step 0 · alpha")
    expect(panel).to_contain_text("Draft an answer: what is 6 * 7?")
    expect(panel).to_contain_text("What it was shown")
    expect(panel.locator("pre.response")).to_have_text("The draft says 42.")
    shot(page, "4-node-alpha")

    # The last node saw both earlier answers; its own answer holds markup, shown as text.
    click_node(page, 2, "gamma")
    expect(panel.locator("h3")).to_have_text("Step 2 · gamma")
    expect(panel).to_contain_text("Write the final answer")
    shown = panel.locator("pre.shown")
    expect(shown.filter(has_text="The draft says 42.")).to_have_count(1)
    expect(shown.filter(has_text="The draft is right.")).to_have_count(1)
    expect(panel.locator("pre.response")).to_have_text(f"Final: 42 {HOSTILE}")
    assert panel.locator("img").count() == 0
    assert page.evaluate("typeof window.__x") == "undefined"
    # The selected node is outlined.
    widths = page.evaluate("() => document.getElementById('graph').data[2].marker.line.width")
    assert widths[2] > widths[0] and widths[2] > widths[1]
    assert_not_reloaded(page, navigations)
    shot(page, "5-node-gamma")

    # Two quick clicks are a double click to Plotly, whose default resets the axes to the first
    # draw's (an empty run's), which moved nodes away from under the pointer: the graph keeps its own.
    ranges = (
        "() => { const l = document.getElementById('graph').layout; return [l.xaxis.range, l.yaxis.range]; }"
    )
    before = page.evaluate(ranges)
    box = page.locator("#graph .nsewdrag").first.bounding_box()
    assert box is not None
    page.mouse.dblclick(box["x"] + 8, box["y"] + 8)
    page.wait_for_timeout(300)
    assert page.evaluate(ranges) == before
    click_node(page, 0, "alpha")


def test_a_dropped_websocket_reconnects_and_the_graph_catches_up_without_a_reload(
    asgi_page: Page, asgi_log_in, live_pool
):
    page = asgi_page
    program_run(live_pool["server"])
    asgi_log_in("olga", Role.OPERATOR)
    run = submit()
    open_graph(page, run)
    navigations: list[str] = [page.url]
    page.on(
        "framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None
    )

    worker = EngineThread(run.pk)
    worker.start()
    try:
        # The first step has finished (as the page knows it); drop the socket while the rest run.
        wait_until(
            page,
            "() => { const s = Array.from(window.__conductorGraph.steps.values()).find((s) => s.index === 0);"
            " return s && s.status === 'succeeded'; }",
            timeout=20_000,
        )
        page.evaluate(
            "window.__firstSocket = window.__conductorGraph.socket; window.__conductorGraph.socket.close()"
        )
        expect(page.locator("#live-state")).to_have_text("reconnecting…")
        shot(page, "6-reconnecting")
        assert worker.is_alive(), "the run ended before the socket was dropped; the test proves nothing"
        expect(page.locator("#live-state")).to_have_text("live", timeout=10_000)
        assert page.evaluate("window.__conductorGraph.socket !== window.__firstSocket")
        expect(page.locator("#graph")).to_have_attribute("data-run-status", "succeeded", timeout=30_000)
    finally:
        worker.finish()

    graph = page.locator("#graph")
    expect(graph).to_have_attribute("data-nodes", "3")
    assert page.evaluate(STEP_STATUSES) == ["succeeded"] * 3
    assert page.evaluate(NODE_COLORS) == [SUCCEEDED] * 3
    api = page.request.get(
        page.locator("#graph").get_attribute("data-api"), headers={"Accept": "application/json"}
    )
    assert api.ok
    final_seq = next(r for r in api.json()["runs"] if r["id"] == run.pk)["audit_seq"]
    assert final_seq == ChainHead.objects.get(chain=run_chain(run.correlation_id)).seq
    assert page.evaluate("window.__conductorGraph.lastSeq") == final_seq
    assert_not_reloaded(page, navigations)
    shot(page, "7-reconnected-succeeded")


def test_a_replay_task_fills_its_graph_live(asgi_page: Page, asgi_log_in, replay_pool, settings):
    """The offline pool end to end: a recorded MATH item, the static conductor's 3-step cross-check."""
    from routing import replay

    settings.CONDUCTOR_REPLAY_LATENCY_S = 0.8  # the engine runs in this process: slow enough to watch
    item = next(i for i in replay.read_items(replay.split_path("dev")) if i.domain == "math-l5")
    task, _ = task_submit(
        submission=TaskSubmission(
            text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
        ),
        source=Task.Source.API,
    )
    run = task.runs.get()
    page = asgi_page
    asgi_log_in("olga", Role.OPERATOR)
    open_graph(page, run)
    navigations: list[str] = [page.url]
    page.on(
        "framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None
    )

    worker = EngineThread(run.pk)
    worker.start()
    try:
        expect(page.locator("#graph")).to_have_attribute("data-nodes", "3", timeout=20_000)
        expect(page.locator("#graph")).to_have_attribute("data-run-status", "succeeded", timeout=30_000)
    finally:
        worker.finish()
    assert page.evaluate(STEP_STATUSES) == ["succeeded"] * 3
    click_node(page, 2, "gpt-4o-2024-08-06")
    expect(page.locator("#node-panel")).to_contain_text("Two solvers answered the problem below")
    assert_not_reloaded(page, navigations)
    shot(page, "8-replay-succeeded")
