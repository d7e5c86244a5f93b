"""The evaluation that decides a promotion: paired deltas with bootstrap intervals on runs the real
engine made, per domain, the items won and lost linked to both runs, and a promotion that states
the deltas, is confirmed, and keeps them in its audit event."""

from __future__ import annotations

import statistics
from decimal import Decimal

import pytest
from django.template import Context, Template
from django.test import Client
from django.urls import reverse

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion, Run
from training.models import EvaluationRun
from training.policy import Policy, Workflow
from training.services import conductor_promote, evaluation_comparison, evaluation_refresh, evaluation_start
from training.services.evaluations import bootstrap_interval

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
ITEMS = 16


def policy(tmp_path, name: str, worker: str) -> ConductorVersion:
    path = tmp_path / f"{name}.json"
    path.write_text(Policy.new([Workflow("single", (worker,))]).to_json())
    return ConductorVersion.objects.create(name=name, backend="learned", config={"policy_path": str(path)})


@pytest.fixture
def finished(replay_pool, tmp_path):
    """gpt-4o (candidate) against gemma-2-9b (active) on 16 dev items, every run made by the engine."""
    baseline = policy(tmp_path, "cheap", "gemma-2-9b-it")
    conductor_promote(version=baseline, actor=ACTOR)
    candidate = policy(tmp_path, "strong", "gpt-4o-2024-08-06")
    evaluation = evaluation_start(candidate=candidate, split="dev", limit=ITEMS, actor=ACTOR)
    for link in EvaluationRun.objects.filter(evaluation=evaluation):
        engine.execute_run(link.run_id)
    return evaluation_refresh(evaluation)


def side_runs(evaluation, side: str) -> dict[str, Run]:
    return {
        link.item: link.run
        for link in EvaluationRun.objects.filter(evaluation=evaluation, side=side).select_related("run")
    }


def test_the_deltas_are_paired_over_items_with_intervals_around_them(finished):
    comparison = evaluation_comparison(finished)
    candidate, baseline = side_runs(finished, "candidate"), side_runs(finished, "baseline")
    assert comparison.items == len(comparison.pairs) == ITEMS

    differences = [(candidate[i].score or 0) - (baseline[i].score or 0) for i in candidate]
    accuracy = comparison.accuracy
    assert accuracy.delta == pytest.approx(statistics.fmean(differences), abs=1e-4)
    assert accuracy.candidate == pytest.approx(finished.results["candidate"]["accuracy"], abs=1e-4)
    assert accuracy.low <= accuracy.delta <= accuracy.high

    cost = comparison.usd_per_1000
    expected = sum(candidate[i].cost_usd - baseline[i].cost_usd for i in candidate) / ITEMS * 1000
    assert isinstance(cost.delta, Decimal) and cost.delta == expected.quantize(Decimal("0.0001"))
    # gpt-4o costs more than gemma-2-9b on every item: the interval leaves zero out, above it
    assert cost.low > 0 and cost.verdict == "higher"

    won = {p.item for p in comparison.won}
    lost = {p.item for p in comparison.lost}
    assert won == {i for i in candidate if (candidate[i].score or 0) > (baseline[i].score or 0)}
    assert lost == {i for i in candidate if (candidate[i].score or 0) < (baseline[i].score or 0)}
    assert len(won) + len(lost) + comparison.ties == ITEMS

    domains = {d["domain"]: d for d in comparison.domains}
    assert sum(d["n"] for d in domains.values()) == ITEMS
    assert set(domains) == {candidate[i].task.domain for i in candidate}
    assert sum(d["won"] for d in domains.values()) == len(won)


def test_the_bootstrap_interval_is_reproducible_and_narrows_to_a_constant_difference():
    assert bootstrap_interval([0.5], seed=1) is None
    assert bootstrap_interval([0.25] * 10, seed=1) == pytest.approx((0.25, 0.25))
    mixed = [1.0, 0.0, -1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    low, high = bootstrap_interval(mixed, seed=3)
    assert (low, high) == bootstrap_interval(mixed, seed=3)
    assert low < statistics.fmean(mixed) < high and low >= -1 and high <= 1


def test_the_page_states_the_deltas_links_both_runs_and_promotes_only_once_confirmed(finished, make_user):
    ml = Client()
    ml.force_login(make_user("mira", Role.ML_STAFF))
    url = reverse("training:evaluation", args=[finished.pk])
    page = ml.get(url).content.decode()
    comparison = evaluation_comparison(finished)
    assert 'id="evaluation-deltas"' in page and 'id="promote-form"' in page
    assert f"won {len(comparison.won)}, lost {len(comparison.lost)} of {ITEMS} items" in page
    for pair in (comparison.won + comparison.lost)[:3]:
        task = reverse("routing:task-detail", args=[pair.task_id])
        assert f'href="{task}#run-{pair.candidate_run}"' in page
        assert f'href="{task}#run-{pair.baseline_run}"' in page

    promote = reverse("training:promote", args=[finished.candidate.pk])
    refused = ml.post(promote, {"evaluation": finished.pk}, follow=True)
    assert "confirm the deltas first" in refused.content.decode()
    assert not ConductorVersion.objects.get(pk=finished.candidate.pk).is_active

    done = ml.post(promote, {"evaluation": finished.pk, "confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == url
    assert ConductorVersion.objects.get(pk=finished.candidate.pk).is_active
    event = AuditEvent.objects.filter(action="conductor.promoted").latest("id")
    evidence = event.payload["evidence"]
    assert evidence["evaluation"] == finished.pk and evidence["pairs"] == ITEMS
    assert Decimal(evidence["usd_per_1000"]["delta"]) == comparison.usd_per_1000.delta
    assert float(evidence["accuracy"]["delta"]) == comparison.accuracy.delta

    auditor = Client()
    auditor.force_login(make_user("ada", Role.AUDITOR))
    seen = auditor.get(url).content.decode()
    assert 'id="evaluation-deltas"' in seen and 'id="promote-form"' not in seen
    assert auditor.post(promote, {"evaluation": finished.pk, "confirm": "yes"}).status_code == 403


def test_a_promotion_from_an_evaluation_of_another_version_is_refused(finished, make_user, tmp_path):
    other = policy(tmp_path, "other", "gpt-4o-2024-08-06")
    ml = Client()
    ml.force_login(make_user("mira", Role.ML_STAFF))
    response = ml.post(
        reverse("training:promote", args=[other.pk]), {"evaluation": finished.pk, "confirm": "yes"}
    )
    assert response.status_code == 404
    assert not ConductorVersion.objects.get(pk=other.pk).is_active


@pytest.mark.parametrize(
    ("value", "places", "shown"),
    [
        (0.05, 3, "+0.050"),
        (-0.0123, 3, "\u22120.012"),
        (0.0, 3, "0.000"),
        (-0.00001, 3, "0.000"),
        (None, 3, "—"),
    ],
)
def test_signed_differences(value, places, shown):
    rendered = Template("{% load display %}{{ v|signed:p }}").render(Context({"v": value, "p": places}))
    assert rendered == shown
