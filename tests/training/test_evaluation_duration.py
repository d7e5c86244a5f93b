"""An evaluation says how long it should take, as it says what it should cost: before it starts (the
preview and the API's dry run), and on its page and in the API while it runs, with the items done.
Each side's time per plan is the mean of its logged plans, else the documented default for its kind
(an LLM conductor: 60 s, the local model on a loaded CPU)."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from audit.models import AuditEvent
from routing import engine
from routing.models import ConductorVersion, Decision
from routing.services import conductor_active
from tests.openai_server import Reply
from training.durations import DEFAULT_PLAN_SECONDS
from training.models import Evaluation, EvaluationRun
from training.services import evaluation_estimate

pytestmark = pytest.mark.django_db(transaction=True)
API = "/api/training/evaluations/"
ITEMS = 6
LLM_DEFAULT = DEFAULT_PLAN_SECONDS[ConductorVersion.Backend.LLM]
STATIC_DEFAULT = DEFAULT_PLAN_SECONDS[ConductorVersion.Backend.STATIC]


@pytest.fixture
def llm(replay_pool, openai_server):
    return ConductorVersion.objects.create(
        name="llm-cand",
        backend=ConductorVersion.Backend.LLM,
        config={"model": "hosted_vllm/conductor", "api_base": openai_server.base_url},
    )


def plan_seconds(run_id: int) -> float:
    return sum(Decision.objects.filter(run_id=run_id, depth=0).values_list("latency_ms", flat=True)) / 1000


def test_the_estimate_before_the_start_says_how_long_it_takes(llm, api, page):
    baseline = conductor_active()
    assert baseline.backend == ConductorVersion.Backend.STATIC
    estimate = evaluation_estimate(candidate=llm, split="dev", limit=ITEMS)
    expected = ITEMS * (LLM_DEFAULT + STATIC_DEFAULT)
    assert estimate.duration is not None and estimate.duration.seconds == pytest.approx(expected)
    assert "It should take about 6 min, one run at a time" in estimate.message
    assert "llm-cand: 60 s a plan (the default for its kind, no plan of it logged yet)" in estimate.message

    response = api.post(API, {"candidate": llm.name, "limit": ITEMS, "dry_run": True}, format="json")
    assert response.status_code == 200, response.data
    found = response.data["expected_duration"]
    assert found["seconds"] == pytest.approx(expected, abs=0.1) and found["remaining_seconds"] is None
    assert [p["version"] for p in found["per_plan"]] == ["llm-cand", baseline.name]
    assert "It should take about 6 min" in response.data["message"]

    response = page.post(
        reverse("training:evaluate", args=[llm.pk]), {"split": "dev", "limit": str(ITEMS), "preview": "1"}
    )
    html = response.content.decode()
    preview = html[html.index('id="evaluate-preview"') :]
    assert "It should take about 6 min" in preview


def test_a_running_evaluation_shows_its_progress_and_the_time_left(llm, api, page, openai_server, broker):
    response = api.post(API, {"candidate": llm.name, "limit": ITEMS}, format="json")
    assert response.status_code == 201, response.data
    evaluation = Evaluation.objects.get(pk=response.data["id"])
    assert response.data["progress"] == {"items_done": 0, "items": ITEMS, "runs_done": 0, "runs": 2 * ITEMS}
    expected = ITEMS * (LLM_DEFAULT + STATIC_DEFAULT)
    assert response.data["expected_duration"]["remaining_seconds"] == pytest.approx(expected, abs=0.1)
    started = AuditEvent.objects.get(action="evaluation.started", object_id=str(evaluation.pk))
    assert started.payload["expected_seconds"] == pytest.approx(expected, abs=0.1)

    html = page.get(reverse("training:evaluation", args=[evaluation.pk])).content.decode()
    timing = html[html.index('id="evaluation-timing"') :]
    timing = timing[: timing.index("</p>")]
    assert "0 of 6 items done" in timing and "(0 of 12 runs)" in timing
    assert "It should take about 6 min" in timing and "about 6 min left" in timing

    # The first item, on both sides: the candidate's plan is asked of the loopback server, taking 0.3 s.
    links = EvaluationRun.objects.filter(evaluation=evaluation).order_by("id")
    first = links.first().item
    plan = {
        "thought": "t",
        "steps": [{"worker": "gpt-4o-2024-08-06", "instruction": "Answer.", "access": []}],
    }
    openai_server.program("conductor", [Reply(json.dumps(plan), delay_s=0.3)])
    ran = {link.side: link.run_id for link in links.filter(item=first)}
    for run_id in ran.values():
        engine.execute_run(run_id)
    candidate_s, baseline_s = plan_seconds(ran["candidate"]), plan_seconds(ran["baseline"])
    assert candidate_s >= 0.3

    body = api.get(f"{API}{evaluation.pk}/").data
    assert body["progress"] == {"items_done": 1, "items": ITEMS, "runs_done": 2, "runs": 2 * ITEMS}
    duration = body["expected_duration"]
    per_plan = {p["version"]: p for p in duration["per_plan"]}
    assert per_plan["llm-cand"]["logged_plans"] == 1
    assert per_plan["llm-cand"]["seconds"] == pytest.approx(candidate_s, abs=1e-3)
    assert duration["seconds"] == pytest.approx(ITEMS * (candidate_s + baseline_s), abs=0.1)
    assert duration["remaining_seconds"] == pytest.approx((ITEMS - 1) * (candidate_s + baseline_s), abs=0.1)

    html = page.get(reverse("training:evaluation", args=[evaluation.pk])).content.decode()
    timing = html[html.index('id="evaluation-timing"') :]
    timing = timing[: timing.index("</p>")]
    assert "1 of 6 items done" in timing and "(2 of 12 runs)" in timing
    assert "llm-cand: under a second a plan (the mean of its 1 logged plan)" in timing

    listed = api.get(API).data["results"][0]
    assert listed["progress"] is None and listed["expected_duration"] is None  # read one for them


def test_the_command_says_how_long_it_should_take(llm, broker):
    out = io.StringIO()
    call_command("evaluate_conductor", llm.name, "--limit", "2", stdout=out)
    said = out.getvalue()
    assert "queued: 4 runs. It should take about 2 min, one run at a time" in said, said
