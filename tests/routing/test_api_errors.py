"""One error shape for the whole API, and a schema that declares every error an operation answers.

Requests that fail in each way the routing and training APIs can fail (a bad body, no credentials, a
role that may not, an unknown id, a method the path does not take, a conflict, a body of another
media type, an unavailable representation) must answer a status the operation's schema declares,
with a body of the one Error component: {"detail": "<sentence>", "errors": {field: [messages]}}.
"""

from __future__ import annotations

import json
import re
import uuid
from io import StringIO
from typing import Any

import jsonschema
import pytest
from django.core.management import call_command
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from routing.services import TaskSubmission, task_submit

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict[str, Any]:
    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)


@pytest.fixture
def clients(make_user) -> dict[str, APIClient]:
    made = {"anonymous": APIClient()}
    for role in (Role.OPERATOR, Role.AUDITOR, Role.ML_STAFF, Role.ADMIN):
        client = APIClient()
        client.credentials(
            HTTP_AUTHORIZATION=f"Token {token_create(user=make_user(role, role), role=role).key}"
        )
        made[role] = client
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    made["bad-token"] = bad
    return made


def operation_for(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema's path item for a concrete path: a literal path first, else the templated one."""
    paths = schema["paths"]
    if path in paths:
        return paths[path]
    for template, item in paths.items():
        if re.fullmatch(re.sub(r"{[^}]+}", "[^/]+", template), path):
            return item
    raise AssertionError(f"{path} is not in the schema")


def assert_error_shape(schema: dict[str, Any], body: Any) -> None:
    jsonschema.validate(body, schema["components"]["schemas"]["Error"])
    assert set(body) <= {"detail", "errors"}, body
    assert isinstance(body["detail"], str) and body["detail"], body
    for field, messages in body.get("errors", {}).items():
        assert isinstance(field, str) and messages and all(isinstance(m, str) for m in messages), body


# --- the schema ----------------------------------------------------------------------------------


def test_the_schema_generates_without_warnings_and_validates(tmp_path):
    # --fail-on-warn turns any warning into an error; --validate checks against the OpenAPI spec.
    call_command(
        "spectacular",
        "--fail-on-warn",
        "--validate",
        "--file",
        str(tmp_path / "schema.yaml"),
        stderr=StringIO(),
    )
    assert (tmp_path / "schema.yaml").read_text().startswith("openapi:")


def test_every_operation_declares_its_errors_with_the_one_error_component(schema):
    error_ref = {"$ref": "#/components/schemas/Error"}
    assert "Error" in schema["components"]["schemas"]
    assert not [name for name in schema["components"]["schemas"] if "Error" in name and name != "Error"]
    operations = 0
    for path, item in schema["paths"].items():
        for method in set(item) & set(METHODS):
            operation, operations = item[method], operations + 1
            declared = {int(code) for code in operation["responses"] if code.startswith("4")}
            where = f"{method.upper()} {path}"
            assert {401, 403} <= declared, where  # every operation needs a session or a token
            assert 405 in declared, where  # no path takes every method
            if "requestBody" in operation:
                assert {400, 415} <= declared, where
            if any(p["in"] == "query" for p in operation.get("parameters", [])):
                assert 400 in declared, where
            if "{" in path:
                assert 404 in declared, where
            for code in declared:
                content = operation["responses"][str(code)]["content"]
                assert content == {"application/json": {"schema": error_ref}}, (where, code)
    assert operations >= 20
    assert "409" in schema["paths"]["/api/tasks/"]["post"]["responses"]


# --- the answers -----------------------------------------------------------------------------------


def test_error_answers_are_declared_by_their_operation_and_have_the_error_shape(schema, clients):
    task, _ = task_submit(
        submission=TaskSubmission(text="What is 2 + 2?", idempotency_key="k-1"), source="cli"
    )
    operator, auditor, ml = clients[Role.OPERATOR], clients[Role.AUDITOR], clients[Role.ML_STAFF]
    admin = clients[Role.ADMIN]  # a method no view lists is for admins: others get 403 before 405
    cases = [
        # label, client, method, path, body / options, expected status
        ("bad body", operator, "post", "/api/tasks/", {"data": {"max_usd": "lots"}}, 400),
        ("bad training body", ml, "post", "/api/training/jobs/", {"data": {"backend": "sklearn"}}, 400),
        ("refused by the service", ml, "post", "/api/training/conductors/rollback/", {}, 400),
        ("invalid filter", ml, "get", "/api/training/jobs/", {"data": {"status": "nonsense"}}, 400),
        ("anonymous", clients["anonymous"], "get", "/api/tasks/", {}, 403),
        ("anonymous write", clients["anonymous"], "post", "/api/training/jobs/", {"data": {}}, 403),
        ("bad token", clients["bad-token"], "get", "/api/workers/", {}, 403),
        ("forbidden role", auditor, "post", "/api/tasks/", {"data": {"text": "What is 3 + 3?"}}, 403),
        ("forbidden training role", operator, "get", "/api/training/jobs/", {}, 403),
        ("unknown task", auditor, "get", f"/api/tasks/{uuid.uuid4()}/", {}, 404),
        ("not an id", auditor, "get", "/api/tasks/not-a-uuid/", {}, 404),
        ("unknown worker", auditor, "get", "/api/workers/no-such-worker/", {}, 404),
        ("unknown job", ml, "get", "/api/training/jobs/999999/", {}, 404),
        ("unknown conductor", ml, "post", "/api/training/conductors/no-such/promote/", {}, 404),
        ("invalid cursor", auditor, "get", "/api/tasks/", {"data": {"cursor": "not-a-cursor"}}, 404),
        ("wrong method", admin, "delete", f"/api/tasks/{task.pk}/", {}, 405),
        ("wrong training method", admin, "put", "/api/training/jobs/", {"data": {}}, 405),
        (
            "conflict",
            operator,
            "post",
            "/api/tasks/",
            {"data": {"text": "Something else", "idempotency_key": "k-1"}},
            409,
        ),
        (
            "media type",
            operator,
            "post",
            "/api/tasks/",
            {"data": "text=hello", "content_type": "text/plain"},
            415,
        ),
        (
            "body over the limit",
            operator,
            "post",
            "/api/tasks/",
            {"data": json.dumps({"text": "x" * 3_000_000}), "content_type": "application/json"},
            413,
        ),
        ("accept", auditor, "get", "/api/tasks/", {"HTTP_ACCEPT": "application/xml"}, 406),
    ]
    for label, client, method, path, options, expected in cases:
        if method != "get" and "content_type" not in options and "data" in options:
            options = {**options, "format": "json"}
        response = getattr(client, method)(path, **options)

        assert response.status_code == expected, (label, response.status_code, response.content[:300])
        item = operation_for(schema, path)
        if expected == 405:
            assert method not in item, label
            assert all("405" in item[m]["responses"] for m in set(item) & set(METHODS)), label
        else:
            assert str(expected) in item[method]["responses"], (label, f"{method.upper()} {path}")
        assert_error_shape(schema, response.json())


def test_validation_errors_name_each_field_in_errors_and_in_the_sentence(clients):
    response = clients[Role.OPERATOR].post(
        "/api/tasks/", {"text": "ok", "max_steps": 0, "scorer": "vibes"}, format="json"
    )

    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"detail", "errors"}
    assert body["errors"] == {
        "max_steps": ["Ensure this value is greater than or equal to 1."],
        "scorer": ['"vibes" is not a valid choice.'],
    }
    assert body["detail"] == (
        'Invalid input: max_steps: Ensure this value is greater than or equal to 1.; scorer: "vibes" is '
        "not a valid choice."
    )


def test_nested_validation_errors_are_flattened_to_dotted_fields(clients):
    response = clients[Role.ML_STAFF].post(
        "/api/training/datasets/",
        {"name": "crux", "reward": {"correctness": "much"}, "batch_ids": [1, "x"]},
        format="json",
    )

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors["reward.correctness"] == ["A valid number is required."]
    assert errors["batch_ids.1"] == ["A valid integer is required."]


def test_errors_that_are_not_validation_errors_carry_only_a_detail(clients):
    response = clients[Role.OPERATOR].get("/api/training/jobs/")

    assert response.status_code == 403
    assert response.json() == {"detail": "your role does not allow this"}
