"""Sample tasks on the submit form: recorded benchmark items the offline replay pool answers."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.test import Client
from django.utils.html import escape

from accounts.models import Role
from routing import engine, replay
from routing.models import ConductorVersion, RunStatus, StepStatus, Task
from training.policy import Policy, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

FORM = {
    "scorer": "auto",
    "classification": "public",
    "max_steps": "5",
    "max_depth": "2",
    "max_usd": "0.50",
    "idempotency_key": "",
}


@pytest.fixture
def client(make_user) -> Client:
    client = Client()
    client.force_login(make_user("grace", Role.OPERATOR))
    return client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def textarea(html: str, name: str) -> str:
    found = re.search(rf'<textarea name="{name}"[^>]*>(.*?)</textarea>', html, re.DOTALL)
    assert found, f"no textarea {name}"
    return unescape(found.group(1)).strip("\r\n")


def test_the_submit_page_offers_two_recorded_items_per_domain(client):
    samples = replay.sample_items()

    html = page(client, "/tasks/new/")

    assert sorted({s.domain for s in samples}) == ["cruxeval-o", "gsm8k", "math-l5"]
    assert [s.domain for s in samples].count("gsm8k") == 2 and len(samples) == 6
    assert all(s.split == "dev" for s in samples)
    assert "Sample tasks" in html
    for n, item in enumerate(samples):
        assert f'href="?sample={n}#id_text"' in html
        assert escape(replay.sample_label(item)) in html  # CRUXEval labels carry quotes: escaped
    crux = next(s for s in samples if s.domain == "cruxeval-o")
    assert replay.sample_label(crux).startswith("assert f(")


def test_a_sample_prefills_the_form(client):
    samples = replay.sample_items()
    n = next(i for i, s in enumerate(samples) if s.domain == "cruxeval-o")

    html = page(client, f"/tasks/new/?sample={n}")

    assert textarea(html, "text") == samples[n].task
    assert textarea(html, "reference") == samples[n].reference
    assert f'<input type="hidden" name="sample" value="{n}">' in html
    assert re.search(r'<option value="public" selected>', html)


@pytest.mark.parametrize("value", ["abc", "99", "-1", "²", "1" * 5000])
def test_an_unknown_sample_fills_nothing(client, value):
    html = page(client, f"/tasks/new/?sample={value}")

    assert textarea(html, "text") == ""
    assert 'name="sample"' not in html


def test_no_samples_without_replay_data(client, settings):
    settings.REPLAY_DIR = None

    html = page(client, "/tasks/new/?sample=0")

    assert "Sample tasks" not in html and "?sample=" not in html
    assert textarea(html, "text") == ""


def test_submitting_a_sample_produces_a_succeeded_run(client, replay_pool, tmp_path):
    """Through the form as a browser sends it (CRLF line breaks) to the learned conductor's cascade."""
    path = tmp_path / "policy.json"
    path.write_text(
        Policy.new(
            [Workflow("cascade", ("gpt-4o-mini-2024-07-18", "gemini-1.5-flash", "gpt-4o-2024-08-06"))]
        ).to_json()
    )
    ConductorVersion.objects.update(is_active=False)
    ConductorVersion.objects.create(
        name="learned-test", backend="learned", config={"policy_path": str(path)}, is_active=True
    )
    samples = replay.sample_items()
    n = next(i for i, s in enumerate(samples) if s.domain == "cruxeval-o")
    item = samples[n]
    assert "\n" in item.task

    response = client.post(
        "/tasks/new/",
        {**FORM, "sample": str(n), "text": item.task.replace("\n", "\r\n"), "reference": item.reference},
    )

    task = Task.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/tasks/{task.pk}/"
    assert (task.text, task.domain, task.source_item) == (item.task, item.domain, item.id)
    engine.execute_run(task.runs.get().pk)
    task.refresh_from_db()
    assert task.status == RunStatus.SUCCEEDED, task.error
    assert task.score is not None and task.final_answer
    run = task.runs.get()
    assert not run.steps.filter(status__in=[StepStatus.PENDING, StepStatus.RUNNING]).exists()


def test_an_edited_sample_is_submitted_as_free_text(client, replay_pool):
    samples = replay.sample_items()

    client.post("/tasks/new/", {**FORM, "sample": "0", "text": samples[0].task + " Show your work."})

    task = Task.objects.get()
    assert (task.domain, task.source_item) == ("", "")
