"""How many runs one training request may start (training/quotas.py): the runs per request, an
evaluation's limit against its split, the user's queued offline runs, and the estimate shown before
starting. The form, the API and the service refuse alike with the same message, and a refused start
writes nothing."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.urls import reverse

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor
from routing.models import ConductorVersion, Run, RunStatus, Task
from routing.services import conductor_active
from training import quotas, services
from training.models import Evaluation, EvaluationRun, Rollout, RolloutBatch

pytestmark = pytest.mark.django_db

API = "/api/training/"
ACTOR = Actor.service("tests")


@pytest.fixture
def candidate() -> ConductorVersion:
    baseline = conductor_active()
    return ConductorVersion.objects.create(name="static-v2", backend="static", config=baseline.config)


def rows() -> dict[str, int]:
    """What a start creates; a refusal leaves every count as it was."""
    return {
        "batches": RolloutBatch.objects.count(),
        "rollouts": Rollout.objects.count(),
        "evaluations": Evaluation.objects.count(),
        "evaluation_runs": EvaluationRun.objects.count(),
        "runs": Run.objects.count(),
        "tasks": Task.objects.count(),
        "events": AuditEvent.objects.count(),
    }


def refusal(check, *args) -> str:
    with pytest.raises(quotas.ValidationError) as caught:
        check(*args)
    return " ".join(caught.value.messages)


def rollout_form(version: ConductorVersion, **values) -> dict[str, str]:
    data = {"version": version.pk, "split": "train", "domain": "", "limit": "3", "k": "2", "temperature": "1"}
    return {f"rollouts-{key}": str(value) for key, value in {**data, **values}.items()}


def finished_runs(version: ConductorVersion, costs: list[str]) -> None:
    """Runs of `version` that ended (succeeded), with these costs: what the estimate reads."""
    task = Task.objects.create(text="What is 2 + 2?", reference="4", max_steps=5, max_depth=1, max_usd=1)
    for cost in costs:
        Run.objects.create(
            task=task, conductor_version=version, status=RunStatus.SUCCEEDED, cost_usd=Decimal(cost)
        )


# --- runs per request ----------------------------------------------------------------------------


def test_rollouts_above_the_runs_per_request_are_refused_by_the_form_the_api_and_the_service(page, api):
    version = conductor_active()
    assert quotas.MAX_RUNS_PER_REQUEST == 2000
    # The whole train split (1,472 items) x K=64 was 94,208 runs from one request.
    message = refusal(quotas.rollout_runs_check, 32, 64)
    assert message == (
        "This request would start 2,048 runs (32 items x K=64); at most 2,000 runs per request. "
        "Ask for fewer items (or a smaller K)."
    )
    items = services.replay_item_ids("train", 32)
    before = rows()

    with pytest.raises(services.TrainingError) as caught:
        services.rollouts_start(version=version, items=items, k=64, temperature=1.0, actor=ACTOR)
    assert str(caught.value) == message

    response = page.post(reverse("training:rollouts-start"), rollout_form(version, limit=32, k=64))
    assert response.status_code == 200
    assert list(response.context["rollouts_form"].non_field_errors()) == [message]

    by_split = api.post(API + "rollouts/", {"version": version.name, "limit": 32, "k": 64}, format="json")
    by_items = api.post(API + "rollouts/", {"version": version.name, "items": items, "k": 64}, format="json")
    for response in (by_split, by_items):
        assert response.status_code == 400
        assert response.data["errors"] == {"non_field_errors": [message]}
    assert rows() == before

    # 31 items x K=64 = 1,984 runs are within the limit.
    assert quotas.rollout_runs_check(31, 64) == 1984


def test_an_evaluation_above_the_runs_per_request_is_refused_by_the_form_the_api_and_the_service(
    page, api, candidate
):
    message = refusal(quotas.evaluation_runs_check, 3279)
    assert message.startswith("This request would start 6,558 runs (3,279 items x 2 sides); at most 2,000")
    before = rows()

    with pytest.raises(services.TrainingError) as caught:
        services.evaluation_start(candidate=candidate, split="dev", limit=3279, actor=ACTOR)
    assert str(caught.value) == message
    response = page.post(
        reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": "3279"}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == [f"Not evaluated: {message}"]
    response = api.post(API + "evaluations/", {"candidate": candidate.name, "limit": 3279}, format="json")
    assert response.status_code == 400 and response.data["errors"] == {"non_field_errors": [message]}
    assert rows() == before


# --- an evaluation's limit against its split -------------------------------------------------------


def test_an_evaluation_limit_above_the_split_is_refused_with_the_split_size_not_capped(page, api, candidate):
    size = len(services.replay_item_ids("dev"))
    assert size == 567 and (size + 1) * 2 <= quotas.MAX_RUNS_PER_REQUEST
    message = f"The dev split has 567 items; an evaluation limit of {size + 1} is more than that. Ask for at most 567."
    before = rows()

    with pytest.raises(services.TrainingError) as caught:
        services.evaluation_start(candidate=candidate, split="dev", limit=size + 1, actor=ACTOR)
    assert str(caught.value) == message
    with pytest.raises(services.TrainingError):
        services.evaluation_estimate(candidate=candidate, split="dev", limit=size + 1)
    response = page.post(
        reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": size + 1}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == [f"Not evaluated: {message}"]
    response = api.post(API + "evaluations/", {"candidate": candidate.name, "limit": size + 1}, format="json")
    assert response.status_code == 400 and response.data == {"detail": message}
    dry = api.post(
        API + "evaluations/", {"candidate": candidate.name, "limit": size + 1, "dry_run": True}, format="json"
    )
    assert dry.status_code == 400 and dry.data == {"detail": message}
    assert rows() == before

    # The whole split is allowed: every item, twice.
    evaluation = services.evaluation_start(candidate=candidate, split="dev", limit=size, actor=ACTOR)
    assert (
        len(evaluation.items) == size and EvaluationRun.objects.filter(evaluation=evaluation).count() == 1134
    )


# --- the user's queued offline runs ----------------------------------------------------------------


def test_a_start_above_the_users_queued_runs_is_refused_with_the_count_and_the_cap(
    api, mira, make_user, settings, candidate
):
    settings.CONDUCTOR_MAX_QUEUED_RUNS_PER_USER = 6
    version = conductor_active()
    items = services.replay_item_ids("train", 3)
    batch = services.rollouts_start(
        version=version, items=items[:2], k=2, temperature=1.0, actor=ACTOR, user=mira
    )
    # Others' runs and runs without a user (a management command) are not counted against mira.
    other = make_user("otto", Role.ML_STAFF)
    services.rollouts_start(version=version, items=items[:2], k=3, temperature=1.0, actor=ACTOR, user=other)
    services.rollouts_start(version=version, items=items, k=3, temperature=1.0, actor=ACTOR)  # 9: no user
    assert quotas.queued_runs(mira) == 4
    assert AuditEvent.objects.filter(action="rollouts.started", object_id=str(batch.pk)).count() == 1
    message = (
        "You have 4 offline runs queued or running; 3 more would take you above the limit of 6 per user "
        "(CONDUCTOR_MAX_QUEUED_RUNS_PER_USER). Wait for some to finish."
    )
    before = rows()

    with pytest.raises(services.TrainingError) as caught:
        services.rollouts_start(
            version=version, items=items[:1], k=3, temperature=1.0, actor=ACTOR, user=mira
        )
    assert str(caught.value) == message
    response = api.post(
        API + "rollouts/", {"version": version.name, "items": items[:1], "k": 3}, format="json"
    )
    assert response.status_code == 400 and response.data == {"detail": message}
    dry = api.post(
        API + "rollouts/",
        {"version": version.name, "items": items[:1], "k": 3, "dry_run": True},
        format="json",
    )
    assert dry.status_code == 400 and dry.data == {"detail": message}
    # An evaluation counts too: 2 items x 2 sides = 4 more.
    response = api.post(API + "evaluations/", {"candidate": candidate.name, "limit": 2}, format="json")
    assert response.status_code == 400
    assert response.data["detail"].startswith("You have 4 offline runs queued or running; 4 more")
    assert rows() == before

    # Up to the cap is allowed; once runs finish, they no longer count.
    response = api.post(
        API + "rollouts/", {"version": version.name, "items": items[:1], "k": 2}, format="json"
    )
    assert response.status_code == 201, response.data
    assert quotas.queued_runs(mira) == 6
    Run.objects.filter(rollout__batch=batch).update(status=RunStatus.SUCCEEDED)
    assert quotas.queued_runs(mira) == 2
    response = api.post(API + "evaluations/", {"candidate": candidate.name, "limit": 2}, format="json")
    assert response.status_code == 201, response.data
    assert AuditEvent.objects.filter(action="evaluation.started").count() == 1
    assert quotas.queued_runs(mira) == 6


def test_the_queued_runs_cap_is_a_setting_of_2000_by_default():
    from django.conf import settings

    assert settings.CONDUCTOR_MAX_QUEUED_RUNS_PER_USER == 2000
    assert quotas.max_queued_runs_per_user() == 2000


# --- the estimate before starting --------------------------------------------------------------------


def test_a_dry_run_answers_the_runs_and_their_estimated_cost_and_starts_nothing(api, candidate):
    version = conductor_active()
    body = {"version": version.name, "split": "dev", "limit": 3, "k": 2, "dry_run": True}
    before = rows()

    response = api.post(API + "rollouts/", body, format="json")
    assert response.status_code == 200, response.data
    assert response.data == {
        "dry_run": True,
        "runs": 6,
        "estimated_usd": None,
        "estimated_from": "no finished runs to estimate from",
        "message": "This will start 6 runs; no finished runs to estimate the cost from.",
    }
    assert rows() == before

    finished_runs(version, ["0.0100", "0.0300"])
    before = rows()
    response = api.post(API + "rollouts/", body, format="json")
    assert response.status_code == 200
    assert response.data["estimated_usd"] == "0.1200"  # 6 runs x the mean $0.02, in Decimal
    assert response.data["estimated_from"] == "the mean cost of static-v1's 2 finished runs, $0.020000 a run"
    assert response.data["message"] == (
        "This will start 6 runs, about $0.1200 (estimated from the mean cost of static-v1's 2 finished "
        "runs, $0.020000 a run)."
    )
    # An evaluation: the candidate has no finished runs, so its half is priced at the mean of all runs.
    response = api.post(
        API + "evaluations/", {"candidate": candidate.name, "limit": 5, "dry_run": True}, format="json"
    )
    assert response.status_code == 200
    assert (response.data["runs"], response.data["estimated_usd"]) == (10, "0.2000")
    assert response.data["estimated_from"] == (
        "the mean cost of all 2 finished runs (static-v2 has none), $0.020000 a run; "
        "the mean cost of static-v1's 2 finished runs, $0.020000 a run"
    )
    assert rows() == before

    # Without dry_run, the same body starts the batch.
    response = api.post(API + "rollouts/", {**body, "dry_run": False}, format="json")
    assert response.status_code == 201 and RolloutBatch.objects.count() == 1


def test_the_preview_buttons_show_the_estimate_and_start_nothing(page, candidate):
    version = conductor_active()
    finished_runs(version, ["0.5"])
    home = page.get(reverse("training:home")).content.decode()
    assert 'name="preview"' in home and "at most 2000 runs" in home
    before = rows()

    response = page.post(reverse("training:rollouts-start"), {**rollout_form(version), "preview": "1"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="rollouts-preview"' in html
    assert (
        "This will start 6 runs, about $3.0000 (estimated from the mean cost of static-v1&#x27;s 1 finished "
        "runs, $0.500000 a run)." in html
    )
    assert "Start rollouts" in html and 'value="3"' in html  # the form, filled in, to start it

    response = page.post(
        reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": "4", "preview": "1"}
    )
    assert response.status_code == 200
    html = response.content.decode()
    preview = html[html.index('id="evaluate-preview"') :]
    assert "This will start 8 runs, about $4.0000" in preview and "Start the evaluation" in preview
    assert f'action="{reverse("training:evaluate", args=[candidate.pk])}"' in preview
    assert 'name="limit" value="4"' in preview and 'name="split" value="dev"' in preview
    assert rows() == before

    # Server-rendered: no inline script and no event handler attributes (a strict CSP is coming).
    for page_html in (home, html):
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page_html)
        assert not re.search(r"\son[a-z]+\s*=", page_html)

    # The start button of the preview starts it.
    response = page.post(reverse("training:evaluate", args=[candidate.pk]), {"split": "dev", "limit": "4"})
    assert response.status_code == 302 and Evaluation.objects.get().limit == 4
