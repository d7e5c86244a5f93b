"""The submission limit and the plan's agree: a task as long as CONDUCTOR_MAX_TASK_CHARS allows is
accepted, planned and run whole (a step may quote it, framed), never accepted and then refused by the
plan's check on an instruction's length."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from routing import engine, limits, replay
from routing.models import RunStatus, Step, Task
from routing.static_rules import DEFAULT_STATIC_RULES
from tests.routing.test_submission_input import FORM

pytestmark = pytest.mark.django_db


def long_task(length: int) -> str:
    """A recorded item's text (the replay pool answers an instruction that quotes it), in markup, padded
    with "x" to `length` characters."""
    item = next(i for i in replay.read_items(replay.split_path("dev")) if len(i.task) > 40)
    text = f"<p><b>{item.task}</b></p>\n"
    return text + "x" * (length - len(text))


def run_of(task: Task):
    run = task.runs.get()
    engine.execute_run(run.pk)
    run.refresh_from_db()
    return run


def assert_quoted_whole(task: Task) -> None:
    run = run_of(task)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [s.instruction for s in Step.objects.filter(run=run)] == [task.text]


def test_a_task_of_20000_characters_and_more_from_the_form_is_planned_and_run_whole(replay_pool, make_user):
    client = Client()
    client.force_login(make_user("ada", Role.OPERATOR))
    text = long_task(20_020)

    response = client.post("/tasks/new/", {**FORM, "text": text})

    assert response.status_code == 302, response.content.decode()[:500]
    assert_quoted_whole(Task.objects.get(text=text))


def test_a_task_of_the_longest_length_from_the_api_is_planned_and_run_whole(replay_pool, make_user, settings):
    client = APIClient()
    user = make_user("ada", Role.OPERATOR)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.OPERATOR).key}")
    text = long_task(settings.CONDUCTOR_MAX_TASK_CHARS)

    response = client.post("/api/tasks/", {"text": text}, format="json")

    assert response.status_code == 201, response.json()
    assert_quoted_whole(Task.objects.get(pk=response.json()["id"]))


def test_one_character_more_is_refused_at_submission_naming_the_limit(replay_pool, make_user, settings):
    client = Client()
    client.force_login(make_user("ada", Role.OPERATOR))
    limit = settings.CONDUCTOR_MAX_TASK_CHARS

    response = client.post("/tasks/new/", {**FORM, "text": long_task(limit + 1)})

    assert response.status_code == 200
    assert f"At most {limit} characters. The task text has {limit + 1}." in response.content.decode()
    assert not Task.objects.exists()


def test_the_plan_limit_follows_the_submission_limit(settings):
    settings.CONDUCTOR_MAX_TASK_CHARS = 300_000

    assert limits.instruction_max_chars() == 300_000 + limits.INSTRUCTION_FRAMING_CHARS


def test_every_static_rule_frames_the_task_within_the_room_the_plan_leaves():
    for rule in DEFAULT_STATIC_RULES["rules"]:
        for step in rule["steps"]:
            framing = step["instruction"].replace("{task}", "")
            assert len(framing) <= limits.INSTRUCTION_FRAMING_CHARS, rule["name"]
