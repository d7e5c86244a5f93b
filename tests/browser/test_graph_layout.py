"""The workflow graph lays out the largest workflow the engine allows, legibly.

5 steps per level (routing.plans.MAX_STEPS) at depths 0, 1 and 2: the last step of the top plan and
of the first nested plan is the conductor, so the run has 13 worker steps and 2 conductor steps
(max_steps=15, max_depth=2). The engine runs in this process first; then the page (on daphne, as in
test_live_graph) draws the finished run, and the test measures what the browser rendered.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from django.db import connections
from playwright.sync_api import Page, expect

from accounts.models import Role
from routing import engine
from routing.models import Decision, Run, RunStatus, Step, Task
from routing.plans import MAX_STEPS
from routing.services import TaskSubmission, task_submit
from tests.browser.conftest import SCREENSHOTS
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

# Each level: (worker, instruction, access). Diamonds, fan-ins and an "all" step, so each level has
# several layers and layers with two or three steps stacked in them.
TOP = (
    ("alpha", "Draft a solution", []),
    ("beta", "Check the draft's arithmetic", [0]),
    ("gamma", "Check the draft's reasoning", [0]),
    ("alpha", "Merge the checks", [1, 2]),
    ("conductor", "Decide how to verify the merged answer", "all"),
)
MIDDLE = (
    ("alpha", "Solve it one way", []),
    ("beta", "Solve it another way", []),
    ("gamma", "Compare both solutions", [0, 1]),
    ("beta", "Summarise the comparison", [2]),
    ("conductor", "Plan a final review", [3]),
)
BOTTOM = (
    ("alpha", "Review the method", []),
    ("beta", "Review the numbers", []),
    ("gamma", "Review the wording", []),
    ("alpha", "Collect the reviews", [0, 1, 2]),
    ("gamma", "Write the final answer", "all"),
)
LEVELS = (TOP, MIDDLE, BOTTOM)

# What the browser rendered, in screen pixels, one entry per plotted node (in the trace's order).
MEASURE = """() => {
  const gd = document.getElementById('graph');
  const state = window.__conductorGraph;
  const steps = new Map(state.run.steps.map((s) => [s.id, s]));
  const box = (el) => { const r = el.getBoundingClientRect();
    return { left: r.left, right: r.right, top: r.top, bottom: r.bottom }; };
  const trace = gd.querySelector('.scatterlayer .trace:last-child');
  const points = Array.from(trace.querySelectorAll('.points .point'));
  const labels = Array.from(trace.querySelectorAll('.text .textpoint text'));
  const ids = gd.data[2].customdata;
  const g = gd.getBoundingClientRect();
  const s = gd._fullLayout._size;
  return {
    plot: { left: g.left + s.l, right: g.left + s.l + s.w, top: g.top + s.t, bottom: g.top + s.t + s.h },
    decisions: state.run.decisions.map((d) => ({ id: d.id, parent_step: d.parent_step, valid: d.valid })),
    nodes: points.map((p, i) => {
      const st = steps.get(ids[i]);
      return { id: st.id, decision: st.decision, depth: st.depth, index: st.index, access: st.access,
               worker: st.worker_slug, marker: box(p), label: labels[i] ? box(labels[i]) : null,
               text: labels[i] ? labels[i].textContent : null };
    }),
  };
}"""


def overlap(a: dict, b: dict, pad: float = 0.0) -> bool:
    return (
        a["left"] < b["right"] + pad
        and b["left"] < a["right"] + pad
        and a["top"] < b["bottom"] + pad
        and b["top"] < a["bottom"] + pad
    )


def inside(inner: dict, outer: dict) -> bool:
    return (
        inner["left"] >= outer["left"]
        and inner["right"] <= outer["right"]
        and inner["top"] >= outer["top"]
        and inner["bottom"] <= outer["bottom"]
    )


def centre(b: dict) -> tuple[float, float]:
    return (b["left"] + b["right"]) / 2, (b["top"] + b["bottom"]) / 2


def union(boxes: list[dict]) -> dict:
    return {
        "left": min(b["left"] for b in boxes),
        "right": max(b["right"] for b in boxes),
        "top": min(b["top"] for b in boxes),
        "bottom": max(b["bottom"] for b in boxes),
    }


def deps(node: dict) -> list[int]:
    return list(range(node["index"])) if node["access"] == "all" else list(node["access"])


def run_largest_workflow(server) -> Run:
    # The conductor is asked three times, one level after the other: top, depth 1, depth 2.
    server.program(
        "conductor", [Reply(plan_json(*level, thought=f"level {n}")) for n, level in enumerate(LEVELS)]
    )
    for slug in ("alpha", "beta", "gamma"):
        server.program(slug, [Reply(f"{slug} has answered")])
    task, _ = task_submit(
        submission=TaskSubmission(text="What is 6 * 7?", max_steps=15, max_depth=2), source=Task.Source.API
    )
    run = task.runs.get()
    # In a thread of its own, as a Celery worker would run it: Playwright's event loop is running in
    # this one, and the engine publishes its live events with async_to_sync.
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            engine.execute_run(run.pk)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=execute, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the engine did not finish"
    assert not errors, f"the engine raised {errors[0]!r}"
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.filter(run=run).count() == 3 * MAX_STEPS == 15
    assert sorted(Decision.objects.filter(run=run, valid=True).values_list("depth", flat=True)) == [0, 1, 2]
    assert Step.objects.filter(run=run, worker_slug="conductor").count() == 2
    return run


def test_the_largest_workflow_is_laid_out_without_overlaps(asgi_page: Page, asgi_log_in, live_pool):
    run = run_largest_workflow(live_pool["server"])
    page = asgi_page
    asgi_log_in("olga", Role.OPERATOR)
    page.goto(f"/tasks/{run.task_id}/graph/")
    expect(page.locator("#live-state")).to_have_text("live")
    graph = page.locator("#graph")
    expect(graph).to_have_attribute("data-run-status", "succeeded")
    expect(graph).to_have_attribute("data-nodes", "15")
    expect(page.locator("#graph .scatterlayer .trace:last-child .point")).to_have_count(15)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "graph-5x3.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0

    m = page.evaluate(MEASURE)
    nodes = m["nodes"]
    plot = m["plot"]

    # All 15 steps are drawn, each once, with its label.
    assert len(nodes) == 15
    assert len({n["id"] for n in nodes}) == 15
    assert sorted(n["depth"] for n in nodes) == [0] * 5 + [1] * 5 + [2] * 5
    assert all(n["label"] is not None for n in nodes)
    for n in nodes:
        assert n["text"] == (f"{n['depth']}." if n["depth"] else "") + f"{n['index']} {n['worker']}"

    # Markers and labels lie inside the plot area: nothing is clipped.
    for n in nodes:
        assert inside(n["marker"], plot), f"node {n['text']} sticks out of the plot: {n['marker']} {plot}"
        assert inside(n["label"], plot), f"label {n['text']} sticks out of the plot: {n['label']} {plot}"

    # No two markers overlap, no two labels overlap, and no label lies on another node's marker.
    for a, b in itertools.combinations(nodes, 2):
        assert not overlap(a["marker"], b["marker"]), f"markers {a['text']} and {b['text']} overlap"
        assert not overlap(a["label"], b["label"]), f"labels {a['text']} and {b['text']} overlap"
        assert not overlap(a["label"], b["marker"]), f"label {a['text']} lies on node {b['text']}"
        assert not overlap(b["label"], a["marker"]), f"label {b['text']} lies on node {a['text']}"

    # Each level's band (its markers and labels) is apart from every other level's band, top to bottom.
    bands = {
        d: union([b for n in nodes if n["depth"] == d for b in (n["marker"], n["label"])]) for d in (0, 1, 2)
    }
    assert bands[0]["bottom"] < bands[1]["top"], f"levels 0 and 1 overlap: {bands}"
    assert bands[1]["bottom"] < bands[2]["top"], f"levels 1 and 2 overlap: {bands}"

    # Every nested step hangs below the conductor step that produced its plan.
    by_id = {n["id"]: n for n in nodes}
    parents = {d["id"]: d["parent_step"] for d in m["decisions"] if d["valid"]}
    nested = [n for n in nodes if parents[n["decision"]] is not None]
    assert len(nested) == 10
    for n in nested:
        conductor = by_id[parents[n["decision"]]]
        assert conductor["worker"] == "conductor" and conductor["depth"] == n["depth"] - 1
        assert n["marker"]["top"] > conductor["label"]["bottom"], (
            f"{n['text']} is not below its conductor {conductor['text']}"
        )

    # Within a level, a step is to the right of every earlier step it may see.
    for n in nodes:
        level = {o["index"]: o for o in nodes if o["decision"] == n["decision"]}
        for d in deps(n):
            seen = level[d]
            assert n["marker"]["left"] > seen["marker"]["right"], (
                f"{n['text']} is not to the right of {seen['text']}, which it sees"
            )
