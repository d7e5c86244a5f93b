"""Saved views of the task list: a set of its filters under a name, opened (and shared) by URL.

Saving is a state change: the view and its audit event are one transaction. Its query is read by the
task list's own filter (operations.tasks.filters.TaskFilter) before it is stored, so a view opens the list it
was saved from or is refused, with the reason, when saved.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import QueryDict
from django.urls import reverse

from audit.actions import Action
from audit.services import Actor, event_record
from operations.tasks.filters import TaskFilter
from routing.hashing import content_hash
from routing.models import SavedView, Task
from utilities import params

NOT_FILTERS = ("cursor",)  # a page of the list, not what it selects


def saved_query(query: str) -> str:
    """`query` as a view stores it: the task list's filters only, each given once and valid."""
    if len(query) > SavedView.QUERY_MAX:
        raise params.InvalidParameter("query", f"is longer than {SavedView.QUERY_MAX} characters")
    data = QueryDict(query, mutable=True)
    for name in NOT_FILTERS:
        data.pop(name, None)
    unknown = sorted(set(data) - set(TaskFilter.base_filters))
    if unknown:
        raise params.InvalidParameter("query", f"{', '.join(unknown)}: not a filter of the task list")
    repeated = sorted(name for name in data if len(data.getlist(name)) > 1)
    if repeated:
        raise params.InvalidParameter("query", f"{', '.join(repeated)}: given more than once")
    TaskFilter(data, Task.objects.none()).is_valid()  # a bad value: InvalidParameter, with its reason
    return data.urlencode()


def view_save(*, user: Any, name: str, query: str, shared: bool) -> SavedView:
    """Store a view of the task list (its audit event in the same transaction)."""
    name = params.text({"name": name}, "name", max_length=SavedView.NAME_MAX)
    if not name:
        raise params.InvalidParameter("name", "is required: name the view")
    query = saved_query(query)
    with transaction.atomic():
        view = SavedView.objects.create(name=name, owner=user, query=query, shared=shared)
        event_record(
            actor=Actor.for_user(user), action=Action.VIEW_SAVED, obj=view, payload=view_saved_payload(view)
        )
    return view


def view_saved_payload(view: SavedView) -> dict[str, Any]:
    """What `view.saved` records of a view: the one definition, which verification compares the view's
    row with (operations.saved_views.row_check). The filters by name; the query itself by its hash: a search
    may quote a task's words."""
    return {
        "name": view.name,
        "shared": view.shared,
        "filters": sorted(QueryDict(view.query)),
        "query_sha256": content_hash(view.query),
    }


def visible_views(user: Any) -> QuerySet[SavedView]:
    """The views a user may open: their own, and those shared."""
    return SavedView.objects.filter(Q(owner=user) | Q(shared=True)).select_related("owner")


def list_url(query: str) -> str:
    url = reverse("routing:task-list")
    return f"{url}?{query}" if query else url


def reverse_view(view: SavedView) -> str:
    return reverse("routing:view-open", args=[view.pk])
