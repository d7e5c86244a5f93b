"""Time ranges on the task list, its API and the pages whose windows follow it; saved views of the
task list; the analytics charts' buckets."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Role
from audit.models import AuditEvent
from routing.models import SavedView, Task
from routing.services import TaskSubmission, task_submit

pytestmark = pytest.mark.django_db


def submit(text: str, created_at: datetime) -> Task:
    task, _ = task_submit(submission=TaskSubmission(text=text), source=Task.Source.CLI)
    Task.objects.filter(pk=task.pk).update(created_at=created_at)
    return task


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def operator(make_user):
    return make_user("grace", Role.OPERATOR)


@pytest.fixture
def auditor(make_user):
    return make_user("ada", Role.AUDITOR)


@pytest.fixture
def dated_tasks():
    """Three tasks, submitted at 08:00, 10:00 and 12:00 UTC on 2026-03-01."""
    return {
        hour: submit(f"Task submitted at {hour}:00", datetime(2026, 3, 1, hour, tzinfo=UTC))
        for hour in (8, 10, 12)
    }


def shown_ids(client: Client, url: str) -> set[str]:
    response = client.get(url)
    assert response.status_code == 200, response.content[:300]
    return set(re.findall(r'href="/tasks/([0-9a-f-]{36})/"', response.content.decode()))


def links(html: str, css_class: str) -> list[str]:
    return [unescape(h) for h in re.findall(rf'class="{css_class}" href="([^"]*)"', html)]


# --- the task list and its API ---------------------------------------------------------------------


def test_the_task_list_is_filtered_by_a_range_with_zones(operator, dated_tasks):
    client = logged_in(operator)
    # 10:30+02:00 is 08:30 UTC: the tasks of 10:00 and 12:00; until 13:00+02:00 (11:00 UTC) keeps 10:00.
    ids = shown_ids(client, "/?since=2026-03-01T10:30%2B02:00&until=2026-03-01T13:00%2B02:00")
    assert ids == {str(dated_tasks[10].pk)}
    page = client.get("/?since=2026-03-01T10:30%2B02:00").content.decode()
    # The range applied is said above the list, in UTC.
    assert re.search(r'id="filtered-by">Filtered by since <strong>2026-03-01 08:30:00 UTC</strong>', page)
    # A day as `until` runs to its end; without a zone a time is UTC.
    assert shown_ids(client, "/?until=2026-03-01") == {str(t.pk) for t in dated_tasks.values()}
    assert shown_ids(client, "/?since=2026-03-01T11:00") == {str(dated_tasks[12].pk)}


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("since=yesterday", "since: 'yesterday' is not a date"),
        ("until=2026-02-30", "until: '2026-02-30' is not a date"),
        ("since=2026-01-01T10:00%2B99:00", "since:"),
        ("since=2026-03-02&until=2026-03-01", "until: is before the start of the period"),
    ],
)
def test_a_bad_range_is_refused_with_its_reason(operator, query, reason):
    client = logged_in(operator)
    page = client.get(f"/?{query}")
    assert page.status_code == 400 and reason in unescape(page.content.decode())
    api = client.get(f"/api/tasks/?{query}")
    assert api.status_code == 400 and api.json()["detail"].startswith(reason)


def test_the_api_lists_tasks_in_a_range(operator, dated_tasks):
    client = logged_in(operator)
    body = client.get(
        "/api/tasks/", {"since": "2026-03-01T09:00:00-01:00", "until": "2026-03-01T12:00Z"}
    ).json()
    # 09:00-01:00 is 10:00 UTC (kept: the start is inclusive); 12:00 UTC is excluded (the end is not).
    assert [t["id"] for t in body["results"]] == [str(dated_tasks[10].pk)]
    schema = client.get("/api/schema/?format=json").json()
    names = {p["name"] for p in schema["paths"]["/api/tasks/"]["get"]["parameters"]}
    assert {"since", "until"} <= names


def test_quick_ranges_set_since_and_keep_the_other_filters(operator, dated_tasks):
    client = logged_in(operator)
    before = timezone.now()
    page = client.get("/?status=queued&until=2026-03-01").content.decode()
    quick = links(page, "range-quick")
    assert len(quick) == 5
    lengths = [
        timedelta(minutes=15),
        timedelta(hours=1),
        timedelta(hours=24),
        timedelta(days=7),
        timedelta(days=30),
    ]
    for href, length in zip(quick, lengths, strict=True):
        query = parse_qs(urlsplit(href).query)
        assert query["status"] == ["queued"] and "until" not in query and "cursor" not in query
        since = datetime.fromisoformat(query["since"][0])
        assert since.tzinfo is not None
        assert abs(since - (before - length)) < timedelta(seconds=5)
    for label in ("Last 15 minutes", "Last hour", "Last 24 hours", "Last 7 days", "Last 30 days"):
        assert label in page
    # Followed, a quick range selects the recent tasks only.
    recent = submit("Submitted just now", timezone.now())
    assert shown_ids(client, quick[1]) == {str(recent.pk)}


# --- the range carried to the other pages ----------------------------------------------------------

RANGE = {"since": "2026-03-01T10:30:00+02:00", "until": "2026-03-02"}


def carries_the_range(href: str) -> bool:
    query = parse_qs(urlsplit(href).query)
    return query.get("since") == [RANGE["since"]] and query.get("until") == [RANGE["until"]]


@pytest.mark.parametrize("path", ["/", "/attempts/", "/analytics/", "/audit/vendors/"])
def test_links_to_the_other_pages_keep_the_range(make_user, path):
    client = logged_in(make_user("root", Role.ADMIN))
    page = client.get(path, RANGE)
    assert page.status_code == 200
    html = page.content.decode()
    pages = links(html, "range-page")
    wanted = {"/", "/attempts/", "/analytics/", "/audit/vendors/"}
    assert {urlsplit(h).path for h in pages} == wanted
    assert all(carries_the_range(h) for h in pages)
    # The navigation too.
    for target in ("/", "/analytics/", "/audit/vendors/"):
        nav = [
            unescape(h)
            for h in re.findall(rf'<a (?:class="brand" )?href="({re.escape(target)}\?[^"]*)"', html)
        ]
        assert any(carries_the_range(h) for h in nav), f"the nav link to {target} from {path}"


def test_pages_without_a_range_link_plainly_and_keep_their_own_parameters(operator, auditor):
    html = logged_in(operator).get("/analytics/", {"classification": "public"}).content.decode()
    assert links(html, "range-page") == []  # no range: nothing to carry
    assert 'href="/analytics/"' in html  # the nav
    quick = links(html, "range-quick")
    assert len(quick) == 5 and all("classification=public" in h for h in quick)
    vendors = logged_in(auditor).get("/audit/vendors/", {"vendor": "openai", "classification": "public"})
    quick = links(vendors.content.decode(), "range-quick")
    assert len(quick) == 5 and all("vendor=openai" in h and "classification=public" in h for h in quick)
    # An auditor-only page is linked to auditors only.
    html = logged_in(operator).get("/attempts/", RANGE).content.decode()
    assert "/audit/vendors/" not in html


# --- saved views -----------------------------------------------------------------------------------


def test_a_view_is_saved_with_its_audit_event_listed_and_opened(operator, make_user):
    client = logged_in(operator)
    query = "status=queued&since=2026-03-01T10%3A30%3A00%2B02%3A00&cursor=xyz"
    response = client.post("/views/", {"name": "Queued <b>today</b>", "query": query})
    view = SavedView.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/?{view.query}"
    assert view.owner == operator and not view.shared
    assert parse_qs(view.query) == {"status": ["queued"], "since": ["2026-03-01T10:30:00+02:00"]}
    event = AuditEvent.objects.get(action="view.saved")
    assert event.object_id == str(view.pk) and event.actor_name == "grace"
    assert event.payload["filters"] == ["since", "status"] and event.payload["shared"] is False

    page = client.get("/").content.decode()
    assert f'href="/views/{view.pk}/"' in page and "Queued &lt;b&gt;today&lt;/b&gt;" in page
    opened = client.get(f"/views/{view.pk}/")
    assert opened.status_code == 302 and opened["Location"] == f"/?{view.query}"

    # Someone else neither sees nor opens it until it is shared.
    other = logged_in(make_user("alan", Role.AUDITOR))
    assert f"/views/{view.pk}/" not in other.get("/").content.decode()
    assert other.get(f"/views/{view.pk}/").status_code == 404
    client.post("/views/", {"name": "Shared", "query": "source=cli", "shared": "on"})
    shared = SavedView.objects.get(name="Shared")
    assert shared.shared
    assert other.get(f"/views/{shared.pk}/")["Location"] == "/?source=cli"
    assert "shared by grace" in other.get("/").content.decode()


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        ({"name": "x", "query": "since=yesterday"}, "since: 'yesterday' is not a date"),
        ({"name": "x", "query": "status=nope"}, "status: 'nope' is not one of"),
        ({"name": "x", "query": "chart=cost_by_worker"}, "query: chart: not a filter of the task list"),
        ({"name": "x", "query": "status=queued&status=failed"}, "query: status: given more than once"),
        ({"name": "", "query": "status=queued"}, "name: is required"),
        ({"name": "x" * 101, "query": ""}, "name: is longer than 100 characters"),
    ],
)
def test_a_bad_view_is_refused_with_its_reason_and_not_stored(operator, form, reason):
    response = logged_in(operator).post("/views/", form, follow=True)
    # Back on the task list (as it was, when only the name was wrong), with the reason.
    assert response.status_code == 200 and response.redirect_chain[-1][0].startswith("/")
    assert f"Not saved: {reason}" in unescape(response.content.decode())
    assert not SavedView.objects.exists()
    assert not AuditEvent.objects.filter(action="view.saved").exists()


def test_only_roles_that_read_tasks_save_views(make_user):
    assert logged_in(make_user("nobody")).post("/views/", {"name": "x", "query": ""}).status_code == 403
    assert Client().post("/views/", {"name": "x", "query": ""})["Location"].startswith("/login/")
    assert not SavedView.objects.exists()


# --- analytics buckets ------------------------------------------------------------------------------


def bucket_s(client: Client, query: dict[str, str]) -> int:
    response = client.get("/analytics/", query)
    assert response.status_code == 200, response.content[:300]
    return int(re.search(r'id="chart-cost-worker" data-bucket-s="(\d+)"', response.content.decode())[1])


def test_analytics_buckets_follow_the_range_or_the_choice(operator):
    client = logged_in(operator)
    two_days = {"since": "2026-03-01", "until": "2026-03-02"}  # two whole days
    assert bucket_s(client, two_days) == 3600
    assert bucket_s(client, {"since": "2026-03-01", "until": "2026-03-03"}) == 86400
    assert bucket_s(client, {}) == 86400  # the default week
    assert bucket_s(client, {**two_days, "bucket": "day"}) == 86400
    assert bucket_s(client, {"since": "2026-03-01", "until": "2026-03-20", "bucket": "hour"}) == 3600
    page = client.get("/analytics/", {**two_days, "bucket": "day"}).content.decode()
    assert "in daily buckets" in page and '<option value="day" selected>' in page
    refused = client.get("/analytics/", {"since": "2026-01-01", "until": "2026-03-01", "bucket": "hour"})
    assert refused.status_code == 400 and "bucket: hourly buckets cover at most 31 days" in unescape(
        refused.content.decode()
    )
    assert client.get("/analytics/", {"bucket": "week"}).status_code == 400
