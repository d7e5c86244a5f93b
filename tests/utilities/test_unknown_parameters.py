"""One rule for every list, page and API alike: a bad value is a 400 naming the parameter, and so is a
parameter the page or endpoint does not read (never ignored, which would show an unfiltered list
under a filter's name). What a list reads passes: its filters, its cursor and page size, the API's
format. The admin site keeps its own query."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.http import QueryDict
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Role
from audit.grants import token_create
from utilities.params import AskedQuery

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_session(make_user) -> Client:
    client = Client()
    client.force_login(make_user("ada", Role.ADMIN))
    return client


@pytest.fixture
def api(make_user) -> APIClient:
    client = APIClient()
    user = make_user("otto", Role.OPERATOR)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token_create(user=user, role=Role.OPERATOR).key}")
    return client


def reason(response) -> str:
    if response["Content-Type"].startswith("application/json"):
        return response.json()["detail"]
    found = re.search(r'id="bad-request-reason">(.*?)</p>', response.content.decode(), re.S)
    assert found, response.content.decode()[:500]
    return unescape(found.group(1))


# --- the rule itself ------------------------------------------------------------------------------


def test_an_asked_query_notes_what_was_asked_and_not_what_a_copy_was_asked():
    query = AskedQuery.of(QueryDict("a=1&b=2&b=3&c="))

    assert query.get("a") == "1" and query.getlist("b") == ["2", "3"]
    query.copy().get("c")
    assert "zz" not in query

    assert query.unasked() == ["c"]
    assert query.asked == {"a", "b", "zz"}
    with pytest.raises(AttributeError):
        query["d"] = "read-only, as Django's own"  # type: ignore[index]


# --- the cases of the report ------------------------------------------------------------------------


def test_the_overview_refuses_an_unknown_range_naming_it(admin_session):
    response = admin_session.get("/ops/", {"range": "xyz"})

    assert response.status_code == 400
    assert reason(response).startswith("'range' is not a query parameter of /ops/; it reads ")
    assert "minutes" in reason(response) and "period" in reason(response)


def test_the_annotations_api_refuses_a_bad_date_and_an_unknown_author(api):
    bad_date = api.get("/api/annotations/", {"since": "2026-13-45"})
    unknown = api.get("/api/annotations/", {"author": "zz"})

    assert bad_date.status_code == 400
    assert reason(bad_date).startswith("since: '2026-13-45' is not a date")
    assert unknown.status_code == 400
    assert reason(unknown).startswith("'author' is not a query parameter of /api/annotations/; it reads ")


def test_several_unknown_parameters_are_named_together(api):
    response = api.get("/api/tasks/?colour=red&shape=round&status=queued")

    assert response.status_code == 400
    assert reason(response).startswith("'colour', 'shape' are not query parameters of /api/tasks/")


@pytest.mark.parametrize("path", ["/", "/attempts/", "/analytics/", "/review/", "/audit/", "/audit/vendors/"])
def test_every_list_page_refuses_an_unknown_parameter(admin_session, path):
    response = admin_session.get(path, {"zz": "1"})

    assert response.status_code == 400
    assert reason(response).startswith(f"'zz' is not a query parameter of {path}")


@pytest.mark.parametrize(
    "path", ["/api/tasks/", "/api/workers/", "/api/annotations/", "/api/audit/events/", "/api/training/jobs/"]
)
def test_every_list_api_refuses_an_unknown_parameter(admin_session, path):
    response = admin_session.get(path, {"zz": "1"})

    assert response.status_code == 400
    body = response.json()
    assert list(body) == ["detail"]  # the API's one error shape
    assert body["detail"].startswith(f"'zz' is not a query parameter of {path}; it reads ")
    assert "format" in body["detail"]  # the API reads it everywhere


# --- what still passes ----------------------------------------------------------------------------


def test_a_lists_own_filters_pagination_and_format_pass(api):
    assert api.get("/api/tasks/", {"status": "queued", "page_size": "5", "format": "json"}).status_code == 200
    assert api.get("/api/annotations/", {"since": "2026-01-01", "until": "2026-12-31"}).status_code == 200
    first = api.get("/api/annotations/", {"page_size": "1"}).json()
    assert first["next"] is None  # no annotations: no next page
    assert api.get("/api/tasks/", {"cursor": "not-one-issued"}).status_code == 404


@pytest.mark.parametrize(
    "path", ["/", "/attempts/", "/analytics/", "/review/", "/audit/", "/audit/vendors/", "/audit/policies/"]
)
def test_a_filter_form_sent_as_the_browser_sends_it_passes(admin_session, path):
    """Every field of the page's GET form, empty (a browser sends them all): each is read by the page."""
    html = admin_session.get(path).content.decode()
    form = re.search(r'<form class="filters" method="get">(.*?)</form>', html, re.S)
    assert form, f"{path} has no filter form"
    names = sorted(set(re.findall(r'<(?:input|select)[^>]*\bname="([^"]+)"', form.group(1))))
    assert names

    response = admin_session.get(path, dict.fromkeys(names, ""))

    assert response.status_code == 200, f"{path}?{names}: {reason(response)}"


def test_a_post_is_not_refused_for_its_query(admin_session):
    """Only reads are checked: a POST's query string is not the form it sends."""
    response = admin_session.post("/review/?zz=1")

    assert response.status_code == 200


def test_the_admin_site_keeps_its_own_query(admin_session):
    response = admin_session.get("/admin/routing/worker/", {"o": "1", "q": "gpt"})

    assert response.status_code == 200
