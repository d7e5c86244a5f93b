"""A deployment's own kinds reach the learned conductor: the kind submitted with a task (the web form's
Kind, the API's `domain`) is whatever label the deployment uses, and the policy routes by it."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from accounts.models import Role
from routing import engine
from routing.models import ConductorVersion, Decision, Task, Worker
from tests.openai_server import Reply
from training.policy import GRPOConfig, Policy, Workflow, train

pytestmark = pytest.mark.django_db(transaction=True)
CHEAP, STRONG = "gpt-4o-mini-2024-07-18", "gpt-4o-2024-08-06"


def trained_on_made_up_kinds(tmp_path) -> ConductorVersion:
    """A policy that learned, from its items' labels alone, that invoices need the cheap worker only."""

    def items(kind: str, cheap_right: bool) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(
                id=f"{kind}-{i}",
                domain=kind,
                task=f"Check document {i} and give the total",
                outcomes={
                    CHEAP: {"score": float(cheap_right), "cost_usd": 0.0001, "answer": "1"},
                    STRONG: {"score": 1.0, "cost_usd": 0.01, "answer": "1"},
                },
            )
            for i in range(30)
        ]

    data = items("invoices", True) + items("audits", False)
    policy = Policy.for_items([Workflow("single", (CHEAP,)), Workflow("single", (STRONG,))], data)
    train(policy, data, GRPOConfig(epochs=25, cost_penalty_per_usd=20, seed=3))
    path = tmp_path / "kinds.json"
    path.write_text(policy.to_json())
    version = ConductorVersion.objects.create(
        name="kinds", backend="learned", config={"policy_path": str(path)}
    )
    ConductorVersion.objects.exclude(pk=version.pk).update(is_active=False)
    ConductorVersion.objects.filter(pk=version.pk).update(is_active=True)
    return version


@pytest.fixture
def live_cheap_and_strong(openai_server) -> None:
    """The two workers the policy names, as live endpoints (free text is never offered to the replay
    pool, which answers only the items it recorded)."""
    for slug in (CHEAP, STRONG):
        Worker.objects.create(
            slug=slug,
            display_name=slug,
            litellm_model=f"openai/{slug}",
            api_base=openai_server.base_url,
            vendor="openai",
            input_usd_per_mtok=Decimal("0.15") if slug == CHEAP else Decimal("2.5"),
            output_usd_per_mtok=Decimal("0.6") if slug == CHEAP else Decimal("10"),
            price_source=Worker.PriceSource.OVERRIDE,
        )
        openai_server.program(slug, [Reply("1")])


def planned_worker(task: Task) -> str:
    engine.execute_run(task.runs.get().pk)
    return Decision.objects.get(run__task=task, depth=0).plan["steps"][0]["worker"]


def test_the_kind_set_on_the_form_or_the_api_routes_the_task(live_cheap_and_strong, tmp_path, make_user):
    trained_on_made_up_kinds(tmp_path)
    operator = make_user("otto", Role.OPERATOR)

    web = Client()
    web.force_login(operator)
    response = web.post(
        reverse("routing:task-submit"),
        {
            "text": "Check document 77 and give the total",
            "domain": "invoices",
            "scorer": "auto",
            "classification": "internal",
            "max_steps": 5,
            "max_depth": 2,
            "max_usd": "1",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    invoice = Task.objects.get(domain="invoices")
    assert planned_worker(invoice) == CHEAP

    api = APIClient()
    api.force_authenticate(operator)
    created = api.post(
        "/api/tasks/", {"text": "Check document 78 and give the total", "domain": "audits"}, format="json"
    )
    assert created.status_code == 201, created.content
    audit = Task.objects.get(domain="audits")
    assert planned_worker(audit) == STRONG

    # A label it never saw: planned from the text alone, still a valid plan of its workflows.
    other = api.post(
        "/api/tasks/", {"text": "Check document 79 and give the total", "domain": "receipts"}, format="json"
    )
    assert other.status_code == 201, other.content
    assert planned_worker(Task.objects.get(domain="receipts")) in (CHEAP, STRONG)
