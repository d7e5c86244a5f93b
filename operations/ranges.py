"""Time ranges across the pages: the quick ranges a user picks in one click, and the range (since,
until) that links to the other pages carry, so that moving from the task list to the provider calls,
analytics or the vendor report keeps the window. Each page reads the range with utilities.params.moment
(through utilities.filters.moment on the lists), which refuses a bad value with its reason."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.http import QueryDict

RANGE_PARAMS = ("since", "until")
QUICK_RANGES = (
    ("15 minutes", timedelta(minutes=15)),
    ("hour", timedelta(hours=1)),
    ("24 hours", timedelta(hours=24)),
    ("7 days", timedelta(days=7)),
    ("30 days", timedelta(days=30)),
)
# A quick range starts the list afresh: its first page (cursor), up to now (until), on the page (chart:
# a CSV download).
RESTARTED = ("cursor", "chart", "until")


def quick_links(query: QueryDict, now: datetime) -> list[dict[str, str]]:
    """A query string for each quick range: the page's own parameters, with `since` set to that long
    before now (a moment with its zone, to the second)."""
    links = []
    for label, length in QUICK_RANGES:
        chosen = query.copy()
        for name in RESTARTED:
            chosen.pop(name, None)
        chosen["since"] = (now - length).replace(microsecond=0).isoformat()
        links.append({"label": f"Last {label}", "query": chosen.urlencode()})
    return links


def carried(query: Mapping[str, str]) -> str:
    """The range of a query string as a query string of its own ('' when it has none)."""
    return urlencode({name: query[name] for name in RANGE_PARAMS if query.get(name)})


def with_range(url: str, query: Mapping[str, str]) -> str:
    """`url` carrying the range of `query`."""
    kept = carried(query)
    return f"{url}?{kept}" if kept else url
