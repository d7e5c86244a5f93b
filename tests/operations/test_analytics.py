"""Analytics over real runs of the replay pool: cost by worker, routing shares, accuracy vs cost."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest

from accounts.models import Role
from operations.analytics import figures
from routing import engine, replay
from routing.models import Run, Step, Task
from routing.services import TaskSubmission, task_submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def replay_runs(replay_pool):
    items = replay.read_items(replay.split_path("dev"))
    chosen = [i for i in items if i.domain == "gsm8k"][:3] + [i for i in items if i.domain == "math-l5"][:2]
    for item in chosen:
        task, _ = task_submit(
            submission=TaskSubmission(
                text=item.task, reference=item.reference, domain=item.domain, source_item=item.id
            ),
            source=Task.Source.CLI,
        )
        engine.execute_run(task.runs.get().pk)
    return chosen


def test_cost_routing_and_accuracy_add_up_to_the_runs(replay_runs):
    f = figures.default_filters()
    by_worker = figures.cost_over_time(f, by="worker")
    assert sum(r["cost_usd"] for r in by_worker) == sum(s.cost_usd for s in Step.objects.all())
    assert sum(r["steps"] for r in by_worker) == Step.objects.count() == 3 + 2 * 3

    shares = figures.routing_distribution(f)
    gsm = [r for r in shares if r["domain"] == "gsm8k"]
    assert gsm == [{"domain": "gsm8k", "worker": "gpt-4o-mini-2024-07-18", "steps": 3, "share": 1.0}]
    assert sum(r["share"] for r in shares if r["domain"] == "math-l5") == pytest.approx(1.0)

    conductors = figures.accuracy_vs_cost(f, by="conductor")
    runs = list(Run.objects.all())
    assert conductors[0]["name"] == "static-v1" and conductors[0]["runs"] == 5
    assert conductors[0]["accuracy"] == pytest.approx(sum(r.score for r in runs) / 5)
    assert conductors[0]["usd_per_1000"] == sum((r.cost_usd for r in runs), Decimal(0)) / 5 * 1000
    # a rollout of the same version (sampled at a temperature for training) is not live work
    rollout = Run.objects.create(
        task=runs[0].task, conductor_version=runs[0].conductor_version, kind="rollout"
    )
    engine.execute_run(rollout.pk)
    assert figures.accuracy_vs_cost(f, by="conductor") == conductors
    finals = {p["name"]: p for p in figures.accuracy_vs_cost(f, by="worker")}
    assert set(finals) == {"gpt-4o-mini-2024-07-18", "gpt-4o-2024-08-06"}
    assert finals["gpt-4o-mini-2024-07-18"]["pareto"]  # the cheapest point is never dominated


def test_pareto_marks_only_undominated_points():
    points = [
        {"name": "cheap-good", "accuracy": 0.8, "usd_per_1000": Decimal(1)},
        {"name": "dear-worse", "accuracy": 0.7, "usd_per_1000": Decimal(5)},
        {"name": "dear-best", "accuracy": 0.9, "usd_per_1000": Decimal(5)},
    ]
    figures.mark_pareto(points)
    assert [p["name"] for p in points if p["pareto"]] == ["cheap-good", "dear-best"]


def test_the_page_and_every_chart_csv(client, make_user, replay_runs):
    client.force_login(make_user("olga", Role.OPERATOR))
    page = client.get("/analytics/")
    assert page.status_code == 200 and b'id="analytics-data"' in page.content
    for chart in (
        "cost_by_worker",
        "cost_by_vendor",
        "cost_by_conductor",
        "accuracy_cost_workers",
        "accuracy_cost_conductors",
        "routing_by_domain",
    ):
        response = client.get("/analytics/", {"chart": chart})
        rows = list(csv.DictReader(io.StringIO(response.content.decode())))
        assert response.status_code == 200 and rows, chart
    filtered = client.get("/analytics/", {"chart": "cost_by_worker", "classification": "confidential"})
    assert filtered.content == b""  # nothing confidential was run
    unknown = client.get("/analytics/", {"chart": "nope"})
    assert unknown.status_code == 400 and b"chart" in unknown.content  # refused, with the reason
