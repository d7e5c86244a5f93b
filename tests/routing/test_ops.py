"""The live overview: counts, per-worker error rates and latency percentiles, and alerts."""

from __future__ import annotations

from decimal import Decimal

import pytest

from audit.models import Role
from routing import engine, ops
from routing.models import Task
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)


def run_task(server, replies_alpha, text="q"):
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", replies_alpha)
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)
    engine.execute_run(task.runs.get().pk)
    return task


def test_the_overview_counts_calls_errors_latency_and_alerts_on_error_rate(live_pool, settings):
    settings.OPS_ALERT_MIN_CALLS = 3
    server = live_pool["server"]
    for i in range(3):  # each: one 500, then a success -> alpha fails 3 of 6 calls
        run_task(
            server,
            [Reply(status=500), Reply("ok", delay_s=0.05 * (i + 1), prompt_tokens=1000, completion_tokens=0)],
            text=f"q{i}",
        )
    task_submit(submission=TaskSubmission(text="waiting"), source=Task.Source.API)  # queued, never run

    data = ops.overview(minutes=5)

    assert data["tasks"]["queued"] == 1 and data["tasks"]["running"] == 0
    alpha = next(w for w in data["workers"] if w["worker"] == "alpha")
    assert (alpha["calls"], alpha["errors"], alpha["in_flight"]) == (6, 3, 0)
    assert alpha["error_rate"] == pytest.approx(0.5)
    assert alpha["p95_ms"] >= alpha["p50_ms"] > 0
    assert alpha["cost"] == Decimal("0.003")  # 3 x 1000 input tokens at $1.00 per 1M
    assert data["spend_usd"] == Decimal("0.003")
    assert any("alpha: 50% of 6 calls failed" in a for a in data["alerts"])
    assert sum(row["runs"] for row in data["timeline"]) == 3


def test_the_overview_page_renders_for_every_role_and_escapes_worker_names(client, make_user, live_pool):
    run_task(live_pool["server"], [Reply("fine")])
    for role in (Role.AUDITOR, Role.OPERATOR, Role.ML_STAFF):
        client.force_login(make_user(f"u-{role}", role))
        page = client.get("/ops/")
        assert page.status_code == 200
        assert b"alpha" in page.content and b"Live overview" in page.content
        assert client.get("/ops/?partial=1").content.count(b"<html") == 0
    client.force_login(make_user("nobody"))
    assert client.get("/ops/").status_code == 403


def test_a_worker_row_is_marked_only_when_it_crosses_the_alert_threshold(live_pool, settings):
    settings.OPS_ALERT_MIN_CALLS = 2
    settings.OPS_ERROR_RATE_ALERT = 0.6  # alpha will fail 50% of its calls: under this threshold
    run_task(live_pool["server"], [Reply(status=500), Reply("ok")])

    alpha = next(w for w in ops.overview(minutes=5)["workers"] if w["worker"] == "alpha")

    assert alpha["error_rate"] == pytest.approx(0.5) and not alpha["alerting"]
    settings.OPS_ERROR_RATE_ALERT = 0.5
    assert next(w for w in ops.overview(minutes=5)["workers"] if w["worker"] == "alpha")["alerting"]
