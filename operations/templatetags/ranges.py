"""The range picker (quick ranges, and the same range on the other pages) and links that keep the
range; see operations.ranges."""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils import timezone

from operations import ranges

register = template.Library()

# The pages whose windows follow the range: (label, URL name, shown to auditors only).
RANGED_PAGES = (
    ("tasks", "routing:task-list", False),
    ("provider calls", "routing:attempt-list", False),
    ("analytics", "routing:analytics", False),
    ("vendor exposure", "compliance:vendors", True),
)

RANGED_VIEWS = {name for _, name, _ in RANGED_PAGES}


@register.inclusion_tag("routing/_range.html", takes_context=True)
def range_picker(context) -> dict[str, Any]:
    query = context["request"].GET
    return {
        "quick": ranges.quick_links(query, timezone.now()),
        "carried": ranges.carried(query),
        "pages": [
            (label, ranges.with_range(reverse(name), query))
            for label, name, auditors in RANGED_PAGES
            if context.get("is_auditor") or not auditors
        ],
    }


@register.simple_tag(takes_context=True)
def ranged_url(context, name: str) -> str:
    """The URL of the page named `name`, keeping the range of this page's query string when this page
    is one whose window follows the range (it reads and checks it); other pages' queries are not read."""
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    if match is None or match.view_name not in RANGED_VIEWS:
        return reverse(name)
    return ranges.with_range(reverse(name), request.GET)
