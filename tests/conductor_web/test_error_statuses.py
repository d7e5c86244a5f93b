"""Every error status has an answer a person can read: a page in the site's layout for a browser, the
API's `{"detail": ...}` for the API and JSON clients. Django's bare answers (require_POST's 405 has no
body) get one, with their headers (Allow) kept."""

from __future__ import annotations

import pytest
from django.http import HttpResponse, HttpResponseNotAllowed
from django.test import RequestFactory

from accounts.models import Role
from conductor_web.error_views import ErrorPageMiddleware

pytestmark = pytest.mark.django_db

POST_ONLY_PAGES = ["/training/rollouts/", "/training/datasets/build/"]


@pytest.fixture
def staff(client, make_user):
    client.force_login(make_user("mira", Role.ML_STAFF))
    return client


@pytest.mark.parametrize("path", POST_ONLY_PAGES)
def test_get_on_a_post_only_page_answers_405_with_a_page_of_the_site(staff, path):
    response = staff.get(path)

    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert 'href="/static/css/app.css"' in html and "Log out" in html  # the site's layout
    assert 'id="error-status"' in html and "405" in html
    assert f"GET is not allowed at {path}; it takes POST only." in html


@pytest.mark.parametrize("path", POST_ONLY_PAGES)
def test_a_signed_out_browser_gets_the_page_too(client, path):
    response = client.get(path)

    assert response.status_code == 405 and response["Allow"] == "POST"
    assert "it takes POST only." in response.content.decode()


def test_a_json_client_gets_the_apis_error_shape(staff):
    response = staff.get(POST_ONLY_PAGES[0], HTTP_ACCEPT="application/json")

    assert response.status_code == 405 and response["Allow"] == "POST"
    assert response.json() == {"detail": "GET is not allowed at /training/rollouts/; it takes POST only."}


def test_the_apis_own_405_is_kept(client, make_user):
    client.force_login(make_user("mira", Role.ML_STAFF))

    response = client.get("/api/training/jobs/1/cancel/")

    assert response.status_code == 405
    assert response.json() == {"detail": 'Method "GET" not allowed.'}


@pytest.mark.parametrize(
    ("bare", "sentence"),
    [
        (HttpResponse(status=410), "Gone"),
        (HttpResponse(status=429), "Too Many Requests"),
        (HttpResponse(status=503), "Service Unavailable"),
        (HttpResponseNotAllowed(["GET", "POST"]), "it takes GET, POST only."),
    ],
    ids=["410", "429", "503", "405"],
)
def test_any_bare_error_status_gets_a_page_and_keeps_its_headers(make_user, bare, sentence):
    bare["Retry-After"] = "5"
    request = RequestFactory().get("/anywhere/")
    request.user = make_user("otto", Role.OPERATOR)

    response = ErrorPageMiddleware(lambda _request: bare)(request)

    assert response.status_code == bare.status_code
    assert response["Retry-After"] == "5"
    html = response.content.decode()
    assert sentence in html and str(bare.status_code) in html and "Log out" in html


def test_an_error_with_a_body_is_left_as_it_is(rf):
    answer = HttpResponse("already explained", status=409)

    assert ErrorPageMiddleware(lambda _request: answer)(rf.get("/x/")) is answer
