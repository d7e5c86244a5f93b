"""Rollouts sample at the temperature of their kind of conductor when none is asked for: the learned
policy's 4.0 (its logits stand some ten apart), an LLM's 1.0 (at 4.0 it writes noise); the service, the
API and the form agree, and the form names both defaults."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest
from django.urls import reverse

from audit.models import AuditEvent
from audit.services import Actor
from routing.models import ConductorVersion, Run
from training import services
from training.forms import RolloutsForm
from training.models import RolloutBatch
from training.services import rollouts_estimate, rollouts_start

pytestmark = pytest.mark.django_db(transaction=True)
ACTOR = Actor.service("test")
ITEMS = ["cruxeval-o:crux-test-#1", "gsm8k:gsm8k-main-test-#1000"]


@pytest.fixture
def versions(replay_pool):
    llm = ConductorVersion.objects.create(
        name="smollm2-like", backend="llm", config={"model": "openai/x", "api_base": "http://127.0.0.1:9"}
    )
    learned = ConductorVersion.objects.create(name="learned-x", backend="learned", config={})
    return {"llm": llm, "learned": learned}


def test_the_default_temperature_follows_the_kind_of_conductor():
    assert services.rollout_temperature(ConductorVersion.Backend.LEARNED) == 4.0
    assert services.rollout_temperature(ConductorVersion.Backend.LLM) == 1.0
    assert (
        services.rollout_temperature(ConductorVersion.Backend.STATIC) == 1.0
    )  # rules: any temperature is alike


def test_the_service_samples_an_llm_at_1_and_the_learned_policy_at_4(versions, broker):
    for kind, expected in (("llm", 1.0), ("learned", 4.0)):
        rollouts_estimate(version=versions[kind], items=ITEMS, k=2)  # checked alike, nothing started
        batch = rollouts_start(version=versions[kind], items=ITEMS, k=2, actor=ACTOR)
        assert batch.temperature == expected, kind
        runs = Run.objects.filter(rollout__batch=batch)
        assert set(runs.values_list("temperature", flat=True)) == {expected}, kind
        event = AuditEvent.objects.get(action="rollouts.started", object_id=str(batch.pk))
        assert event.payload["temperature"] == expected
    asked = rollouts_start(version=versions["llm"], items=ITEMS, k=2, temperature=0.7, actor=ACTOR)
    assert asked.temperature == 0.7  # a temperature asked for is kept


def test_the_api_leaves_the_temperature_to_the_conductor_kind(versions, api, broker):
    for kind, expected in (("llm", 1.0), ("learned", 4.0)):
        body = {"version": versions[kind].name, "items": ITEMS, "k": 2}
        response = api.post("/api/training/rollouts/", body, format="json")
        assert response.status_code == 201, response.data
        assert response.data["temperature"] == expected, kind
    response = api.post(
        "/api/training/rollouts/",
        {"version": versions["llm"].name, "items": ITEMS, "k": 2, "temperature": 0.8},
        format="json",
    )
    assert response.status_code == 201 and response.data["temperature"] == 0.8


def test_the_form_names_both_defaults_and_applies_the_chosen_conductors(versions, page, broker):
    field = RolloutsForm().fields["temperature"]
    assert not field.required and field.initial is None
    assert "4 for a learned policy" in field.help_text and "1 for an LLM conductor" in field.help_text
    html = page.get(reverse("training:home")).content.decode()
    assert "1 for an LLM conductor" in html
    [attribute] = re.findall(r'<input[^>]*id="id_rollouts-temperature"[^>]*>', html)
    defaults = json.loads(unescape(re.search(r'data-defaults="([^"]*)"', attribute).group(1)))
    assert defaults[str(versions["llm"].pk)] == 1.0 and defaults[str(versions["learned"].pk)] == 4.0

    data = {"version": versions["llm"].pk, "split": "train", "domain": "", "limit": "2", "k": "2"}
    response = page.post(
        reverse("training:rollouts-start"),
        {f"rollouts-{k}": v for k, v in {**data, "temperature": ""}.items()},
    )
    assert response.status_code == 302, response.context["rollouts_form"].errors
    assert RolloutBatch.objects.get(conductor_version=versions["llm"]).temperature == 1.0
