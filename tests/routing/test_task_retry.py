"""A failed task is run again, from its page or the API, as a new run of the same task: audited, queued,
and its failed runs kept as they were. The overview says how far the local model is."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from accounts.models import Role
from audit.models import AuditEvent
from routing.models import Run, RunStatus, Task
from tests.openai_server import Reply, plan_json
from tests.routing.test_engine import run_now, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def failed_task(live_pool) -> Task:
    server = live_pool["server"]
    server.program("conductor", [Reply("{not json")])
    run = run_now(submit())
    assert run.status == RunStatus.FAILED
    server.program("conductor", [Reply(plan_json(("alpha", "Do it", [])))])
    server.program("alpha", [Reply("42")])
    return run.task


def test_an_operator_retries_a_failed_task_from_its_page(failed_task, make_user):
    client = Client()
    client.force_login(make_user("olga", Role.OPERATOR))
    assert 'id="task-retry"' in client.get(f"/tasks/{failed_task.pk}/").content.decode()

    response = client.post(f"/tasks/{failed_task.pk}/retry/", follow=True)

    assert "Retrying: run" in response.content.decode()
    retry = Run.objects.get(task=failed_task, kind=Run.Kind.RETRY)
    assert Task.objects.get(pk=failed_task.pk).status == RunStatus.QUEUED
    run_now(retry)
    task = Task.objects.get(pk=failed_task.pk)
    assert (task.status, task.final_answer) == (RunStatus.SUCCEEDED, "42")
    assert Run.objects.get(task=task, kind=Run.Kind.LIVE).status == RunStatus.FAILED
    event = AuditEvent.objects.get(action="task.retried", task_id=task.pk)
    assert (event.actor_name, event.payload["run_id"]) == ("olga", retry.pk)

    again = client.post(f"/tasks/{failed_task.pk}/retry/", follow=True).content.decode()
    assert "Not retried: only a failed task is retried; this one is succeeded" in again
    assert Run.objects.filter(task=task, kind=Run.Kind.RETRY).count() == 1


def test_only_operators_see_and_may_use_retry(failed_task, make_user):
    client = Client()
    client.force_login(make_user("ada", Role.AUDITOR))

    assert 'id="task-retry"' not in client.get(f"/tasks/{failed_task.pk}/").content.decode()
    assert client.post(f"/tasks/{failed_task.pk}/retry/").status_code == 403
    assert not Run.objects.filter(kind=Run.Kind.RETRY).exists()


def test_the_api_retries_a_failed_task_and_refuses_one_that_has_not_failed(failed_task, make_user):
    client = Client()
    client.force_login(make_user("olga", Role.OPERATOR))

    response = client.post(f"/api/tasks/{failed_task.pk}/retry/")

    assert response.status_code == 202
    assert response.json()["status"] == RunStatus.QUEUED
    refused = client.post(f"/api/tasks/{failed_task.pk}/retry/")
    assert refused.status_code == 400
    assert "only a failed task is retried" in json.dumps(refused.json())
    assert Run.objects.filter(task=failed_task, kind=Run.Kind.RETRY).count() == 1


@pytest.mark.parametrize(
    ("state", "shown"),
    [
        (
            {"state": "installing", "since": "2026-01-01T10:00:00+00:00"},
            "its server is built once",
        ),
        ({"state": "up", "api_base": "http://127.0.0.1:8089/v1"}, "free text goes to it"),
        ({"state": "failed", "reason": "the server exited with status 1"}, "the server exited with status 1"),
        # A failed pip's message ends with a period of its own: the sentence after it gets none more.
        (
            {
                "state": "failed",
                "reason": "CalledProcessError: Command 'pip' returned non-zero exit status 1.",
            },
            "returned non-zero exit status 1. <code>manage.py local_model up</code> brings it back",
        ),
        (
            {"state": "installing", "step": "building llama.cpp's server once for this machine"},
            "free text waits for it. Now building llama.cpp&#x27;s server once for this machine",
        ),
    ],
)
def test_the_overview_says_how_far_the_local_model_is(state, shown, settings, tmp_path, make_user):
    settings.LOCAL_MODEL_STATE_FILE = tmp_path / "state.json"
    client = Client()
    client.force_login(make_user("olga", Role.OPERATOR))
    assert 'id="ops-local-model"' not in client.get("/ops/").content.decode()  # never brought up here

    settings.LOCAL_MODEL_STATE_FILE.write_text(json.dumps(state))
    html = client.get("/ops/").content.decode()

    assert f'id="ops-local-model" data-state="{state["state"]}"' in html
    assert shown in html
    assert ".." not in html.split('id="ops-local-model"')[1].split("</section>")[0]
