"""The audit log's page: django-filter's FilterSet and DRF's cursor, as in the API. Its "Older events"
link walks every matching event once, newest first, and keeps the filters; a bad filter or a cursor
the page never issued is refused."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.models import Role
from audit.actions import Action
from audit.models import AuditEvent
from audit.services import Actor, event_record
from compliance.pagination import EventCursorPagination

pytestmark = pytest.mark.django_db


@pytest.fixture
def auditor(client, make_user):
    client.force_login(make_user("ada", Role.AUDITOR))
    return client


def record(n: int, action: str) -> None:
    user = get_user_model().objects.create_user(f"subject-{action}-{n}")
    with transaction.atomic():
        for _ in range(n):
            event_record(actor=Actor.service("test"), action=action, obj=user)


def walk(client, url: str) -> list[int]:
    seen: list[int] = []
    for _ in range(10):
        response = client.get(url)
        assert response.status_code == 200, response.content[:300]
        seen += [e.pk for e in response.context["events"]]
        if not response.context["next_page"]:
            return seen
        assert response.context["next_page"].startswith("?")
        url = "/audit/" + response.context["next_page"]
    raise AssertionError("more pages than events")


def test_the_older_events_link_walks_every_matching_event_once_newest_first_and_keeps_the_filters(auditor):
    size = EventCursorPagination.page_size
    record(size + 20, Action.USER_CREATED)
    record(30, Action.USER_DELETED)
    wanted = list(
        AuditEvent.objects.filter(action=Action.USER_DELETED).order_by("-id").values_list("pk", flat=True)
    )
    everything = list(AuditEvent.objects.order_by("-id").values_list("pk", flat=True))
    assert len(everything) > size + 50

    assert walk(auditor, "/audit/") == everything  # several pages, each event once, newest first
    filtered = walk(auditor, f"/audit/?action={Action.USER_DELETED}&page_size=7")  # 5 pages of 7
    assert filtered == wanted


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("action=a%01b", 400),
        ("since=2026-02-30", 400),
        ("since=2026-05-02&until=2026-05-01", 400),
        ("task=not-a-uuid", 400),
        ("page_size=0", 400),
        ("cursor=no-such-page", 404),
    ],
)
def test_a_bad_filter_or_cursor_is_refused(auditor, query, status):
    response = auditor.get(f"/audit/?{query}")
    assert response.status_code == status
