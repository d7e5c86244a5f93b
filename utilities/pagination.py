"""Lists page with DRF's cursor pagination, in the API and on the pages alike.

Keyset pagination (stable and fast however deep the page, unlike OFFSET); DRF's cursor keeps rows
that tie on the ordering's first field apart with an offset, so none is skipped or shown twice. A
page size that cannot be honoured is refused (400), not silently replaced; a cursor that was never
issued is a 404. Here, in the bottom package, so that every app's lists can use it.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.http import Http404, HttpRequest
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request

from . import params


class StrictCursorPagination(CursorPagination):
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        return params.integer(
            request.query_params,
            self.page_size_query_param,
            default=self.page_size,
            minimum=1,
            maximum=self.max_page_size,
        )


def page(request: HttpRequest, queryset, pagination: type[CursorPagination]) -> tuple[list, str | None]:
    """One page of `queryset` for an HTML page: its rows and the query string of the next page (None:
    the last page), with the other parameters of the request kept."""
    paginator = pagination()
    try:
        rows: list | None = paginator.paginate_queryset(queryset, Request(request))
    except NotFound as exc:
        raise Http404(str(exc.detail)) from None
    link = paginator.get_next_link()
    return list(rows or []), ("?" + urlsplit(link).query) if link else None
