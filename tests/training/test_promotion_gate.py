"""The promotion gate: from the evaluation page, a candidate the active version dominates on the
evaluation's items is not promoted, and the page says why; an admin may override it with a reason,
which the audit record keeps; nobody else may."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from accounts.models import Role
from audit.models import AuditEvent
from audit.services import Actor
from routing import engine
from routing.models import ConductorVersion
from tests.training.test_evaluation_decision import policy as single
from training.models import EvaluationRun
from training.services import (
    conductor_promote,
    evaluation_comparison,
    evaluation_refresh,
    evaluation_start,
)

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
ITEMS = 16


def evaluated(candidate: ConductorVersion):
    """`candidate` against the active version on the first dev items, every run made by the engine."""
    evaluation = evaluation_start(candidate=candidate, split="dev", limit=ITEMS, actor=ACTOR)
    for link in EvaluationRun.objects.filter(evaluation=evaluation):
        engine.execute_run(link.run_id)
    return evaluation_refresh(evaluation)


@pytest.fixture
def dominated(replay_pool, tmp_path):
    """gemma-2-9b (candidate) against gemini-1.5-flash (active) on 16 dev items, run by the engine:
    flash is cheaper on every item and, on these items, at least as accurate."""
    conductor_promote(version=single(tmp_path, "flash", "gemini-1.5-flash"), actor=ACTOR)
    evaluation = evaluated(single(tmp_path, "gemma", "gemma-2-9b-it"))
    comparison = evaluation_comparison(evaluation)
    assert comparison.accuracy.delta <= 0 and comparison.usd_per_1000.delta > 0  # the premise
    return evaluation


def client(make_user, name: str, *roles: str) -> Client:
    c = Client()
    c.force_login(make_user(name, *roles))
    return c


def said(response) -> str:
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


def promote(c: Client, evaluation, **extra: str):
    url = reverse("training:promote", args=[evaluation.candidate.pk])
    return c.post(url, {"evaluation": evaluation.pk, "confirm": "yes", **extra})


def test_a_dominated_candidate_is_refused_with_the_reason_on_the_page(dominated, make_user):
    ml = client(make_user, "mira", Role.ML_STAFF)
    page = ml.get(reverse("training:evaluation", args=[dominated.pk])).content.decode()
    assert 'id="promotion-gate"' in page and "gemma is dominated by flash on the 16 items" in page
    assert 'name="override"' not in page  # only an admin is offered the override

    refused = promote(ml, dominated)
    assert refused.status_code == 302
    assert "Not promoted: gemma is dominated by flash" in said(refused)
    assert not ConductorVersion.objects.get(pk=dominated.candidate.pk).is_active
    assert not AuditEvent.objects.filter(action="conductor.promoted", object_id=str(dominated.candidate.pk))

    # ML staff cannot override it, even by posting the override's fields.
    forced = promote(ml, dominated, override="yes", override_reason="trust me")
    assert "Only an admin may override" in said(forced)
    assert not ConductorVersion.objects.get(pk=dominated.candidate.pk).is_active


def test_an_admin_overrides_the_gate_with_a_reason_and_the_audit_record_keeps_both(dominated, make_user):
    admin = client(make_user, "ada", Role.ADMIN)
    page = admin.get(reverse("training:evaluation", args=[dominated.pk])).content.decode()
    assert 'name="override"' in page and 'name="override_reason"' in page

    no_reason = promote(admin, dominated, override="yes", override_reason="  ")
    assert "An admin may override this, with a reason" in said(no_reason)
    assert not ConductorVersion.objects.get(pk=dominated.candidate.pk).is_active

    reason = "<b>gemma</b> is the only model cleared for this customer's data"
    done = promote(admin, dominated, override="yes", override_reason=reason)
    assert "gemma is now the active conductor" in said(done)
    assert ConductorVersion.objects.get(pk=dominated.candidate.pk).is_active
    event = AuditEvent.objects.filter(action="conductor.promoted").latest("id")
    assert event.actor_name == "ada" and event.object_id == str(dominated.candidate.pk)
    evidence = event.payload["evidence"]
    assert evidence["evaluation"] == dominated.pk and evidence["dominated"] is True
    override = evidence["override"]
    assert override["reason"] == reason and override["by"] == "ada"
    assert override["gate"].startswith("gemma is dominated by flash on the 16 items")


def test_a_candidate_that_is_cheaper_or_more_accurate_passes_the_gate(replay_pool, tmp_path, make_user):
    conductor_promote(version=single(tmp_path, "strong", "gpt-4o-2024-08-06"), actor=ACTOR)
    evaluation = evaluated(single(tmp_path, "mini", "gpt-4o-mini-2024-07-18"))
    assert evaluation_comparison(evaluation).usd_per_1000.delta < 0
    ml = client(make_user, "mira", Role.ML_STAFF)
    assert (
        'id="promotion-gate"'
        not in ml.get(reverse("training:evaluation", args=[evaluation.pk])).content.decode()
    )
    assert "mini is now the active conductor" in said(promote(ml, evaluation))
    event = AuditEvent.objects.filter(action="conductor.promoted").latest("id")
    assert event.payload["evidence"]["dominated"] is False and "override" not in event.payload["evidence"]


def test_through_the_api_an_evaluation_brings_the_same_gate(dominated, make_user):
    url = f"/api/training/conductors/{dominated.candidate.name}/promote/"
    ml = APIClient()
    ml.force_authenticate(make_user("mira", Role.ML_STAFF))
    refused = ml.post(url, {"evaluation": dominated.pk}, format="json")
    assert refused.status_code == 400 and "gemma is dominated by flash" in str(refused.json())
    forced = ml.post(url, {"evaluation": dominated.pk, "override_reason": "trust me"}, format="json")
    assert forced.status_code == 400 and "Only an admin may override" in str(forced.json())
    assert not ConductorVersion.objects.get(pk=dominated.candidate.pk).is_active

    admin = APIClient()
    admin.force_authenticate(make_user("ada", Role.ADMIN))
    done = admin.post(
        url, {"evaluation": dominated.pk, "override_reason": "cleared data only"}, format="json"
    )
    assert done.status_code == 200 and done.json()["is_active"]
    override = (
        AuditEvent.objects.filter(action="conductor.promoted").latest("id").payload["evidence"]["override"]
    )
    assert override["reason"] == "cleared data only" and override["by"] == "ada"
