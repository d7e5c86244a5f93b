from rest_framework.pagination import CursorPagination


class CreatedCursorPagination(CursorPagination):
    """Keyset pagination: stable and fast however deep the page, unlike OFFSET."""

    ordering = ("-created_at", "-id")
    page_size_query_param = "page_size"
    max_page_size = 500
