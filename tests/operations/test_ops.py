"""The live overview: counts, per-worker error rates and latency percentiles, and alerts."""

from __future__ import annotations

import bisect
import html as html_lib
import json
import re
import socket
from decimal import Decimal

import pytest

from accounts.models import Role
from operations.overview import figures
from routing import engine, folds, presence
from routing.models import Attempt, OpsRollup, Run, StopReason, Task
from routing.services import TaskSubmission, task_submit
from tests.conftest import clear_queues, wait_for
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

    data = figures.overview(minutes=5)

    assert data["live"]["queued"] == 1 and data["live"]["running"] == 0
    alpha = next(w for w in data["workers"] if w["worker"] == "alpha")
    assert (alpha["calls"], alpha["errors"], alpha["in_flight"]) == (6, 3, 0)
    assert alpha["error_rate"] == pytest.approx(0.5)
    assert alpha["p95_ms"] >= alpha["p50_ms"] > 0
    assert alpha["cost"] == Decimal("0.003")  # 3 x 1000 input tokens at $1.00 per 1M
    assert data["spend_usd"] == Decimal("0.003")
    (alert,) = [a for a in data["alerts"] if "alpha: 50% of 6 calls failed" in a["text"]]
    assert alert["url"].startswith("/attempts/?worker=alpha&status=failed&since=")
    assert [(e["kind"], e["n"]) for e in alpha["errors_by_kind"]] == [("Provider error (5xx)", 3)]
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

    alpha = next(w for w in figures.overview(minutes=5)["workers"] if w["worker"] == "alpha")

    assert alpha["error_rate"] == pytest.approx(0.5) and not alpha["alerting"]
    settings.OPS_ERROR_RATE_ALERT = 0.5
    assert next(w for w in figures.overview(minutes=5)["workers"] if w["worker"] == "alpha")["alerting"]


def test_the_history_separates_live_traffic_and_shows_errors_latency_and_spend_per_bucket(live_pool):
    server = live_pool["server"]
    for i in range(2):  # each: a 429, then a success -> alpha fails 2 of 4 calls, all as rate_limited
        run_task(
            server, [Reply(status=429), Reply("ok", prompt_tokens=1000, completion_tokens=0)], text=f"q{i}"
        )
    rollout = run_task(server, [Reply("ok")], text="sampled").runs.get()
    Run.objects.filter(pk=rollout.pk).update(kind=Run.Kind.ROLLOUT)
    folds.rebuild()  # a row changed behind the engine's back: the rollups are recounted

    h = figures.history("hour")

    assert h["bucket_s"] == 60 and len(h["buckets"]) == 61
    assert sum(h["runs"]["live"]) == 2 and sum(h["runs"]["rollout"]) == 1
    attempts = Attempt.objects.all()
    assert sum(h["calls"]) == attempts.count()  # the conductor's plans are decisions, not attempts
    failed = attempts.filter(status=Attempt.Status.RATE_LIMITED).count()
    assert failed == 2
    rates = [(r, c) for r, c in zip(h["error_rate"]["rate_limited"], h["calls"], strict=True) if c]
    assert sum(r * c for r, c in rates) == pytest.approx(failed)
    assert set(h["error_rate"]) == {"rate_limited"}
    assert "alpha" in h["latency_ms"] and any(v is not None for v in h["latency_ms"]["alpha"]["p95"])
    spent = sum(a.cost_usd for a in attempts)
    assert set(h["spend_usd_per_min"]) == {"live", "rollout"}
    assert sum(map(sum, h["spend_usd_per_min"].values())) == pytest.approx(float(spent))  # one-minute buckets

    # A day and a week come from the rollups: the same runs, calls, errors and spend; latency
    # percentiles from a histogram, within the bucket that holds the exact one.
    for period, stride in (("day", 1800), ("week", 4 * 3600)):
        long = figures.history(period)
        assert long["bucket_s"] == stride
        assert sum(long["runs"]["live"]) == 2 and sum(long["runs"]["rollout"]) == 1
        assert sum(long["calls"]) == attempts.count()
        rates = [(r, c) for r, c in zip(long["error_rate"]["rate_limited"], long["calls"], strict=True) if c]
        assert sum(r * c for r, c in rates) == pytest.approx(failed)
        per_min = stride / 60
        assert sum(map(sum, long["spend_usd_per_min"].values())) * per_min == pytest.approx(float(spent))
        exact = sorted(a.latency_ms for a in attempts.filter(status="succeeded", step__worker_slug="alpha"))
        (p95,) = [v for v in long["latency_ms"]["alpha"]["p95"] if v is not None]
        bucket = bisect.bisect_right(folds.LATENCY_BOUNDS_MS, exact[-1])  # the slowest call's bucket
        low, high = folds.LATENCY_BOUNDS_MS[bucket - 1], folds.LATENCY_BOUNDS_MS[bucket]
        assert low <= p95 <= high, (exact, p95)
    # A week reads its 4-hour slots, not 48 half hours a day: both are kept, each adding up alone.
    assert sorted(OpsRollup.objects.values_list("span_min", flat=True).distinct()) == [30, 240]
    OpsRollup.objects.filter(span_min=30).delete()
    assert (
        sum(figures.history("week")["calls"]) == attempts.count()
        and sum(figures.history("day")["calls"]) == 0
    )


def test_the_queues_count_what_waits_and_the_overview_says_no_worker_is_alive(live_pool, make_user):
    from django.core.cache import cache
    from django.test import Client

    clear_queues()
    cache.delete("ops.workers_alive")
    for text in ("first", "second"):
        task_submit(submission=TaskSubmission(text=text), source=Task.Source.API)  # sent, never taken

    waiting = {q["queue"]: q["waiting"] for q in figures.queue_depths()}
    assert waiting["runs"] == 2
    assert waiting["resume"] == 0  # emptied (Redis drops the list): nothing waits, not "unknown"
    client = Client()
    client.force_login(make_user("olga", Role.OPERATOR))
    html = client.get("/ops/?partial=1").content.decode()
    assert '<td>runs</td><td class="num">2</td>' in html
    assert "No Celery worker answered a ping" in html
    assert 'id="ops-history-data"' in html
    assert client.get("/ops/?period=fortnight").status_code == 400


def test_from_a_workers_error_rate_to_its_failing_calls_and_their_error_text(client, make_user, live_pool):
    """The overview's worker row links to its failing calls, broken down by kind; the calls page lists
    them with the provider's error text, escaped, and says what it is filtered by."""
    hostile = "<img src=x onerror=alert(1)> upstream overloaded"
    body = json.dumps({"error": {"message": hostile, "type": "server_error"}}).encode()
    server = live_pool["server"]
    run_task(server, [Reply(status=500, raw_body=body), Reply(status=429), Reply("ok")], text="first")
    run_task(server, [Reply("ok")], text="second")
    client.force_login(make_user("olga", Role.OPERATOR))

    overview = client.get("/ops/?partial=1").content.decode()

    def link(status: str) -> str:  # the href the page shows, as a browser follows it
        (href,) = re.findall(
            rf'href="(/attempts/\?worker=alpha&amp;status={status}&amp;since=[^"]+)"', overview
        )
        return html_lib.unescape(href)

    alpha = next(w for w in figures.overview(minutes=5)["workers"] if w["worker"] == "alpha")
    assert {e["kind"] for e in alpha["errors_by_kind"]} == {"Provider error (5xx)", "Rate limited (429)"}
    alpha = {"failed_url": link("failed")}
    kinds = {
        "Rate limited (429)": {"url": link("rate_limited")},
        "Provider error (5xx)": {"url": link("server_error")},
    }

    failing = client.get(alpha["failed_url"])
    assert failing.status_code == 200
    html = failing.content.decode()
    rows = html.split('id="attempt-table"')[1].split("</table>")[0].split("<tr>")[2:]
    assert len(rows) == 2  # the 500 and the 429; none of the successes
    assert "&lt;img src=x onerror=alert(1)&gt; upstream overloaded" in html and "<img src=x" not in html
    assert (
        'id="filtered-by">Filtered by worker <strong>alpha</strong>, status <strong>failed</strong>' in html
    )

    only_429 = client.get(kinds["Rate limited (429)"]["url"]).content.decode()
    assert only_429.split('id="attempt-table"')[1].count("<tr>") == 2  # the header and one call
    everything = client.get("/attempts/").content.decode()
    assert everything.split('id="attempt-table"')[1].count("<tr>") == 1 + Attempt.objects.count()
    assert client.get("/attempts/?status=exploded").status_code == 400
    assert client.get("/attempts/?worker=nobody").status_code == 400
    backwards = client.get("/attempts/?since=2026-02-01&until=2026-01-01")  # a period that ends first
    assert backwards.status_code == 400 and b"before the start of the period" in backwards.content


def test_failed_runs_by_reason_lead_to_their_tasks(client, make_user, live_pool):
    server = live_pool["server"]
    blocked, _ = task_submit(  # no worker of the pool is cleared for confidential data
        submission=TaskSubmission(text="secret", classification="confidential"), source=Task.Source.API
    )
    engine.execute_run(blocked.runs.get().pk)
    server.program("conductor", [Reply("not a plan at all")] * 2)
    invalid, _ = task_submit(submission=TaskSubmission(text="garbled"), source=Task.Source.API)
    engine.execute_run(invalid.runs.get().pk)
    fine = run_task(server, [Reply("ok")], text="fine")
    assert {Run.objects.get(task=t).stop_reason for t in (blocked, invalid, fine)} == {
        StopReason.POLICY_BLOCKED,
        StopReason.INVALID_PLAN,
        "",
    }

    stops = {row["reason"]: row for row in figures.overview(minutes=15)["stops"]}
    assert {reason: row["n"] for reason, row in stops.items()} == {"invalid_plan": 1, "policy_blocked": 1}
    assert stops["policy_blocked"]["label"] == "Blocked by a data policy"

    client.force_login(make_user("olga", Role.OPERATOR))
    page = client.get("/ops/").content.decode()
    assert f'href="{html_lib.escape(stops["invalid_plan"]["url"])}"' in page
    listed = client.get(stops["policy_blocked"]["url"]).content.decode()
    assert (
        str(blocked.pk)[:8] in listed and str(invalid.pk)[:8] not in listed and str(fine.pk)[:8] not in listed
    )
    assert "failure <strong>Blocked by a data policy</strong>" in listed
    assert client.get("/?stop=no-such-reason").status_code == 400


def test_the_live_tiles_count_live_traffic_and_show_training_apart(client, make_user, live_pool):
    """Rollouts and evaluations (training's runs) neither run up the live tiles' spend nor their
    throughput: they are counted apart, and the history's spend is split the same way."""
    server = live_pool["server"]
    task = run_task(server, [Reply("ok", prompt_tokens=1000, completion_tokens=0)], text="live")
    live_run = task.runs.get()
    for _ in range(2):  # training's runs of the same item: rollouts, each a call of 3000 tokens
        server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
        server.program("alpha", [Reply("ok", prompt_tokens=3000, completion_tokens=0)])
        rollout = Run.objects.create(task=task, conductor_version=live_run.conductor_version, kind="rollout")
        engine.execute_run(rollout.pk)

    data = figures.overview(minutes=5)

    assert data["live"]["succeeded"] == 1 and data["throughput_per_min"] == pytest.approx(1 / 5)
    assert data["spend_usd"] == Decimal("0.001")  # the live call's 1000 tokens at $1.00 per 1M
    other = {row["group"]: row for row in data["other"]}
    assert list(other) == ["shadow", "rollout", "evaluation", "playground"]
    assert (other["rollout"]["runs"], other["rollout"]["spend_usd"]) == (2, Decimal("0.006"))
    assert (other["shadow"]["runs"], other["evaluation"]["runs"]) == (0, 0)
    assert sum(row["other_spend_usd"] for row in data["timeline"]) == Decimal("0.006")
    spend = figures.history("hour")["spend_usd_per_min"]
    assert sum(spend["live"]) == pytest.approx(0.001) and sum(spend["rollout"]) == pytest.approx(0.006)

    client.force_login(make_user("olga", Role.OPERATOR))
    html = client.get("/ops/?partial=1&minutes=5").content.decode()
    assert re.search(r'id="tile-spend">\$0\.0010<', html)
    assert "rollout: 2 runs · $0.0060" in html and "Live traffic: tasks' live runs" in html


def test_the_overview_pings_only_the_celery_workers_present_and_stops_when_they_answered(
    live_pool, celery_workers, monkeypatch
):
    """A ping waits out its whole timeout unless told how many answers to expect: every first load
    of the overview waited half a second for workers that were not there."""
    from celery import current_app
    from django.core.cache import cache

    pings: list[dict] = []
    ping = current_app.control.ping

    def recorded_ping(*args, **kwargs):  # the real ping, its arguments kept
        pings.append(kwargs)
        return ping(*args, **kwargs)

    monkeypatch.setattr(current_app.control, "ping", recorded_ping)
    cache.delete("ops.workers_alive")
    assert figures.workers_alive() == [] and pings == []  # no worker holds its presence: nobody to ask

    worker = celery_workers("w1")
    wait_for(lambda: presence.present(), what="the worker's presence lock")
    cache.delete("ops.workers_alive")
    assert figures.workers_alive() == [f"{worker.name}@{socket.gethostname()}"]
    assert pings == [{"timeout": 0.5, "limit": 1}]
