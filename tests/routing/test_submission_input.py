"""What a task submission may contain, the same on every path: the web form, the REST API, the service.

- A form body that is not valid UTF-8 is refused (400), never stored with replacement characters.
- The limits (max_usd, max_steps, max_depth, the text's length, the idempotency key's) are
  routing.limits': the form and the API refuse the same values with the same messages.
- An idempotency key in the body and a different one in the Idempotency-Key header is a 400.
"""

from __future__ import annotations

import html
from decimal import Decimal
from urllib.parse import urlencode

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from routing import limits
from routing.models import Task
from routing.services import SubmissionError, TaskSubmission, task_submit

pytestmark = pytest.mark.django_db

TASKS = "/api/tasks/"
FORM_URL = "/tasks/new/"
FORM_TYPE = "application/x-www-form-urlencoded"
FORM = {
    "text": "What is 6 * 7?",
    "reference": "",
    "scorer": "auto",
    "classification": "internal",
    "max_steps": "4",
    "max_depth": "1",
    "max_usd": "0.50",
    "idempotency_key": "",
}


@pytest.fixture
def operator(make_user):
    return make_user("ada", Role.OPERATOR)


@pytest.fixture
def web(operator) -> Client:
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def api(operator) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=operator, role=Role.OPERATOR).key}")
    return client


def form_body(**fields: str) -> bytes:
    return urlencode({**FORM, **fields}).encode()


# --- invalid UTF-8 -------------------------------------------------------------------------------

NOT_UTF8 = [
    # how the text field arrives: percent-escapes of invalid bytes, raw invalid bytes
    pytest.param(form_body(text="XX").replace(b"XX", b"caf%E9"), id="percent-escaped"),
    pytest.param(form_body(text="XX").replace(b"XX", b"caf\xe9"), id="raw-bytes"),
    pytest.param(form_body(text="XX").replace(b"XX", b"%C3%28"), id="truncated-sequence"),
]


@pytest.mark.parametrize("body", NOT_UTF8)
def test_the_web_form_refuses_a_body_that_is_not_utf8(web, body):
    response = web.post(FORM_URL, data=body, content_type=FORM_TYPE)

    assert response.status_code == 400
    assert "The form field 'text' is not valid UTF-8" in html.unescape(response.content.decode())
    assert not Task.objects.exists()


@pytest.mark.parametrize("body", NOT_UTF8)
def test_the_api_refuses_a_form_body_that_is_not_utf8(api, body):
    response = api.post(TASKS, data=body, content_type=FORM_TYPE)

    assert response.status_code == 400
    assert response.json() == {
        "detail": "The form field 'text' is not valid UTF-8: send the form encoded as UTF-8."
    }
    assert not Task.objects.exists()


def test_the_api_refuses_a_multipart_field_that_is_not_utf8(api):
    body = b'--XyZ\r\nContent-Disposition: form-data; name="text"\r\n\r\ncaf\xe9 au lait\r\n--XyZ--\r\n'

    response = api.post(TASKS, data=body, content_type="multipart/form-data; boundary=XyZ")

    assert response.status_code == 400
    assert "'text' is not valid UTF-8" in response.json()["detail"]
    assert not Task.objects.exists()


def test_the_api_refuses_a_json_body_that_is_not_utf8(api):
    response = api.post(TASKS, data=b'{"text": "caf\xe9"}', content_type="application/json")

    assert response.status_code == 400
    assert "utf-8" in response.json()["detail"].lower()
    assert not Task.objects.exists()


def test_a_replacement_character_the_user_typed_is_kept(web, api):
    # U+FFFD sent as valid UTF-8 is text like any other: only invalid bytes are refused.
    response = web.post(FORM_URL, data=form_body(text="broken \ufffd glyph"), content_type=FORM_TYPE)
    assert response.status_code == 302
    multipart = api.post(TASKS, {"text": "another \ufffd glyph"}, format="multipart")
    assert multipart.status_code == 201, multipart.content

    assert sorted(Task.objects.values_list("text", flat=True)) == [
        "another \ufffd glyph",
        "broken \ufffd glyph",
    ]


# --- limits --------------------------------------------------------------------------------------

OVER_THE_LIMITS = [
    ("max_usd", "9999999999", "Ensure this value is less than or equal to 100000."),
    ("max_usd", "100000.01", "Ensure this value is less than or equal to 100000."),
    ("max_usd", "-0.01", "Ensure this value is greater than or equal to 0."),
    ("max_steps", "101", "Ensure this value is less than or equal to 100."),
    ("max_steps", "0", "Ensure this value is greater than or equal to 1."),
    ("max_depth", "6", "Ensure this value is less than or equal to 5."),
    ("max_depth", "-1", "Ensure this value is greater than or equal to 0."),
    ("idempotency_key", "k" * 201, "Ensure this value has at most 200 characters (it has 201)."),
    ("text", "x" * 101, "At most 100 characters. The task text has 101."),
]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    OVER_THE_LIMITS,
    ids=[f"{field}={value[:12]}" for field, value, _ in OVER_THE_LIMITS],
)
def test_the_form_and_the_api_refuse_the_same_values_with_the_same_message(
    web, api, settings, field, value, message
):
    settings.CONDUCTOR_MAX_TASK_CHARS = 100

    page = web.post(FORM_URL, {**FORM, field: value})
    answer = api.post(TASKS, {**FORM, field: value}, format="json")

    assert page.status_code == 200, f"the form accepted {field}={value!r}"
    assert page.context["form"].errors[field] == [message]
    assert answer.status_code == 400, f"the API accepted {field}={value!r}"
    assert answer.json()["errors"][field] == [message]
    assert not Task.objects.exists()


def test_the_largest_allowed_budgets_pass_both_paths(web, api):
    top = {
        "max_usd": str(limits.MAX_USD),
        "max_steps": str(limits.MAX_STEPS),
        "max_depth": str(limits.MAX_DEPTH),
    }

    assert web.post(FORM_URL, {**FORM, **top}).status_code == 302
    assert api.post(TASKS, {**FORM, **top, "text": "Another task"}, format="json").status_code == 201
    assert list(Task.objects.values_list("max_usd", flat=True)) == [limits.MAX_USD, limits.MAX_USD]


def test_the_service_refuses_budgets_over_the_limits_for_other_callers():
    with pytest.raises(
        SubmissionError, match=r"^max_usd: Ensure this value is less than or equal to 100000\.$"
    ):
        task_submit(
            submission=TaskSubmission(text="What is 2 + 2?", max_usd=Decimal("9999999999")),
            source=Task.Source.CLI,
        )
    with pytest.raises(SubmissionError, match=r"^max_depth: "):
        task_submit(submission=TaskSubmission(text="What is 2 + 2?", max_depth=6), source=Task.Source.CLI)
    assert not Task.objects.exists()


# --- the idempotency key -------------------------------------------------------------------------


def test_a_body_key_and_a_different_header_key_are_refused_naming_both(api):
    response = api.post(
        TASKS,
        {"text": "What is 2 + 2?", "idempotency_key": "body-key"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="header-key",
    )

    assert response.status_code == 400
    body = response.json()
    assert "'body-key'" in body["detail"] and "'header-key'" in body["detail"]
    assert body["errors"] == {
        "idempotency_key": [
            "the idempotency_key field ('body-key') and the Idempotency-Key header ('header-key') differ; "
            "send one key, or the same key in both"
        ]
    }
    assert not Task.objects.exists()


def test_the_same_key_in_the_body_and_the_header_is_one_key(api):
    first = api.post(
        TASKS,
        {"text": "What is 2 + 2?", "idempotency_key": "same"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="same",
    )
    again = api.post(TASKS, {"text": "What is 2 + 2?"}, format="json", HTTP_IDEMPOTENCY_KEY="same")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Task.objects.get().idempotency_key == "same"
