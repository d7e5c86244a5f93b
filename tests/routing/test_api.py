"""The REST API through DRF's APIClient, against the real PostgreSQL and a loopback OpenAI server."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, Role
from audit.grants import token_create, user_set_roles
from audit.models import AuditEvent
from routing import engine
from routing.models import Run, RunStatus, Task, Worker
from routing.services import TaskSubmission, task_submit
from tests.openai_server import Reply, plan_json

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = "/api/tasks/"


@pytest.fixture
def user(make_user):
    return make_user("ada", Role.OPERATOR, password="correct horse battery")


def token_client(token: ApiToken) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api(user) -> APIClient:
    return token_client(token_create(user=user, role=Role.OPERATOR))


def post(api: APIClient, body: dict, **headers):
    return api.post(TASKS, body, format="json", **headers)


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("post", TASKS), ("get", TASKS), ("get", "/api/workers/")])
def test_anonymous_requests_are_refused(method, path):
    response = getattr(APIClient(), method)(path, {"text": "What is 2 + 2?"}, format="json")

    assert response.status_code in (401, 403)
    assert not Task.objects.exists()


def test_a_wrong_token_is_refused():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")

    assert client.get(TASKS).status_code in (401, 403)


def test_token_auth_works_and_the_task_records_who_submitted_it(api, user):
    assert api.get(TASKS).status_code == 200

    response = post(api, {"text": "What is 2 + 2?"})

    assert response.status_code == 201, response.data
    assert Task.objects.get(pk=response.data["id"]).submitted_by == user


# --- roles and tokens -------------------------------------------------------------------------


@pytest.fixture
def read_urls() -> list[str]:
    """Every read endpoint, each with something to show: one task and one worker exist."""
    task, _ = task_submit(submission=TaskSubmission(text="What is 2 + 2?"), source=Task.Source.CLI)
    worker = Worker.objects.create(
        slug="alpha",
        display_name="Alpha",
        litellm_model="openai/alpha",
        vendor="acme",
        input_usd_per_mtok=Decimal("1.00"),
        output_usd_per_mtok=Decimal("2.00"),
        price_source=Worker.PriceSource.OVERRIDE,
    )
    return ["/api/", TASKS, f"{TASKS}{task.pk}/", "/api/workers/", f"/api/workers/{worker.slug}/"]


def test_a_user_without_a_role_is_refused_by_every_endpoint(make_user, read_urls):
    nobody = make_user("nobody")
    client = APIClient()
    client.force_login(nobody)  # a session: such a user cannot be given a token

    for url in read_urls:
        assert client.get(url).status_code == 403, url
    assert post(client, {"text": "What is 3 + 3?"}).status_code == 403
    assert list(Task.objects.values_list("text", flat=True)) == ["What is 2 + 2?"]
    assert not AuditEvent.objects.filter(action="record.viewed").exists()
    with pytest.raises(ValueError, match="does not hold the role"):
        token_create(user=nobody, role=Role.AUDITOR)
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("role", Role.values)
def test_every_role_may_read_every_endpoint(make_user, read_urls, role):
    reader = make_user("reader", role)
    client = token_client(token_create(user=reader, role=role))

    for url in read_urls:
        assert client.get(url).status_code == 200, url
    assert AuditEvent.objects.get(action="record.viewed").actor_name == "reader"


@pytest.mark.parametrize(
    ("role", "allowed"),
    [(Role.OPERATOR, True), (Role.ADMIN, True), (Role.AUDITOR, False), (Role.ML_STAFF, False)],
)
def test_only_operators_and_admins_may_submit(make_user, role, allowed):
    client = token_client(token_create(user=make_user("someone", role), role=role))

    response = post(client, {"text": "What is 2 + 2?"})

    assert response.status_code == (201 if allowed else 403)
    assert Task.objects.exists() == allowed
    assert AuditEvent.objects.filter(action="task.submitted").exists() == allowed


def test_an_auditor_may_read_but_not_submit_with_a_token_or_a_session(make_user, read_urls):
    auditor = make_user("ann", Role.AUDITOR)
    with_token = token_client(token_create(user=auditor, role=Role.AUDITOR))
    with_session = APIClient()
    with_session.force_login(auditor)

    for client in (with_token, with_session):
        assert client.get(TASKS).status_code == 200
        assert client.get(read_urls[2]).status_code == 200
        response = post(client, {"text": "What is 3 + 3?"})
        assert response.status_code == 403
        assert response.data["detail"] == "your role does not allow this"
    assert list(Task.objects.values_list("text", flat=True)) == ["What is 2 + 2?"]
    assert AuditEvent.objects.filter(action="task.submitted").count() == 1  # the fixture's task


def test_a_superuser_is_an_admin_and_may_submit():
    root = get_user_model().objects.create_superuser("root", email="", password="y" * 12)
    client = token_client(token_create(user=root, role=Role.ADMIN))

    response = post(client, {"text": "What is 2 + 2?"})

    assert response.status_code == 201, response.data
    assert Task.objects.get().submitted_by == root


def test_the_token_narrows_its_users_roles_to_its_own(make_user):
    both = make_user("bo", Role.OPERATOR, Role.AUDITOR)
    as_operator = token_client(token_create(user=both, role=Role.OPERATOR))
    as_auditor = token_client(token_create(user=both, role=Role.AUDITOR))

    refused = post(as_auditor, {"text": "As an auditor"})
    accepted = post(as_operator, {"text": "As an operator"})

    assert refused.status_code == 403
    assert accepted.status_code == 201, accepted.data
    assert as_auditor.get(TASKS).status_code == 200  # the auditor token still reads
    assert list(Task.objects.values_list("text", flat=True)) == ["As an operator"]
    assert Task.objects.get().submitted_by == both
    # Without a token (a session) the user acts with all of its roles.
    session = APIClient()
    session.force_login(both)
    assert post(session, {"text": "In a session"}).status_code == 201


def test_a_token_cannot_carry_a_role_its_user_does_not_hold(make_user):
    auditor = make_user("ann", Role.AUDITOR)

    with pytest.raises(ValueError, match="does not hold the role"):
        token_create(user=auditor, role=Role.OPERATOR)
    assert not ApiToken.objects.exists()


def test_a_token_loses_the_role_its_user_loses(user, api):
    assert post(api, {"text": "Before"}).status_code == 201

    user_set_roles(user=user, roles=[Role.AUDITOR])

    assert post(api, {"text": "After"}).status_code == 403
    assert api.get(TASKS).status_code == 403  # an operator token of a user who is no operator
    assert list(Task.objects.values_list("text", flat=True)) == ["Before"]


def test_a_revoked_token_is_refused(user):
    token = token_create(user=user, role=Role.OPERATOR)
    client = token_client(token)
    assert client.get(TASKS).status_code == 200

    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())

    assert client.get(TASKS).status_code in (401, 403)
    assert post(client, {"text": "What is 2 + 2?"}).status_code in (401, 403)
    assert not Task.objects.exists()
    # The same user's unrevoked token still works: the refusal is the revocation's.
    fresh = token_client(token_create(user=user, role=Role.OPERATOR))
    assert post(fresh, {"text": "What is 2 + 2?"}).status_code == 201


def test_a_token_of_an_inactive_user_is_refused(user, api):
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)

    assert api.get(TASKS).status_code in (401, 403)
    assert post(api, {"text": "What is 2 + 2?"}).status_code in (401, 403)
    assert not Task.objects.exists()


# --- submission -------------------------------------------------------------------------------


def test_post_creates_a_queued_task_with_one_live_run(api):
    response = post(api, {"text": "What is 6 * 7?", "reference": "42", "max_usd": "0.25", "max_steps": 3})

    assert response.status_code == 201, response.data
    body = response.data
    task = Task.objects.get()
    assert body["id"] == str(task.pk)
    assert body["status"] == "queued"
    assert body["source"] == "api" and task.source == Task.Source.API
    assert body["text"] == "What is 6 * 7?" and body["reference"] == "42"
    assert Decimal(body["max_usd"]) == Decimal("0.25") and body["max_steps"] == 3
    assert len(body["runs"]) == 1
    run = body["runs"][0]
    assert run["kind"] == "live" and run["status"] == "queued"
    assert run["id"] == task.runs.get().pk
    assert run["decisions"] == [] and run["steps"] == []


def test_an_empty_reference_is_stored_as_no_reference(api):
    response = post(api, {"text": "Name a colour.", "reference": ""})

    assert response.status_code == 201
    assert response.data["reference"] is None


def test_the_same_idempotency_key_in_the_body_returns_the_same_task(api):
    first = post(api, {"text": "What is 2 + 2?", "idempotency_key": "job-1"})
    again = post(api, {"text": "What is 2 + 2?", "idempotency_key": "job-1"})

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.data["id"] == first.data["id"]
    assert Task.objects.count() == 1 and Run.objects.count() == 1


def test_the_same_idempotency_key_in_the_header_returns_the_same_task(api):
    first = post(api, {"text": "What is 2 + 2?"}, HTTP_IDEMPOTENCY_KEY="job-2")
    again = post(api, {"text": "What is 2 + 2?"}, HTTP_IDEMPOTENCY_KEY="job-2")

    assert first.status_code == 201 and again.status_code == 200
    assert again.data["id"] == first.data["id"]
    assert Task.objects.get().idempotency_key == "job-2"
    # Without a key the same text is a new task.
    assert post(api, {"text": "What is 2 + 2?"}).status_code == 201
    assert Task.objects.count() == 2


def test_the_same_idempotency_key_with_a_different_text_is_a_conflict(api):
    post(api, {"text": "What is 2 + 2?", "idempotency_key": "job-3"})

    response = post(api, {"text": "What is 3 + 3?", "idempotency_key": "job-3"})

    assert response.status_code == 409
    assert "already used for a different task" in response.data["detail"]
    assert list(Task.objects.values_list("text", flat=True)) == ["What is 2 + 2?"]


def test_an_overlong_idempotency_key_header_is_refused(api):
    response = post(api, {"text": "What is 2 + 2?"}, HTTP_IDEMPOTENCY_KEY="k" * 201)

    assert response.status_code == 400
    assert "Idempotency-Key" in response.data["detail"]
    assert not Task.objects.exists()


def test_a_submission_writes_one_audit_event_and_a_repeat_writes_none(api, user):
    first = post(api, {"text": "What is 2 + 2?", "idempotency_key": "job-4"})
    post(api, {"text": "What is 2 + 2?", "idempotency_key": "job-4"})

    events = AuditEvent.objects.filter(action="task.submitted")
    assert events.count() == 1
    event = events.get()
    assert str(event.task_id) == first.data["id"]
    assert event.object_id == first.data["id"]
    assert str(event.correlation_id) == first.data["runs"][0]["correlation_id"]
    assert event.actor_type == AuditEvent.ActorType.USER and event.actor_name == user.username
    assert event.payload["source"] == "api" and event.payload["chars"] == len("What is 2 + 2?")

    post(api, {"text": "Another task"})
    assert AuditEvent.objects.filter(action="task.submitted").count() == 2


def test_an_oversized_text_is_refused_with_a_clear_message(api, settings):
    settings.CONDUCTOR_MAX_TASK_CHARS = 100

    assert post(api, {"text": "x" * 100}).status_code == 201
    response = post(api, {"text": "x" * 101})

    assert response.status_code == 400
    assert response.data["errors"] == {"text": ["At most 100 characters. The task text has 101."]}
    assert Task.objects.count() == 1


def test_a_whitespace_only_text_is_refused(api):
    response = post(api, {"text": " \n\t "})

    assert response.status_code == 400
    assert response.data["detail"] == "the task text is empty"
    assert not Task.objects.exists()


def test_a_text_with_a_nul_character_is_refused(api):
    response = post(api, {"text": "before\x00after"})

    assert response.status_code == 400
    # Refused by the JSON parser or the serializer: either way the sentence names the NUL.
    assert "nul" in response.data["detail"].lower(), response.data
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "text"),
        ({"text": "ok", "classification": "top-secret"}, "classification"),
        ({"text": "ok", "max_usd": "-0.01"}, "max_usd"),
        ({"text": "ok", "max_usd": "lots"}, "max_usd"),
        ({"text": "ok", "max_usd": 1e30}, "max_usd"),
        ({"text": "ok", "max_steps": 0}, "max_steps"),
        ({"text": "ok", "max_depth": 6}, "max_depth"),
        ({"text": "ok", "scorer": "vibes"}, "scorer"),
        ({"text": "ok", "idempotency_key": "k" * 201}, "idempotency_key"),
    ],
    ids=[
        "missing",
        "classification",
        "negative-usd",
        "not-a-number",
        "beyond-the-digits",
        "zero-steps",
        "deep",
        "scorer",
        "long-key",
    ],
)
def test_invalid_fields_are_refused_by_name(api, body, field):
    response = post(api, body)

    assert response.status_code == 400
    assert set(response.data) == {"detail", "errors"} and field in response.data["errors"], response.data
    assert field in response.data["detail"]
    assert not Task.objects.exists()


# --- listing ----------------------------------------------------------------------------------


def submit_many(api: APIClient, texts: list[str]) -> list[str]:
    ids = []
    for text in texts:
        response = post(api, {"text": text})
        assert response.status_code == 201
        ids.append(response.data["id"])
    return ids


def test_the_list_is_cursor_paginated_newest_first_without_duplicates(api):
    ids = submit_many(api, [f"Task number {i}" for i in range(5)])

    seen, pages = [], 0
    url = f"{TASKS}?page_size=2"
    while url:
        response = api.get(url)
        assert response.status_code == 200
        assert len(response.data["results"]) <= 2
        assert "count" not in response.data  # a cursor page, not an offset page
        seen += [row["id"] for row in response.data["results"]]
        url, pages = response.data["next"], pages + 1
        assert pages <= 5, "pagination does not end"

    assert pages == 3
    assert seen == list(reversed(ids))
    assert len(set(seen)) == len(seen)


def test_the_list_can_go_back_a_page(api):
    ids = submit_many(api, [f"Task number {i}" for i in range(4)])
    second = api.get(api.get(f"{TASKS}?page_size=2").data["next"])

    back = api.get(second.data["previous"])

    assert [r["id"] for r in second.data["results"]] == list(reversed(ids))[2:]
    assert [r["id"] for r in back.data["results"]] == list(reversed(ids))[:2]


def test_the_list_rows_are_summaries(api):
    submit_many(api, ["What is 2 + 2?"])

    row = api.get(TASKS).data["results"][0]

    assert row["text"] == "What is 2 + 2?" and row["status"] == "queued" and row["source"] == "api"
    assert "runs" not in row and "final_answer" not in row


def test_the_list_filters_by_status_and_search(api):
    ids = submit_many(api, ["Translate hello to French", "Sum 2 and 3", "Translate goodbye to German"])
    Task.objects.filter(pk=ids[1]).update(status=RunStatus.FAILED)

    failed = api.get(TASKS, {"status": "failed"}).data["results"]
    queued = api.get(TASKS, {"status": "queued"}).data["results"]
    found = api.get(TASKS, {"q": "translate"}).data["results"]
    both = api.get(TASKS, {"q": "TRANSLATE", "status": "failed"}).data["results"]

    assert [r["id"] for r in failed] == [ids[1]]
    assert {r["id"] for r in queued} == {ids[0], ids[2]}
    assert [r["id"] for r in found] == [ids[2], ids[0]]
    assert both == []


# --- detail -----------------------------------------------------------------------------------


def test_the_detail_shows_decisions_steps_and_attempts_after_a_run(api, live_pool):
    server = live_pool["server"]
    server.program(
        "conductor",
        [
            Reply(
                plan_json(("alpha", "Solve it", []), ("gamma", "Check it", "all")),
                prompt_tokens=300,
                completion_tokens=60,
            )
        ],
    )
    server.program(
        "alpha", [Reply(status=500), Reply("41 + 1 = 42", prompt_tokens=100, completion_tokens=20)]
    )
    server.program("gamma", [Reply("42", prompt_tokens=200, completion_tokens=3)])
    created = post(api, {"text": "What is 41 + 1?", "reference": "42", "scorer": "numeric"}).data

    engine.execute_run(created["runs"][0]["id"])
    response = api.get(f"{TASKS}{created['id']}/")

    assert response.status_code == 200
    task = response.data
    assert task["status"] == "succeeded" and task["final_answer"] == "42" and task["score"] == 1.0
    (run,) = task["runs"]
    assert run["status"] == "succeeded" and run["conductor"] == "llm-test"
    (decision,) = run["decisions"]
    assert decision["valid"] is True and decision["backend"] == "llm"
    assert [s["worker"] for s in decision["plan"]["steps"]] == ["alpha", "gamma"]
    alpha, gamma = run["steps"]
    assert (alpha["index"], alpha["worker_slug"], alpha["vendor"]) == (0, "alpha", "acme")
    assert (gamma["index"], gamma["worker_slug"], gamma["access"]) == (1, "gamma", "all")
    assert (alpha["sees"], gamma["sees"]) == ([], [0])  # what each step saw, by the engine's rule
    assert alpha["decision"] == decision["id"]
    assert alpha["response"] == "41 + 1 = 42" and gamma["response"] == "42"
    assert [(a["number"], a["status"], a["http_status"]) for a in alpha["attempts"]] == [
        (1, "server_error", 500),
        (2, "succeeded", None),
    ]
    # 100 * $1.00/M + 20 * $2.00/M, the failed attempt free; 200 * $3/M + 3 * $15/M.
    assert Decimal(alpha["cost_usd"]) == Decimal("0.000140")
    assert Decimal(gamma["cost_usd"]) == Decimal("0.000645")
    # Conductor: 300 * $0.10/M + 60 * $0.20/M.
    assert Decimal(decision["cost_usd"]) == Decimal("0.000042")
    assert Decimal(run["cost_usd"]) == Decimal("0.000140") + Decimal("0.000645") + Decimal("0.000042")
    assert Decimal(task["cost_usd"]) == Decimal(run["cost_usd"])
    assert gamma["messages_sent"][-1]["content"].count("41 + 1 = 42") == 1


def test_an_unknown_task_is_404(api):
    assert api.get(f"{TASKS}00000000-0000-0000-0000-000000000000/").status_code == 404


# --- workers and schema -----------------------------------------------------------------------


def test_workers_are_listed(api, live_pool):
    response = api.get("/api/workers/")

    assert response.status_code == 200
    assert [w["slug"] for w in response.data] == ["alpha", "beta", "gamma"]
    gamma = response.data[2]
    assert gamma["vendor"] == "globex" and gamma["litellm_model"] == "openai/gamma"
    assert Decimal(gamma["output_usd_per_mtok"]) == Decimal("15")
    assert "api_key_env" not in gamma and "api_base" not in gamma
    assert api.get("/api/workers/beta/").data["display_name"] == "Beta"


def test_the_openapi_schema_describes_the_task_endpoints(api):
    response = api.get("/api/schema/", {"format": "json"})

    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    assert "/api/tasks/" in document["paths"]
    assert {"get", "post"} <= set(document["paths"]["/api/tasks/"])
    assert "/api/workers/" in document["paths"]
